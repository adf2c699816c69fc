"""tpu-inference's attention backend interface, implemented by :func:`attention.attend`.

tpu-inference (0.32) runs a layer's attention through an ``AttentionBackend``: its
``get_kv_cache_shape`` lays out the runner's KV caches and its ``attention`` is what the
models call. :class:`XlaKernelsAttentionBackend` is ours; :mod:`xla_kernels.vllm.platform`
makes it the one both model paths run (JAX-native flax models and vLLM's PyTorch models
through torchax). :class:`XlaKernelsVllmBackend` is the vLLM-side class that
``register_attention_backend`` needs for ``--attention-backend xla_kernels``.
"""

from __future__ import annotations

from tpu_inference.layers.common.attention_backend import AttentionBackend
from tpu_inference.layers.vllm.backends.flash_attn import (
    PallasAttentionBackend,
    PallasAttentionBackendImpl,
)

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
        if q_scale is not None or k_scale is not None or v_scale is not None:
            raise _unsupported("a quantized KV cache (kv_cache_dtype != 'auto')",
                               "pass vllm.LLM(..., kv_cache_dtype='auto')")
        axes = {name: size for name, size in mesh.shape.items() if size > 1}
        if axes:
            raise _unsupported(f"a sharded mesh {axes}",
                               "run on one device (tensor_parallel_size=1)")
        metadata = attention.Metadata(seq_lens=shared_md.seq_lens,
                                      block_tables=md.block_tables,
                                      query_start_loc=shared_md.query_start_loc,
                                      request_distribution=shared_md.request_distribution)
        # tpu-inference passes a sliding window as attention_chunk_size (the torch path sets
        # it from the layer's sliding_window, and RPA reads it as its sliding_window).
        return attention.attend(kv_cache, q, k, v, metadata, scale=sm_scale,
                                sliding_window=attention_chunk_size or 0,
                                soft_cap=attn_logits_soft_cap or 0.0,
                                update_kv_cache=update_kv_cache)


class XlaKernelsAttentionImpl(PallasAttentionBackendImpl):
    """tpu-inference's torch-path attention layer, running :class:`XlaKernelsAttentionBackend`."""

    attention_backend = NAME


class XlaKernelsVllmBackend(PallasAttentionBackend):
    """The vLLM attention backend class registered for ``--attention-backend xla_kernels``."""

    @staticmethod
    def get_name() -> str:
        return NAME.upper()

    @staticmethod
    def get_impl_cls() -> type[XlaKernelsAttentionImpl]:
        return XlaKernelsAttentionImpl


VLLM_BACKEND_PATH = f"{__name__}.{XlaKernelsVllmBackend.__qualname__}"
