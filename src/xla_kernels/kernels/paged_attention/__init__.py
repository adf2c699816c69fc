"""``paged_attention``: vLLM-style decode attention over a paged KV cache, one custom-call.

One query token per sequence attends to its cached keys/values, which live in fixed-size
blocks scattered over a shared cache and are found through a block table::

    paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                    *, scale, softcap=0.0, sliding_window=0, layout="vllm",
                    k_scale=1.0, v_scale=1.0) -> out

* ``query`` [num_seqs, num_q_heads, head_dim]; ``out`` has its shape and dtype.
* ``key_cache``/``value_cache``: ``layout="vllm"`` [num_blocks, block_size, num_kv_heads,
  head_dim] (vLLM's ``reshape_and_cache_flash`` layout) or ``layout="pallas"``
  [num_kv_heads, num_blocks, block_size, head_dim] (torch_xla / JAX Pallas layout).
* ``block_tables`` int32 [num_seqs, max_blocks_per_seq]: token ``t`` of sequence ``s`` is
  slot ``t % block_size`` of physical block ``block_tables[s, t // block_size]``.
* ``seq_lens`` int32 [num_seqs]: ragged context lengths.
* dtypes bf16, f16, f32 (query, caches and output share one); head_dim 64, 128, 256;
  block_size 16, 32, 64, 128, 256; any GQA/MQA ratio (num_q_heads % num_kv_heads == 0).
* fp8 KV cache (vLLM's ``kv_cache_dtype="fp8"``): both caches ``f8e4m3fn`` with bf16 or f16
  queries (and output); the keys and values are the stored values times the per-tensor
  ``k_scale`` / ``v_scale`` (finite, > 0; they must stay 1.0 for other caches). The kernels
  fold ``k_scale`` into the logit scale and ``v_scale`` into the output.
* ``scale`` multiplies q.k; ``softcap > 0`` gives ``softcap * tanh(logit / softcap)``
  (after the scale); ``sliding_window > 0`` attends only positions
  ``t >= seq_len - sliding_window``.

Robustness: a block id outside ``[0, num_blocks)`` is never dereferenced, its tokens are
skipped (masked out); ``seq_len <= 0`` gives an all-zero output row, as does a row whose
tokens are all masked; ``seq_len`` above the capacity ``max_blocks_per_seq * block_size`` is
clamped to it; cache slots that are not attended are never read (they may hold NaN). The
softmax statistics and accumulations are f32; valid input never yields NaN.

Kernels: CUDA (``paged_attention.cu``: tensor-core flash-decoding for bf16/f16, CUDA-core
f32, one CTA per (sequence, partition, kv head) serving all its query heads) and CPU
(``paged_attention_cpu.cc``). :func:`paged_attention_xla` is the plain-XLA fallback for
other platforms; :func:`paged_attention_numpy_f64` the float64 test oracle. The op has a
hidden f32 workspace output sized by :func:`workspace_size`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from xla_kernels.kernels.paged_attention import paged_attention
    >>> q = jnp.ones((2, 8, 128), jnp.bfloat16)                  # 2 seqs, 8 q heads
    >>> kc = jnp.ones((64, 16, 2, 128), jnp.bfloat16)             # 2 kv heads, vllm layout
    >>> bt = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)
    >>> lens = jnp.array([50, 7], jnp.int32)
    >>> f = jax.jit(lambda *a: paged_attention(*a, scale=128 ** -0.5))
    >>> f(q, kc, kc, bt, lens).shape                             # doctest: +SKIP
    (2, 8, 128)
"""

from __future__ import annotations

from xla_kernels.op import CallPlan, Invalid, Kernel, Op, Spec, Tensor

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
)
from .reference import paged_attention_numpy_f64, paged_attention_xla
from .workspace import max_partitions, workspace_size


def _output_rule(query: Spec, key_cache: Spec, value_cache: Spec, block_tables: Spec,
                 seq_lens: Spec, *, scale: float, softcap: float, sliding_window: int,
                 layout: str, k_scale: float, v_scale: float) -> list[Spec]:
    """Validate a call; returns [out, workspace]."""
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, _, _ = check_attention_caches(
        "query", query, key_cache, value_cache, layout=layout, head_dims=HEAD_DIMS,
        block_sizes=BLOCK_SIZES, fp8_query_dtypes=FP8_QUERY_DTYPES)
    check_kv_scales(k_scale, v_scale, cache_dtype=key_cache.dtype)
    if block_tables.ndim != 2 or block_tables.shape[0] != num_seqs:
        raise Invalid("block_tables", f"expected shape ({num_seqs}, max_blocks_per_seq), "
                      f"got {block_tables.shape}", "pass one row of block ids per sequence")
    if seq_lens.shape != (num_seqs,):
        raise Invalid("seq_lens", f"expected shape ({num_seqs},), got {seq_lens.shape}",
                      "pass one length per sequence")
    check_attention_attrs(scale, softcap, sliding_window)
    max_context = block_tables.shape[1] * block_size
    ws = workspace_size(num_seqs, num_q_heads, head_dim, max_context)
    return [Spec(query.shape, query.dtype), Spec((ws,), "f32", workspace=True)]


def _sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """Tensor parallel along kv heads (q heads follow, k kv heads x g per group) and data
    parallel along sequences; block ids, slots and head_dim must be whole on each device."""
    query, key_cache, layout = plan.inputs[0], plan.inputs[1], plan.attrs["layout"]
    heads = cache_dims(key_cache.shape, layout)[2]
    cache = cache_factors(layout)
    return (f"s (k g) d, {cache}, {cache}, s m, s -> s (k g) d",
            {"g": query.shape[1] // heads, "need_replication_factors": ("b", "t", "d", "m")})


paged_attention = Op(
    "xla_kernels.paged_attention",
    inputs=[
        Tensor("query", dtypes=DTYPES, rank=3, doc="[num_seqs, num_q_heads, head_dim]"),
        Tensor("key_cache", dtypes=CACHE_DTYPES, rank=4, doc="paged keys, in `layout`"),
        Tensor("value_cache", dtypes=CACHE_DTYPES, rank=4,
               doc="paged values, key_cache's shape and dtype"),
        Tensor("block_tables", dtypes=("i32",), rank=2, doc="[num_seqs, max_blocks_per_seq]"),
        Tensor("seq_lens", dtypes=("i32",), rank=1, doc="[num_seqs]"),
    ],
    attrs=attention_attrs("> 0: attend the last this many tokens"),
    outputs=_output_rule,
    output_names=("out",),
    sharding_rule=_sharding_rule,
    kernels={
        "cpu": Kernel(["paged_attention_cpu.cc"], handler="XkPagedAttentionCpu"),
        "cuda": Kernel(["paged_attention.cu"], handler="XkPagedAttentionCuda"),
    },
    doc=__doc__ or "",
)


__all__ = [
    "BLOCK_SIZES", "CACHE_DTYPES", "DTYPES", "FP8", "FP8_QUERY_DTYPES", "HEAD_DIMS", "LAYOUTS",
    "max_partitions", "paged_attention", "paged_attention_numpy_f64", "paged_attention_xla",
    "workspace_size",
]
