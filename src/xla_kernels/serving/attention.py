"""The attention implementations the engine switches between (:class:`Attention`), as JAX
functions.

* ``Attention.KERNELS`` (``--attention xla-kernels``): the library's custom calls,
  ``reshape_and_cache`` (writes the new tokens' K/V in place) then
  ``ragged_paged_attention``.
* ``Attention.PLAIN_XLA`` (``plain-xla``): their plain-XLA fallbacks,
  ``reshape_and_cache_xla`` (a scatter, in place under donation) and
  ``ragged_paged_attention_xla`` (gather + masked einsum).
* :func:`dense_attention`: causal attention over contiguous, unpaged K/V: the reference.

Both paged implementations take the caches in vLLM layout [num_blocks, block_size,
num_kv_heads, head_dim] and the step's :class:`~xla_kernels.serving.batch.StepBatch`.

**fp8 caches** (``--kv-cache-dtype fp8``, vLLM's ``kv_cache_dtype="fp8"``): both caches
``float8_e4m3fn``, with per-tensor scales :data:`KV_SCALE` = 1.0 for K and V, which is what
vLLM (and our vLLM backend, ``xla_kernels.vllm.backend.kv_scales``) uses when a checkpoint
carries no calibrated scales; serve-bench's random weights carry none, and their K/V (about
N(0, 1)) sit far inside e4m3's +-448, so a scale would only move the rounding grid. Both
cache writes quantize each new row (``x / 1.0`` in f32, round to nearest even, saturated);
the plain-XLA attention dequantizes the gathered rows to f32, the op reads them as stored:
both attend the same fp8 cache. The op takes 16-bit queries with an fp8 cache, so an f32
model's queries are cast to bfloat16 for it and the output back
(:func:`~xla_kernels.kernels.paged_cache.fp8_query_dtype`, the vLLM backend's rule too), in
both implementations. :func:`as_cached` and :func:`attention_queries` give the dense
reference the same rounding.

Example:
    >>> import jax.numpy as jnp
    >>> q = jnp.ones((1, 3, 4, 64))                       # [batch, tokens, q heads, dim]
    >>> k = v = jnp.ones((1, 3, 2, 64))                   # 2 kv heads
    >>> dense_attention(q, k, v, jnp.arange(3)[None], jnp.arange(3)[None]).shape
    (1, 3, 4, 64)
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from xla_kernels.serving.batch import StepBatch
from xla_kernels.serving.config import FP8_CACHE_DTYPE

KV_SCALE = 1.0
"""The per-tensor k_scale and v_scale of an fp8 cache (see the module doc)."""


def is_fp8(cache_dtype: Any) -> bool:
    """Whether a cache of ``cache_dtype`` is fp8 (e4m3)."""
    return np.dtype(cache_dtype) == np.dtype(FP8_CACHE_DTYPE)


def attention_queries(queries: Any, cache_dtype: Any) -> Any:
    """``queries`` in the dtype paged attention takes them in over caches of
    ``cache_dtype``: their own, or 16-bit over an fp8 cache (an f32 model's become
    bfloat16; the output is cast back by the caller)."""
    from xla_kernels.kernels.paged_cache import fp8_query_dtype

    return queries.astype(fp8_query_dtype(queries.dtype)) if is_fp8(cache_dtype) else queries


def as_cached(rows: Any, cache_dtype: Any) -> Any:
    """K or V ``rows`` as attention reads them back from a cache of ``cache_dtype``, in the
    rows' dtype: unchanged, or rounded through e4m3 exactly as the cache write quantizes
    them (scale :data:`KV_SCALE`). For the dense reference."""
    if not is_fp8(cache_dtype):
        return rows
    from xla_kernels.kernels.kv_cache import quantize_fp8_xla

    return (quantize_fp8_xla(rows, KV_SCALE).astype("float32") * KV_SCALE).astype(rows.dtype)


class Attention(enum.Enum):
    """Which implementation writes the new K/V to the paged caches and attends over them
    (``--attention``; the values are the option's words)."""

    KERNELS = "xla-kernels"
    """The library's custom calls: ``reshape_and_cache``, ``ragged_paged_attention``."""
    PLAIN_XLA = "plain-xla"
    """Their plain-XLA fallbacks: ``reshape_and_cache_xla``, ``ragged_paged_attention_xla``."""

    @property
    def kernel(self) -> bool:
        """Whether the library's custom calls run (from torch: its torch operators)."""
        return self is Attention.KERNELS

    def write_kv(self, key: Any, value: Any, key_cache: Any, value_cache: Any,
                 slot_mapping: Any) -> tuple[Any, Any]:
        """Write the rows of ``key``/``value`` [tokens, kv_heads, dim] to their slots;
        returns the updated caches (aliased to the operands: in place under donation)."""
        from xla_kernels.kernels.kv_cache import reshape_and_cache, reshape_and_cache_xla

        fn = reshape_and_cache if self.kernel else reshape_and_cache_xla
        return fn(key, value, key_cache, value_cache, slot_mapping, k_scale=KV_SCALE,
                  v_scale=KV_SCALE)

    def attend(self, queries: Any, key_cache: Any, value_cache: Any, batch: StepBatch, *,
               scale: float) -> Any:
        """Ragged paged attention of ``queries`` [tokens, q_heads, dim] over the caches,
        which already hold the batch's new tokens; the output in the queries' dtype (an fp8
        cache: see :func:`attention_queries`)."""
        from xla_kernels.kernels.ragged_paged_attention import (
            ragged_paged_attention,
            ragged_paged_attention_xla,
        )

        fn = ragged_paged_attention if self.kernel else ragged_paged_attention_xla
        out = fn(attention_queries(queries, key_cache.dtype), key_cache, value_cache,
                 batch.kv_lens, batch.block_tables, batch.cu_q_lens, batch.num_seqs,
                 scale=scale, k_scale=KV_SCALE, v_scale=KV_SCALE)
        return out.astype(queries.dtype)


def dense_attention(queries: Any, keys: Any, values: Any, q_positions: Any,
                    k_positions: Any, *, k_valid: Any = None) -> Any:
    """Causal GQA attention over contiguous K/V, softmax in f32.

    ``queries`` [B, T, q_heads, dim] at ``q_positions`` [B, T]; ``keys``/``values`` [B, S,
    kv_heads, dim] at ``k_positions`` [B, S]; a query attends the keys at positions <= its
    own (and with ``k_valid`` [B, S] only those marked valid). Scale ``dim ** -0.5``.
    """
    import jax.numpy as jnp

    b, t, hq, d = queries.shape
    hkv = keys.shape[2]
    q = queries.reshape(b, t, hkv, hq // hkv, d)
    logits = jnp.einsum("btkgd,bskd->bkgts", q, keys,
                        preferred_element_type=jnp.float32) * d ** -0.5
    mask = k_positions[:, None, :] <= q_positions[:, :, None]            # [B, T, S]
    if k_valid is not None:
        mask &= k_valid[:, None, :]
    logits = jnp.where(mask[:, None, None], logits, -jnp.inf)
    mx = jnp.max(logits, axis=-1, keepdims=True)
    w = jnp.exp(logits - jnp.where(jnp.isfinite(mx), mx, 0.0))
    w = w / jnp.maximum(jnp.sum(w, axis=-1, keepdims=True), 1e-30)
    out = jnp.einsum("bkgts,bskd->btkgd", w, values.astype(jnp.float32))
    return out.reshape(b, t, hq, d).astype(queries.dtype)


__all__ = ["KV_SCALE", "Attention", "as_cached", "attention_queries", "dense_attention",
           "is_fp8"]
