"""tpu-inference's attention backend interface, implemented by :func:`attention.attend`.

tpu-inference (0.32) runs a layer's attention through an ``AttentionBackend``: its
``get_kv_cache_shape`` lays out the runner's KV caches and its ``attention`` is what the
models call. :class:`XlaKernelsAttentionBackend` is ours; off TPU the default backend
(``RPAAttentionBackend``, the one both model paths reach: JAX-native flax models and vLLM's
PyTorch models through torchax) hands both methods to it (:mod:`xla_kernels.vllm.patches`).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from tpu_inference.layers.common.attention_backend import AttentionBackend

from . import attention

NAME = "xla_kernels"


def _unsupported(what: str, fix: str) -> NotImplementedError:
    return NotImplementedError(f"xla_kernels.vllm attention backend: {what} is not supported "
                               f"by xla-kernels' attention ops. Fix: {fix}")


class XlaKernelsAttentionBackend(AttentionBackend):
    """Paged attention through xla-kernels' ``reshape_and_cache`` and
    ``ragged_paged_attention`` (CPU and CUDA kernels)."""

    name = NAME

    def get_kv_cache_shape(self, total_num_pages, page_size, num_kv_heads, head_dim,
                           kv_dtype):
        from tpu_inference.utils import get_padded_head_dim

        return attention.kv_cache_shape(total_num_pages, page_size, num_kv_heads,
                                        get_padded_head_dim(head_dim), kv_dtype)

    def attention(self, kv_cache, q, k, v, md, shared_md, mesh, *, head_dim_original,
                  sm_scale, attention_chunk_size, q_scale, k_scale, v_scale, sinks,
                  update_kv_cache, use_causal_mask, attn_logits_soft_cap, decode_query_size):
        if not use_causal_mask:
            raise _unsupported("bidirectional (non-causal) attention",
                               "run this model with tpu-inference's own backend on a TPU")
        if sinks is not None:
            raise _unsupported("attention sinks", "use a model without sinks")
        if q_scale is not None:
            raise _unsupported("fp8 queries (q_scale)",
                               "keep queries in the model's dtype (no q quantization)")
        k_scale, v_scale = kv_scales(kv_cache.dtype, k_scale, v_scale)
        sharded = sharded_axes(mesh)
        metadata = attention.Metadata(seq_lens=shared_md.seq_lens,
                                      block_tables=md.block_tables,
                                      query_start_loc=shared_md.query_start_loc,
                                      request_distribution=shared_md.request_distribution)
        # tpu-inference passes a sliding window as attention_chunk_size (the torch path sets
        # it from the layer's sliding_window, and RPA reads it as its sliding_window).
        attend = functools.partial(attention.attend, scale=sm_scale,
                                   sliding_window=attention_chunk_size or 0,
                                   soft_cap=attn_logits_soft_cap or 0.0,
                                   update_kv_cache=update_kv_cache,
                                   k_scale=k_scale, v_scale=v_scale)
        if not sharded:
            return attend(kv_cache, q, k, v, metadata)
        return _over_heads(mesh, attend, kv_cache, q, k, v, metadata)


def kv_scales(cache_dtype, k_scale: float | None, v_scale: float | None
              ) -> tuple[float, float]:
    """The per-tensor scales our ops take: an fp8 (e4m3) cache stores ``k / k_scale`` and
    ``v / v_scale`` (1.0 when vLLM has none); other caches take no scales."""
    scales = (1.0 if k_scale is None else float(k_scale),
              1.0 if v_scale is None else float(v_scale))
    if jnp.dtype(cache_dtype) == jnp.float8_e4m3fn:
        return scales
    if jnp.dtype(cache_dtype).itemsize == 1:
        raise _unsupported(f"a {jnp.dtype(cache_dtype).name} KV cache",
                           "pass kv_cache_dtype='fp8' or 'fp8_e4m3' (float8_e4m3fn), or 'auto'")
    if scales != (1.0, 1.0):
        raise _unsupported(f"k/v scales {scales} on a {jnp.dtype(cache_dtype).name} cache",
                           "scales apply to fp8 caches only")
    return scales


def sharded_axes(mesh) -> dict[str, int]:
    """The mesh axes of size > 1, which must all split attention heads (tensor parallel);
    raises for data, decode-context or prefill-context parallel meshes."""
    from tpu_inference.layers.common.sharding import ShardingAxisName

    axes = {name: size for name, size in mesh.shape.items() if size > 1}
    head_axes = ShardingAxisName.ATTN_HEAD
    head_axes = (head_axes,) if isinstance(head_axes, str) else tuple(head_axes)
    other = {name: size for name, size in axes.items()
             if name not in head_axes or name == "dcp"}
    if other:
        raise _unsupported(f"a mesh that splits {other} (data or context parallel attention)",
                           "use tensor parallelism only (tensor_parallel_size=N, "
                           "data_parallel_size=1, no decode/prefill context parallelism)")
    return axes


def _over_heads(mesh, attend, kv_cache, q, k, v, metadata):
    """``attend`` on each device's heads (tensor parallel), as tpu-inference's
    ``sharded_ragged_paged_attention`` splits RPA: q/k/v on their head axis, the fused cache
    on its merged-head axis (kv head ``h``'s key and value stay together on one device),
    the batch layout replicated."""
    import jax
    from jax.sharding import PartitionSpec as P
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.utils import get_mesh_shape_product

    tp = get_mesh_shape_product(mesh, ShardingAxisName.ATTN_HEAD)
    num_kv_heads = k.shape[1]
    if num_kv_heads < tp:
        if tp % num_kv_heads:
            raise _unsupported(f"{num_kv_heads} kv heads over {tp} devices",
                               "use a tensor parallel size that divides or is a multiple "
                               "of the kv head count")
        k = jnp.repeat(k, tp // num_kv_heads, axis=1)
        v = jnp.repeat(v, tp // num_kv_heads, axis=1)
    rows = P(ShardingAxisName.ATTN_DATA, ShardingAxisName.ATTN_HEAD, None)
    cache = P(ShardingAxisName.ATTN_DATA, None, ShardingAxisName.ATTN_HEAD, None, None)
    layout = P(ShardingAxisName.ATTN_DATA)

    def per_device(kv_cache, q, k, v, *layout_arrays):
        return attend(kv_cache, q, k, v, attention.Metadata(*layout_arrays))

    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=(cache, rows, rows, rows) + (layout,) * 4,
                         out_specs=(cache, rows), check_vma=False)(kv_cache, q, k, v, *metadata)
