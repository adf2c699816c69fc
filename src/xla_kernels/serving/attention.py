"""The attention implementations the engine switches between, as JAX functions.

* ``"xla-kernels"``: the library's custom calls, ``reshape_and_cache`` (writes the new
  tokens' K/V in place) then ``ragged_paged_attention``.
* ``"plain-xla"``: their plain-XLA fallbacks, ``reshape_and_cache_xla`` (a scatter, in place
  under donation) and ``ragged_paged_attention_xla`` (gather + masked einsum).
* :func:`dense_attention`: causal attention over contiguous, unpaged K/V: the reference.

Both paged implementations take the caches in vLLM layout [num_blocks, block_size,
num_kv_heads, head_dim] and the step's :class:`~xla_kernels.serving.batch.StepBatch`.

Example:
    >>> import jax.numpy as jnp
    >>> q = jnp.ones((1, 3, 4, 64))                       # [batch, tokens, q heads, dim]
    >>> k = v = jnp.ones((1, 3, 2, 64))                   # 2 kv heads
    >>> dense_attention(q, k, v, jnp.arange(3)[None], jnp.arange(3)[None]).shape
    (1, 3, 4, 64)
"""

from __future__ import annotations

from typing import Any

from xla_kernels.serving.batch import StepBatch
from xla_kernels.serving.config import ATTENTIONS, check_choice


def write_kv(attention: str, key: Any, value: Any, key_cache: Any, value_cache: Any,
             slot_mapping: Any) -> tuple[Any, Any]:
    """Write the rows of ``key``/``value`` [tokens, kv_heads, dim] to their slots; returns the
    updated caches (aliased to the operands: in place under donation)."""
    if check_choice("--attention", attention, ATTENTIONS) == "xla-kernels":
        from xla_kernels.kernels.kv_cache import reshape_and_cache

        return reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    from xla_kernels.kernels.kv_cache import reshape_and_cache_xla

    return reshape_and_cache_xla(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(attention: str, queries: Any, key_cache: Any, value_cache: Any,
                    batch: StepBatch, *, scale: float) -> Any:
    """Ragged paged attention of ``queries`` [tokens, q_heads, dim] over the caches, which
    already hold the batch's new tokens."""
    from xla_kernels.kernels.ragged_paged_attention import (
        ragged_paged_attention,
        ragged_paged_attention_xla,
    )

    fn = (ragged_paged_attention
          if check_choice("--attention", attention, ATTENTIONS) == "xla-kernels"
          else ragged_paged_attention_xla)
    return fn(queries, key_cache, value_cache, batch.kv_lens, batch.block_tables,
              batch.cu_q_lens, batch.num_seqs, scale=scale)


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


__all__ = ["dense_attention", "paged_attention", "write_kv"]
