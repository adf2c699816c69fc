"""The attention core the references of ``paged_attention`` and ``ragged_paged_attention``
share, written from the ops' definitions (never from their kernels).

* :func:`read_tokens_f64` and :func:`attend_f64`: float64 NumPy, for the test oracles: the
  keys and values of chosen cache positions (out-of-range block ids skipped, never read), and
  softmax attention of one query row's heads over them.
* :func:`masked_attention_xla`: jax.numpy, for the plain-XLA fallbacks: softmax attention over
  gathered keys and values under a mask, in f32, with a fully masked row giving zeros.

Example:
    >>> kc = np.arange(2 * 4 * 1 * 2, dtype=np.float32).reshape(2, 4, 1, 2)   # vllm layout
    >>> t, k, v = read_tokens_f64(kc, kc, np.array([1, 9]), np.arange(0, 6), layout="vllm")
    >>> t.tolist(), k[:, 0, 0].tolist()                  # block id 9 is out of range
    ([0, 1, 2, 3], [8.0, 10.0, 12.0, 14.0])
    >>> attend_f64(np.zeros((2, 2)), k, v, scale=1.0)[0].tolist()   # uniform weights
    [11.0, 12.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xla_kernels.kernels.paged_cache import cache_dims


def read_tokens_f64(key_cache: Any, value_cache: Any, table: Any, positions: np.ndarray, *,
                    layout: str, k_scale: float = 1.0, v_scale: float = 1.0,
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(t, k, v)``: the ``positions`` of one sequence (block table row ``table``) whose block
    id lies in ``[0, num_blocks)``, and their keys and values [len(t), num_kv_heads, head_dim]
    in float64, times ``k_scale`` and ``v_scale`` (the dequantized fp8 cache). Only those
    slots are read: the others may hold NaN."""
    num_blocks, block_size = cache_dims(tuple(np.shape(key_cache)), layout)[:2]
    t = np.asarray(positions, np.int64)
    blk = np.asarray(table, np.int64)[t // block_size] if t.size else np.zeros(0, np.int64)
    ok = (blk >= 0) & (blk < num_blocks)
    t, blk = t[ok], blk[ok]
    slot = t % block_size
    kc, vc = np.asarray(key_cache), np.asarray(value_cache)
    if layout == "vllm":                                   # [n, Hkv, D]
        k, v = kc[blk, slot], vc[blk, slot]
    else:
        k, v = kc[:, blk, slot].transpose(1, 0, 2), vc[:, blk, slot].transpose(1, 0, 2)
    return t, k.astype(np.float64) * float(k_scale), v.astype(np.float64) * float(v_scale)


def attend_f64(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float,
               softcap: float = 0.0) -> np.ndarray:
    """Softmax attention of one row's query heads ``q`` [num_q_heads, head_dim] over ``k``,
    ``v`` [n >= 1, num_kv_heads, head_dim], in float64: q head ``h`` reads kv head
    ``h // (num_q_heads // num_kv_heads)``; a logit is ``scale * q.k``, then
    ``softcap * tanh(logit / softcap)`` when ``softcap > 0``. Returns [num_q_heads, head_dim]."""
    num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    qs = np.asarray(q, np.float64).reshape(num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    logits = np.einsum("kgd,tkd->kgt", qs, k) * scale
    if softcap > 0:
        logits = softcap * np.tanh(logits / softcap)
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("kgt,tkd->kgd", w, v).reshape(num_q_heads, head_dim)


def masked_attention_xla(q: Any, k: Any, v: Any, mask: Any, value_mask: Any, *,
                         specs: tuple[str, str],
                         scale: float, softcap: float, fp8: bool, k_scale: float,
                         v_scale: float) -> Any:
    """Softmax attention in jax.numpy over gathered keys and values: ``specs`` are the einsum
    specs of the logits (q, k -> logits) and of the output (weights, v -> out), ``mask``
    broadcasts to the logits (True: attended), ``value_mask`` to ``v``. fp8 caches are
    dequantized to f32; logits, softmax and the weighted sum are f32; a row with nothing
    attended is zeros. Returns the f32 output of the second spec."""
    import jax.numpy as jnp

    spec_k, spec_v = specs
    if fp8:  # attend over the dequantized cache, in f32
        k = k.astype(jnp.float32) * jnp.float32(k_scale)
        v = v.astype(jnp.float32) * jnp.float32(v_scale)
    logits = jnp.einsum(spec_k, q, k, preferred_element_type=jnp.float32) * scale
    if softcap > 0:
        logits = softcap * jnp.tanh(logits / softcap)
    logits = jnp.where(mask, logits, -jnp.inf)
    mx = jnp.max(logits, axis=-1, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    w = jnp.where(mask, jnp.exp(logits - mx), 0.0)
    denom = jnp.sum(w, axis=-1, keepdims=True)
    # Masked slots may hold garbage (even NaN) in a real cache: zero them, 0 * NaN is NaN.
    v = jnp.where(value_mask, v, jnp.zeros((), v.dtype)).astype(jnp.float32)
    out = jnp.einsum(spec_v, w, v, preferred_element_type=jnp.float32)
    return out / jnp.where(denom > 0, denom, 1.0)


__all__ = ["attend_f64", "masked_attention_xla", "read_tokens_f64"]
