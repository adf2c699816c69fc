"""Reference implementations of decode paged attention.

* :func:`paged_attention_xla`: plain jax.numpy (gather the blocks, einsum, masked softmax).
  The documented fallback for platforms without a kernel; runs anywhere under ``jax.jit``.
  It materializes the gathered cache (``num_seqs * max_context * num_kv_heads * head_dim``
  elements per cache), so it needs far more memory and bandwidth than the kernel.
* :func:`paged_attention_numpy_f64`: float64 NumPy, for tests.

Both have the kernel's semantics (see ``xla_kernels.kernels.paged_attention``); with fp8
(``f8e4m3fn``) caches they attend over the dequantized cache (stored x ``k_scale`` /
``v_scale``). ``scale``
multiplies q.k, ``softcap > 0`` applies ``softcap * tanh(x / softcap)`` after it, a
``sliding_window > 0`` keeps positions ``t >= seq_len - sliding_window``, ``seq_len`` is
clamped to the capacity ``max_blocks_per_seq * block_size``, block ids outside
``[0, num_blocks)`` mask their tokens, and a row with no token left is all zeros.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    >>> kc = rng.standard_normal((8, 16, 2, 64)).astype(np.float32)  # vllm layout
    >>> bt = np.array([[0, 1], [2, 3]], np.int32)
    >>> lens = np.array([20, 0], np.int32)
    >>> ref = paged_attention_numpy_f64(q, kc, kc, bt, lens, scale=0.125)
    >>> out = paged_attention_xla(q, kc, kc, bt, lens, scale=0.125)
    >>> bool(np.allclose(out, ref, atol=1e-5)), float(abs(ref[1]).max())
    (True, 0.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xla_kernels import dtypes
from xla_kernels.kernels.paged_cache import FP8, LAYOUTS, cache_dims
from xla_kernels.kernels.paged_reference import attend_f64, masked_attention_xla, read_tokens_f64


def paged_attention_xla(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    *,
    scale: float,
    softcap: float = 0.0,
    sliding_window: int = 0,
    layout: str = "vllm",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Any:
    """Decode paged attention in plain jax.numpy (XLA gather + einsum), jit-compatible.

    Args:
        query: [num_seqs, num_q_heads, head_dim].
        key_cache, value_cache: ``"vllm"`` [num_blocks, block_size, num_kv_heads, head_dim]
            or ``"pallas"`` [num_kv_heads, num_blocks, block_size, head_dim].
        block_tables: int32 [num_seqs, max_blocks_per_seq].
        seq_lens: int32 [num_seqs].
        scale, softcap, sliding_window, layout, k_scale, v_scale: as in the op.

    Returns:
        [num_seqs, num_q_heads, head_dim] in the query's dtype; logits, softmax and the
        weighted sum are computed in f32.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> q = jnp.ones((1, 2, 64), jnp.bfloat16)
        >>> kc = jnp.ones((4, 16, 1, 64), jnp.bfloat16)
        >>> f = jax.jit(paged_attention_xla, static_argnames=("scale",))
        >>> f(q, kc, kc, jnp.array([[0, 1]], jnp.int32), jnp.array([17], jnp.int32),
        ...   scale=0.125).shape
        (1, 2, 64)
    """
    import jax.numpy as jnp

    num_seqs, num_q_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads = cache_dims(tuple(key_cache.shape), layout)[:3]
    group = num_q_heads // num_kv_heads
    max_blocks = block_tables.shape[1]
    capacity = max_blocks * block_size

    bt = jnp.asarray(block_tables, jnp.int32)
    block_ok = (bt >= 0) & (bt < num_blocks)
    idx = jnp.where(block_ok, bt, 0)
    lens = jnp.clip(jnp.asarray(seq_lens, jnp.int32), 0, capacity)
    pos = jnp.arange(capacity, dtype=jnp.int32)
    mask = (pos[None, :] < lens[:, None]) & jnp.repeat(block_ok, block_size, axis=1)
    if sliding_window > 0:
        mask &= pos[None, :] >= (lens - sliding_window)[:, None]

    q = jnp.asarray(query).reshape(num_seqs, num_kv_heads, group, head_dim)
    if layout == "vllm":  # -> [S, capacity, Hkv, D]
        k = jnp.asarray(key_cache)[idx].reshape(num_seqs, capacity, num_kv_heads, head_dim)
        v = jnp.asarray(value_cache)[idx].reshape(num_seqs, capacity, num_kv_heads, head_dim)
        specs = ("skgd,stkd->skgt", "skgt,stkd->skgd")
        vmask = mask[:, :, None, None]
    else:  # -> [Hkv, S, capacity, D]
        k = jnp.asarray(key_cache)[:, idx].reshape(num_kv_heads, num_seqs, capacity, head_dim)
        v = jnp.asarray(value_cache)[:, idx].reshape(num_kv_heads, num_seqs, capacity, head_dim)
        specs = ("skgd,kstd->skgt", "skgt,kstd->skgd")
        vmask = mask[None, :, :, None]
    fp8 = np.dtype(key_cache.dtype) == dtypes.to_numpy(FP8)
    out = masked_attention_xla(q, k, v, mask[:, None, None, :], vmask, specs=specs, scale=scale,
                               softcap=softcap, fp8=fp8, k_scale=k_scale, v_scale=v_scale)
    return out.reshape(num_seqs, num_q_heads, head_dim).astype(query.dtype)


def paged_attention_numpy_f64(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    *,
    scale: float,
    softcap: float = 0.0,
    sliding_window: int = 0,
    layout: str = "vllm",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> np.ndarray:
    """Decode paged attention in float64 NumPy, token by token: the test oracle.

    Inputs may be NumPy or JAX arrays of any floating dtype; the result is float64
    [num_seqs, num_q_heads, head_dim]. Cache slots that are not attended are never read,
    so they may hold NaN. The keys are ``key_cache * k_scale`` and the values
    ``value_cache * v_scale`` (in float64: the dequantized fp8 cache).

    Example:
        >>> q = np.ones((1, 1, 64)); kc = np.ones((2, 16, 1, 64))
        >>> paged_attention_numpy_f64(q, kc, kc, np.array([[1]]), np.array([3]),
        ...                           scale=1.0)[0, 0, :3]
        array([1., 1., 1.])
    """
    q = np.asarray(query).astype(np.float64)
    bt = np.asarray(block_tables).astype(np.int64)
    lens = np.asarray(seq_lens).astype(np.int64)
    kc, vc = np.asarray(key_cache), np.asarray(value_cache)
    block_size = cache_dims(kc.shape, layout)[1]
    capacity = bt.shape[1] * block_size
    out = np.zeros(q.shape, np.float64)
    for s in range(q.shape[0]):
        n = min(int(lens[s]), capacity)
        lo = max(0, n - sliding_window) if sliding_window > 0 else 0
        t, k, v = read_tokens_f64(kc, vc, bt[s], np.arange(lo, max(n, lo)),
                                  layout=layout, k_scale=k_scale, v_scale=v_scale)
        if t.size:
            out[s] = attend_f64(q[s], k, v, scale=scale, softcap=softcap)
    return out


__all__ = ["LAYOUTS", "paged_attention_numpy_f64", "paged_attention_xla"]
