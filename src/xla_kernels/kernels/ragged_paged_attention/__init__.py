"""``ragged_paged_attention``: attention for a mixed batch of prefill chunks and decode tokens
over a paged KV cache, one custom-call.

Each sequence contributes a run of query rows (its newest tokens, whose keys and values are
already in the cache); the rows of all sequences are concatenated and padded::

    ragged_paged_attention(queries, key_cache, value_cache, kv_lens, block_tables, cu_q_lens,
                           num_seqs, *, scale, softcap=0.0, sliding_window=0,
                           layout="vllm", k_scale=1.0, v_scale=1.0) -> out

* ``queries`` [num_tokens, num_q_heads, head_dim] (num_tokens static, padded); ``out`` has
  its shape and dtype.
* ``key_cache``/``value_cache``: ``layout="vllm"`` [num_blocks, block_size, num_kv_heads,
  head_dim] or ``layout="pallas"`` [num_kv_heads, num_blocks, block_size, head_dim], as in
  :mod:`xla_kernels.kernels.paged_attention`.
* ``kv_lens`` int32 [max_seqs]; ``block_tables`` int32 [max_seqs, max_blocks_per_seq]
  (token ``t`` of sequence ``s`` is slot ``t % block_size`` of block
  ``block_tables[s, t // block_size]``); ``cu_q_lens`` int32 [max_seqs + 1];
  ``num_seqs`` int32 [1].
* Sequence ``s < num_seqs[0]`` owns query rows ``cu_q_lens[s] .. cu_q_lens[s+1] - 1``
  (``q_len`` of them): the last ``q_len`` tokens of its context. Row ``i`` sits at position
  ``p = kv_lens[s] - q_len + i`` and attends cache positions ``t <= p`` (causal) and, with
  ``sliding_window > 0``, only ``t > p - sliding_window``. ``scale`` multiplies q.k;
  ``softcap > 0`` gives ``softcap * tanh(logit / softcap)`` after the scale.
* dtypes bf16, f16, f32 (queries, caches and output share one); head_dim 64, 128, 256;
  block_size 16, 32, 64, 128, 256; any GQA/MQA ratio (num_q_heads % num_kv_heads == 0).
* fp8 KV cache (vLLM's ``kv_cache_dtype="fp8"``), as in ``paged_attention``: both caches
  ``f8e4m3fn`` with bf16 or f16 queries (and output); the keys and values are the stored
  values times the per-tensor ``k_scale`` / ``v_scale`` (finite, > 0; they must stay 1.0
  for other caches). The kernels fold ``k_scale`` into the logit scale and ``v_scale`` into
  the output normalization.

Inconsistent device data never causes an out-of-bounds read or write; it is defined as:

* ``n = clamp(num_seqs[0], 0, max_seqs)`` sequences are used.
* Row boundaries are ``c_j = clamp(max(cu_q_lens[0..j]), 0, num_tokens)`` (a running
  maximum): a decreasing entry gives an empty sequence, entries past ``num_tokens`` are cut
  there, so no row belongs to two sequences. Rows no sequence owns (before ``c_0``, after
  ``c_n``: the padding) are zeros.
* ``kv_lens[s]`` is clamped to ``[0, max_blocks_per_seq * block_size]``; when ``q_len``
  exceeds it, the first rows get positions ``p < 0``, attend nothing and are zeros.
* A block id outside ``[0, num_blocks)`` is never dereferenced: its tokens are masked. A row
  whose tokens are all masked is zeros. Cache slots no row attends are never read (they may
  hold NaN). Softmax statistics and accumulation are f32.

Kernels: CUDA (``ragged_paged_attention.cu``: one CTA per (tile of query rows x q heads of
one sequence, kv head), online softmax over 32-token K/V tiles, mma.sync for bf16/f16, CUDA
cores for f32, e4m3 tiles converted to bf16/f16 in shared memory for fp8 caches; on an H100
(sm_90a build) bf16/f16 queries and caches use a wgmma kernel,
``ragged_paged_attention_sm90.cuh``, unless ``XLA_KERNELS_RAGGED_WGMMA=0``; design in
``ragged_paged_attention.cuh``) and CPU
(``ragged_paged_attention_cpu.cc``). :func:`ragged_paged_attention_xla` is the plain-XLA
fallback; :func:`ragged_paged_attention_numpy_f64` the float64 test oracle. With every
``q_len == 1`` the op computes what :mod:`~xla_kernels.kernels.paged_attention` does, and on
CUDA, when ``num_tokens <= max_seqs`` (pad a decode batch's rows to at most its sequence
slots), it runs paged_attention's flash-decoding kernels (decided on the device: the host
cannot see the q_lens without a sync; a one-CTA kernel checks them, and the kernels of the
path not taken exit at once).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention
    >>> q = jnp.ones((8, 8, 128), jnp.bfloat16)                    # 8 token rows, 8 q heads
    >>> kc = jnp.ones((64, 16, 2, 128), jnp.bfloat16)              # 2 kv heads, vllm layout
    >>> i32 = lambda x: jnp.array(x, jnp.int32)
    >>> kv_lens, cu = i32([50, 7, 0]), i32([0, 6, 7, 7])           # a 6-row chunk, 1 decode
    >>> bt = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    >>> f = jax.jit(lambda *a: ragged_paged_attention(*a, scale=128 ** -0.5))
    >>> f(q, kc, kc, kv_lens, bt, cu, i32([2])).shape             # doctest: +SKIP
    (8, 8, 128)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from xla_kernels.kernel_kit import read_constants
from xla_kernels.op import CallPlan, Invalid, Kernel, Op, Spec, Tensor

from ..paged_attention.workspace import workspace_size
from ..paged_cache import (
    BLOCK_SIZES,
    CACHE_DTYPES,
    DTYPES,
    FP8,
    FP8_QUERY_DTYPES,
    HEAD_DIMS,
    LAYOUTS,
    attention_attrs,
    cache_dims,
    cache_factors,
    check_attention_attrs,
    check_attention_caches,
    check_kv_scales,
    fused_cache_dims,
    fused_cache_factors,
    split_fused,
)
from .reference import (
    ragged_paged_attention_numpy_f64,
    ragged_paged_attention_xla,
    sequence_bounds,
)

LIMITS_HEADER = Path(__file__).with_name("ragged_paged_attention_limits.h")
LIMITS = read_constants(LIMITS_HEADER)

MAX_PACKED_ROWS: int = LIMITS["kMaxPackedRows"]  # type: ignore[assignment]
MAX_CAPACITY: int = LIMITS["kMaxCapacity"]  # type: ignore[assignment]


def decode_workspace_size(num_tokens: int, max_seqs: int, num_q_heads: int, head_dim: int,
                          max_blocks_per_seq: int, block_size: int) -> int:
    """f32 elements of the CUDA kernel's workspace. Calls with ``num_tokens <= max_seqs``
    have a decode path (taken on the device when every q_len <= 1): it keeps
    paged_attention's flash-decoding partials for ``num_tokens`` rows and, as int32, a
    block-table row, a length and a sequence per row, and one flag. Other calls need 1
    (unused). The C++ twin is ``decode_workspace_elems`` in ``ragged_params.h``;
    the handler rejects a smaller workspace.

    Example:
        >>> decode_workspace_size(4, 4, 8, 128, max_blocks_per_seq=8, block_size=16)
        8361
        >>> decode_workspace_size(4096, 8, 32, 128, max_blocks_per_seq=512, block_size=16)
        1
    """
    if num_tokens > max_seqs:
        return 1
    partials = workspace_size(num_tokens, num_q_heads, head_dim, max_blocks_per_seq * block_size)
    return partials + num_tokens * (max_blocks_per_seq + 2) + 1


def _output_rule(queries: Spec, key_cache: Spec, value_cache: Spec, kv_lens: Spec,
                 block_tables: Spec, cu_q_lens: Spec, num_seqs: Spec, *, scale: float,
                 softcap: float, sliding_window: int, layout: str, k_scale: float,
                 v_scale: float) -> list[Spec]:
    """Validate a call; returns [out, workspace]."""
    num_tokens, num_q_heads, _ = queries.shape
    _, block_size, _, _ = check_attention_caches(
        "queries", queries, key_cache, value_cache, layout=layout, head_dims=HEAD_DIMS,
        block_sizes=BLOCK_SIZES, fp8_query_dtypes=FP8_QUERY_DTYPES)
    check_kv_scales(k_scale, v_scale, cache_dtype=key_cache.dtype)
    max_seqs = kv_lens.shape[0]
    if max_seqs < 1:
        raise Invalid("kv_lens", "expected shape (max_seqs,) with max_seqs >= 1, got "
                      f"{kv_lens.shape}", "pass one context length per sequence slot")
    if block_tables.ndim != 2 or block_tables.shape[0] != max_seqs:
        raise Invalid("block_tables", f"expected shape ({max_seqs}, max_blocks_per_seq), "
                      f"got {block_tables.shape}",
                      "pass one row of block ids per sequence slot (kv_lens' length)")
    if cu_q_lens.shape != (max_seqs + 1,):
        raise Invalid("cu_q_lens", f"expected shape ({max_seqs + 1},), got {cu_q_lens.shape}",
                      "pass max_seqs + 1 cumulative query lengths, starting at 0")
    if num_seqs.shape != (1,):
        raise Invalid("num_seqs", f"expected shape (1,), got {num_seqs.shape}",
                      "pass the number of sequences as an int32 array of one element")
    check_attention_attrs(scale, softcap, sliding_window)
    if num_tokens * num_q_heads > MAX_PACKED_ROWS:
        raise Invalid("queries", f"num_tokens * num_q_heads = {num_tokens * num_q_heads} is "
                      f"above {MAX_PACKED_ROWS}", "split the batch into several calls")
    if block_tables.shape[1] * block_size > MAX_CAPACITY:
        raise Invalid("block_tables", f"max_blocks_per_seq * block_size is above "
                      f"{MAX_CAPACITY} tokens", "pass a smaller block table")
    workspace = decode_workspace_size(num_tokens, max_seqs, num_q_heads, queries.shape[2],
                                      block_tables.shape[1], block_size)
    return [Spec(queries.shape, queries.dtype), Spec((workspace,), "f32", workspace=True)]


def _sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """Tensor parallel along kv heads (q heads follow, k kv heads x g per group); rows,
    sequences, blocks and head_dim must be whole on each device."""
    queries, key_cache, layout = plan.inputs[0], plan.inputs[1], plan.attrs["layout"]
    heads = cache_dims(key_cache.shape, layout)[2]
    cache = cache_factors(layout)
    return (f"n (k g) d, {cache}, {cache}, s, s m, c, o -> n (k g) d",
            {"g": queries.shape[1] // heads,
             "need_replication_factors": ("n", "d", "b", "t", "s", "m", "c", "o")})


# What both ops (separate caches, fused cache) take besides the queries and the caches.
_METADATA = (
    Tensor("kv_lens", dtypes=("i32",), rank=1, doc="[max_seqs] context lengths"),
    Tensor("block_tables", dtypes=("i32",), rank=2, doc="[max_seqs, max_blocks_per_seq]"),
    Tensor("cu_q_lens", dtypes=("i32",), rank=1, doc="[max_seqs + 1] row offsets"),
    Tensor("num_seqs", dtypes=("i32",), rank=1, doc="[1] sequences in use"),
)
_WINDOW_DOC = "> 0: a row at position p attends only t > p - sliding_window"

ragged_paged_attention = Op(
    "xla_kernels.ragged_paged_attention",
    inputs=[
        Tensor("queries", dtypes=DTYPES, rank=3, doc="[num_tokens, num_q_heads, head_dim]"),
        Tensor("key_cache", dtypes=CACHE_DTYPES, rank=4, doc="paged keys, in `layout`"),
        Tensor("value_cache", dtypes=CACHE_DTYPES, rank=4,
               doc="paged values, key_cache's shape and dtype"),
        *_METADATA,
    ],
    attrs=attention_attrs(_WINDOW_DOC),
    outputs=_output_rule,
    output_names=("out",),
    sharding_rule=_sharding_rule,
    kernels={
        "cpu": Kernel(["ragged_paged_attention_cpu.cc"], handler="XkRaggedPagedAttentionCpu"),
        # sm_90 is built as sm_90a: the Hopper prefill kernel uses wgmma.
        "cuda": Kernel(["ragged_paged_attention.cu"], handler="XkRaggedPagedAttentionCuda",
                       arch_specific=True),
    },
    doc=__doc__ or "",
)


def _fused_output_rule(queries: Spec, kv_cache: Spec, kv_lens: Spec, block_tables: Spec,
                       cu_q_lens: Spec, num_seqs: Spec, *, scale: float, softcap: float,
                       sliding_window: int, k_scale: float, v_scale: float) -> list[Spec]:
    """Validate a call on the fused cache as the two caches it holds; returns [out,
    workspace]."""
    num_blocks, block_size, heads, dim = fused_cache_dims(kv_cache.shape)
    caches = Spec((num_blocks, block_size, heads, dim), kv_cache.dtype)
    try:
        return _output_rule(queries, caches, caches, kv_lens, block_tables, cu_q_lens, num_seqs,
                            scale=scale, softcap=softcap, sliding_window=sliding_window,
                            layout="vllm", k_scale=k_scale, v_scale=v_scale)
    except Invalid as e:
        if e.arg not in ("key_cache", "value_cache"):
            raise
        raise Invalid("kv_cache", f"{e.problem} (read as [num_blocks, block_size, "
                      "2 * num_kv_heads, head_dim])", e.fix) from None


def _fused_sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """As :func:`_sharding_rule`; the cache's third axis is (k p): a device holds whole
    (key, value) pairs (p stays whole)."""
    queries, kv_cache = plan.inputs[0], plan.inputs[1]
    heads = fused_cache_dims(kv_cache.shape)[2]
    cache, sizes = fused_cache_factors(kv_cache.shape)
    named = set(re.findall(r"\w+", cache))
    whole = [f for f in ("n", "d", "b", "t", "p", "w", "x", "s", "m", "c", "o")
             if f in named or f in "nsmco"]
    return (f"n (k g) d, {cache}, s, s m, c, o -> n (k g) d",
            {"k": heads, "g": queries.shape[1] // heads, **sizes,
             "need_replication_factors": tuple(whole)})


ragged_paged_attention_fused = Op(
    "xla_kernels.ragged_paged_attention_fused",
    inputs=[
        Tensor("queries", dtypes=DTYPES, rank=3, doc="[num_tokens, num_q_heads, head_dim]"),
        Tensor("kv_cache", dtypes=CACHE_DTYPES, rank=(4, 5),
               doc="[num_blocks, block_size, 2 * num_kv_heads, head_dim]: head h's key at "
                   "2h, its value at 2h + 1"),
        *_METADATA,
    ],
    attrs=attention_attrs(_WINDOW_DOC, layout=False),
    outputs=_fused_output_rule,
    output_names=("out",),
    sharding_rule=_fused_sharding_rule,
    kernels={
        "cpu": Kernel(["ragged_paged_attention_cpu.cc"],
                      handler="XkRaggedPagedAttentionFusedCpu"),
        "cuda": Kernel(["ragged_paged_attention.cu"], handler="XkRaggedPagedAttentionFusedCuda",
                       arch_specific=True),
    },
    doc="""``ragged_paged_attention_fused(queries, kv_cache, kv_lens, block_tables, cu_q_lens,
num_seqs, *, scale, softcap=0.0, sliding_window=0, k_scale=1.0, v_scale=1.0) -> out``:
:func:`ragged_paged_attention` over one fused cache [num_blocks, block_size,
2 * num_kv_heads, head_dim] (head ``h``'s key at index ``2h`` of the third axis, its value
at ``2h + 1``: tpu-inference's layout; its packed 5-D cache [num_blocks, block_size, merged,
packing, head_dim] is the same memory and is taken as it is). The
kernels read the keys and values where they lie: no copy. Same semantics, limits and
kernels as :func:`ragged_paged_attention`; write new tokens with
:func:`xla_kernels.kernels.kv_cache.reshape_and_cache_fused`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> q = jnp.ones((8, 8, 128), jnp.bfloat16)                    # 8 token rows, 8 q heads
    >>> kv = jnp.ones((64, 16, 4, 128), jnp.bfloat16)              # 2 kv heads, fused
    >>> i32 = lambda x: jnp.array(x, jnp.int32)
    >>> kv_lens, cu = i32([50, 7, 0]), i32([0, 6, 7, 7])
    >>> bt = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    >>> f = jax.jit(lambda *a: ragged_paged_attention_fused(*a, scale=128 ** -0.5))
    >>> f(q, kv, kv_lens, bt, cu, i32([2])).shape                  # doctest: +SKIP
    (8, 8, 128)
""",
)


def ragged_paged_attention_fused_numpy_f64(queries: Any, kv_cache: Any, *args: Any,
                                           **kwargs: Any) -> Any:
    """The float64 oracle of :data:`ragged_paged_attention_fused`: the vLLM-layout oracle on
    the two caches the fused one holds."""
    return ragged_paged_attention_numpy_f64(queries, *split_fused(np.asarray(kv_cache)), *args,
                                            **kwargs)


__all__ = [
    "BLOCK_SIZES", "CACHE_DTYPES", "DTYPES", "FP8", "FP8_QUERY_DTYPES", "HEAD_DIMS", "LAYOUTS",
    "LIMITS", "decode_workspace_size",
    "ragged_paged_attention", "ragged_paged_attention_fused",
    "ragged_paged_attention_fused_numpy_f64", "ragged_paged_attention_numpy_f64",
    "ragged_paged_attention_xla",
    "sequence_bounds",
]
