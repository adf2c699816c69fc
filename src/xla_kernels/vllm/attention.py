"""One layer's paged attention for tpu-inference, through xla-kernels' fused-cache ops.

tpu-inference keeps one fused K/V cache array per layer,
``[total_pages, page_size, num_kv_heads * 2 // packing, packing, head_dim]``: merged head
``2h`` is the key of kv head ``h`` and ``2h + 1`` its value (``packing`` = 32 // dtype bits;
the merged heads are padded up to a multiple of it). Its attention writes the step's new
keys and values into that cache and attends, returning ``(kv_cache, out)``. :func:`attend`
does the same with :func:`reshape_and_cache_fused` and :func:`ragged_paged_attention_fused`,
which take the packed 5-D cache as it is and read and write it where it lies: under the
runner's donation the cache is updated in place, with no copy.
A page size the kernels do not take natively is viewed as blocks of one they take (a slot
keeps its flat index ``page * P + offset`` in both views; only the block table changes).
Caches whose merged heads are padded (an odd kv head count with a 4-per-word dtype) are
split and joined around the separate-cache ops instead: two copies per layer.

``TRACES`` counts how often :func:`attend` and each op were traced, so a check can prove that
the compiled model runs them (a trace per compiled batch shape, not per step; layers may
share one).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import jax
import jax.numpy as jnp

from xla_kernels.kernels.kv_cache import reshape_and_cache, reshape_and_cache_fused
from xla_kernels.kernels.paged_cache import fp8_query_dtype
from xla_kernels.kernels.ragged_paged_attention import (
    BLOCK_SIZES,
    ragged_paged_attention,
    ragged_paged_attention_fused,
)

TRACES: Counter[str] = Counter()


class Metadata(NamedTuple):
    """The batch layout, in tpu-inference's names (its ``AttentionMetadata`` fields)."""

    seq_lens: jax.Array
    """int32 [max_seqs]: each sequence's context length, this step's tokens included."""
    block_tables: jax.Array
    """int32 [max_seqs * pages_per_seq], flat: the pages of sequence ``s`` start at
    ``s * pages_per_seq``."""
    query_start_loc: jax.Array
    """int32 [max_seqs + 1]: sequence ``s`` owns query rows ``[q[s], q[s + 1])``."""
    request_distribution: jax.Array
    """int32 [3]: (decode end, prefill end, number of sequences)."""


def kv_cache_shape(total_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                   dtype) -> tuple[int, int, int, int, int]:
    """The fused cache's shape, as tpu-inference's RPA lays it out, without RPA's padding
    of head_dim to a multiple of 128 (the models pad q/k/v themselves: 64 stays 64).

    Example:
        >>> kv_cache_shape(10, 128, 2, 64, jnp.bfloat16)
        (10, 128, 2, 2, 64)
    """
    packing = max(1, 4 // jnp.dtype(dtype).itemsize)   # 32-bit words, as RPA packs
    heads = -(-2 * num_kv_heads // packing) * packing
    return (total_pages, page_size, heads // packing, packing, head_dim)


def sub_block_size(page_size: int) -> int:
    """The largest block size our ops take that divides ``page_size`` (``page_size`` itself
    where they take it).

    Example:
        >>> sub_block_size(256), sub_block_size(48), sub_block_size(16), sub_block_size(384)
        (256, 16, 16, 128)
    """
    for size in sorted(BLOCK_SIZES, reverse=True):
        if page_size % size == 0:
            return size
    raise ValueError(f"xla_kernels.vllm: page size {page_size} is not a multiple of any "
                     f"block size {tuple(BLOCK_SIZES)} the attention ops take. Fix: pass "
                     f"vllm.LLM(..., block_size=64) (or 16, 32, or a multiple of 16)")


def slot_mapping(md: Metadata, num_tokens: int, page_size: int) -> jax.Array:
    """int32 [num_tokens]: the flat cache slot of each query row's token, -1 for padding rows.

    Row ``t`` of sequence ``s`` (``q[s] <= t < q[s + 1]``, ``s < num_seqs``) is the token at
    position ``seq_lens[s] - q_len + (t - q[s])``; its slot is ``page * page_size + offset``.
    """
    cu = md.query_start_loc
    max_seqs = md.seq_lens.shape[0]
    num_seqs = jnp.clip(md.request_distribution[2], 0, max_seqs)
    pages = md.block_tables.reshape(max_seqs, -1)
    rows = jnp.arange(num_tokens, dtype=jnp.int32)
    live = jnp.arange(max_seqs) < num_seqs
    # Sequence of each row: how many live sequences end at or before it.
    seq = jnp.sum((cu[1:][None, :] <= rows[:, None]) & live[None, :], axis=1)
    owned = rows < cu[num_seqs]
    seq = jnp.minimum(seq, max_seqs - 1)
    q_len = cu[seq + 1] - cu[seq]
    pos = md.seq_lens[seq] - q_len + (rows - cu[seq])
    page_col = jnp.clip(pos // page_size, 0, pages.shape[1] - 1)
    slot = pages[seq, page_col] * page_size + pos % page_size
    return jnp.where(owned & (pos >= 0), slot, -1).astype(jnp.int32)


def attend(kv_cache: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, md: Metadata, *,
           scale: float, sliding_window: int = 0, soft_cap: float = 0.0,
           update_kv_cache: bool = True, k_scale: float = 1.0,
           v_scale: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Write this step's ``k``/``v`` [num_tokens, num_kv_heads, head_dim] into the fused
    ``kv_cache`` and attend ``q`` [num_tokens, num_q_heads, head_dim] over it (causal,
    ``scale`` times q.k, ``soft_cap > 0``: ``soft_cap * tanh(logit / soft_cap)``,
    ``sliding_window > 0``: the last that many positions). Returns ``(kv_cache, out)``,
    ``out`` shaped and typed like ``q``. With ``update_kv_cache=False`` (a layer that reads
    another layer's cache) nothing is written and the cache comes back as it was. An fp8
    cache stores ``k / k_scale`` and ``v / v_scale`` (per-tensor scales, as RPA's); rows that
    arrive in the cache's dtype are taken as already divided (tpu-inference's models
    quantize them before attention) and written as they are, not quantized twice."""
    TRACES["attend"] += 1
    pages, page_size, merged, packing, head_dim = kv_cache.shape
    num_kv_heads = k.shape[1]
    if merged * packing != 2 * num_kv_heads:
        return _attend_split(kv_cache, q, k, v, md, scale=scale, sliding_window=sliding_window,
                             soft_cap=soft_cap, update_kv_cache=update_kv_cache,
                             k_scale=k_scale, v_scale=v_scale)
    block = sub_block_size(page_size)
    ratio = page_size // block
    # The ops take the packed 5-D cache as it is: a reshape of the donated cache would cost
    # XLA:CPU a copy of it before and after the in-place write.
    fused = kv_cache if ratio == 1 else kv_cache.reshape(pages * ratio, block,
                                                          2 * num_kv_heads, head_dim)
    row_dtype = _row_dtype(q.dtype, fused.dtype)
    if update_kv_cache:
        TRACES["reshape_and_cache"] += 1
        slots = slot_mapping(md, k.shape[0], page_size)
        write_k_scale, write_v_scale = _write_scales(k.dtype, fused.dtype, k_scale, v_scale)
        fused = reshape_and_cache_fused(k.astype(row_dtype), v.astype(row_dtype), fused, slots,
                                        k_scale=write_k_scale, v_scale=write_v_scale)
    TRACES["ragged_paged_attention"] += 1
    out = ragged_paged_attention_fused(
        q.astype(row_dtype), fused, md.seq_lens.astype(jnp.int32),
        _block_tables(md, ratio), md.query_start_loc.astype(jnp.int32),
        md.request_distribution[2:3].astype(jnp.int32), scale=float(scale),
        softcap=float(soft_cap or 0.0), sliding_window=int(sliding_window or 0),
        k_scale=float(k_scale), v_scale=float(v_scale))
    return fused.reshape(kv_cache.shape), out.astype(q.dtype)


def _row_dtype(query_dtype, cache_dtype):
    """The dtype the ops take queries and new rows in: the cache's, or for an fp8 cache the
    queries' if 16-bit, else bf16 (our ops read fp8 caches with bf16/f16 queries)."""
    if cache_dtype != jnp.float8_e4m3fn:
        return cache_dtype
    return fp8_query_dtype(query_dtype)


def _write_scales(row_dtype, cache_dtype, k_scale: float, v_scale: float
                  ) -> tuple[float, float]:
    """The scales the cache write divides rows by: none for rows already in the cache's
    dtype (their cast to 16 bits for the op is exact), else the cache's."""
    if row_dtype == cache_dtype:
        return 1.0, 1.0
    return float(k_scale), float(v_scale)


def _block_tables(md: Metadata, ratio: int) -> jax.Array:
    """int32 [max_seqs, pages_per_seq * ratio]: the block table of the cache viewed as blocks
    of ``page_size / ratio`` slots."""
    max_seqs = md.seq_lens.shape[0]
    pages = md.block_tables.reshape(max_seqs, -1).astype(jnp.int32)
    if ratio == 1:
        return pages
    return (pages[:, :, None] * ratio + jnp.arange(ratio, dtype=jnp.int32)).reshape(max_seqs, -1)


def _attend_split(kv_cache: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, md: Metadata,
                  *, scale: float, sliding_window: int, soft_cap: float,
                  update_kv_cache: bool, k_scale: float,
                  v_scale: float) -> tuple[jax.Array, jax.Array]:
    """:func:`attend` for a cache whose merged heads are padded past ``2 * num_kv_heads``:
    split into key and value caches, the separate-cache ops, joined again."""
    pages, page_size, merged, packing, head_dim = kv_cache.shape
    num_tokens, num_kv_heads, _ = k.shape
    block = sub_block_size(page_size)
    ratio = page_size // block
    flat = kv_cache.reshape(pages, page_size, merged * packing, head_dim)
    split = (pages * ratio, block, num_kv_heads, head_dim)
    key_cache = flat[:, :, 0:2 * num_kv_heads:2].reshape(split)
    value_cache = flat[:, :, 1:2 * num_kv_heads:2].reshape(split)
    row_dtype = _row_dtype(q.dtype, key_cache.dtype)
    if update_kv_cache:
        TRACES["reshape_and_cache"] += 1
        slots = slot_mapping(md, num_tokens, page_size)
        write_k_scale, write_v_scale = _write_scales(k.dtype, key_cache.dtype, k_scale, v_scale)
        key_cache, value_cache = reshape_and_cache(k.astype(row_dtype), v.astype(row_dtype),
                                                   key_cache, value_cache, slots,
                                                   k_scale=write_k_scale,
                                                   v_scale=write_v_scale)
    TRACES["ragged_paged_attention"] += 1
    out = ragged_paged_attention(
        q.astype(row_dtype), key_cache, value_cache, md.seq_lens.astype(jnp.int32),
        _block_tables(md, ratio), md.query_start_loc.astype(jnp.int32),
        md.request_distribution[2:3].astype(jnp.int32), scale=float(scale),
        softcap=float(soft_cap or 0.0), sliding_window=int(sliding_window or 0),
        k_scale=float(k_scale), v_scale=float(v_scale))
    if not update_kv_cache:
        return kv_cache, out.astype(q.dtype)
    joined = jnp.stack([key_cache.reshape(pages, page_size, num_kv_heads, head_dim),
                        value_cache.reshape(pages, page_size, num_kv_heads, head_dim)],
                       axis=3).reshape(pages, page_size, 2 * num_kv_heads, head_dim)
    joined = jnp.concatenate([joined, flat[:, :, 2 * num_kv_heads:]], axis=2)
    return joined.reshape(kv_cache.shape), out.astype(q.dtype)
