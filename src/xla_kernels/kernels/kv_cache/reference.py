"""Reference implementations of ``reshape_and_cache``.

* :func:`reshape_and_cache_xla`: plain jax.numpy (a scatter), the fallback for platforms
  without a kernel. Under ``jax.jit(..., donate_argnums=...)`` XLA updates the donated
  caches in place.
* :func:`reshape_and_cache_numpy`: NumPy, written as a loop over tokens, for tests;
  :func:`reshape_and_cache_fused_numpy` the same for one fused cache (``2h`` keys,
  ``2h + 1`` values on the third axis).

Token ``t`` goes to slot ``slot_mapping[t]`` (``block * block_size + offset``); a slot below 0
(padding) or at or beyond ``num_blocks * block_size`` is skipped. Into fp8 (``f8e4m3fn``)
caches the rows are quantized: ``x / scale`` in f32, round to nearest even, saturated to
+-448, NaN kept.

Example:
    >>> import numpy as np
    >>> key = np.ones((2, 1, 4), np.float32)
    >>> cache = np.zeros((2, 2, 1, 4), np.float32)            # vllm: 2 blocks of 2 slots
    >>> k, _ = reshape_and_cache_numpy(key, key, cache, cache, np.array([3, -1], np.int32))
    >>> k[1, 1, 0].tolist(), float(k.sum())
    ([1.0, 1.0, 1.0, 1.0], 4.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xla_kernels import dtypes
from xla_kernels.kernels.paged_cache import FP8, cache_dims, quantize_fp8


def _blocks(cache_shape: tuple[int, ...], layout: str) -> tuple[int, int]:
    return cache_dims(cache_shape, layout)[:2]


def reshape_and_cache_numpy(key: Any, value: Any, key_cache: Any, value_cache: Any,
                            slot_mapping: Any, *, layout: str = "vllm", k_scale: float = 1.0,
                            v_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the caches with each token's rows written to its slot (NumPy, a loop)."""
    caches = [np.array(key_cache, copy=True), np.array(value_cache, copy=True)]
    sources = [np.asarray(key), np.asarray(value)]
    if caches[0].dtype == dtypes.to_numpy(FP8):
        sources = [quantize_fp8(sources[0], k_scale), quantize_fp8(sources[1], v_scale)]
    num_blocks, block_size = _blocks(caches[0].shape, layout)
    for t, slot in enumerate(np.asarray(slot_mapping).tolist()):
        if not 0 <= slot < num_blocks * block_size:
            continue
        block, offset = divmod(slot, block_size)
        for cache, rows in zip(caches, sources, strict=True):
            for h in range(rows.shape[1]):
                if layout == "vllm":
                    cache[block, offset, h] = rows[t, h]
                else:
                    cache[h, block, offset] = rows[t, h]
    return caches[0], caches[1]


def reshape_and_cache_fused_numpy(key: Any, value: Any, kv_cache: Any, slot_mapping: Any, *,
                                  k_scale: float = 1.0, v_scale: float = 1.0) -> np.ndarray:
    """A copy of a fused cache [num_blocks, block_size, 2 * num_kv_heads, head_dim] (or its
    packed 5-D form) with each token's key rows written at heads ``2h`` and value rows at
    ``2h + 1`` (NumPy, a loop).

    Example:
        >>> key = np.ones((1, 1, 2), np.float32)
        >>> kv = reshape_and_cache_fused_numpy(key, 2 * key, np.zeros((1, 2, 2, 2), np.float32),
        ...                                    np.array([1], np.int32))
        >>> kv[0, 1].tolist()
        [[1.0, 1.0], [2.0, 2.0]]
    """
    packed = np.array(kv_cache, copy=True)
    cache = packed.reshape(*packed.shape[:2], -1, packed.shape[-1])  # 5-D: the same rows
    keys, values = np.asarray(key), np.asarray(value)
    if cache.dtype == dtypes.to_numpy(FP8):
        keys, values = quantize_fp8(keys, k_scale), quantize_fp8(values, v_scale)
    num_blocks, block_size = cache.shape[:2]
    for t, slot in enumerate(np.asarray(slot_mapping).tolist()):
        if not 0 <= slot < num_blocks * block_size:
            continue
        block, offset = divmod(slot, block_size)
        for h in range(keys.shape[1]):
            cache[block, offset, 2 * h] = keys[t, h]
            cache[block, offset, 2 * h + 1] = values[t, h]
    return packed


def quantize_fp8_xla(x: Any, scale: float) -> Any:
    """``x / scale`` (in f32) as ``float8_e4m3fn`` in jax.numpy: what the cache write stores
    (round to nearest even, saturated to +-448, NaN kept; :func:`quantize_fp8` in NumPy).

    Example:
        >>> import jax.numpy as jnp
        >>> quantize_fp8_xla(jnp.array([1.0, 1000.0, 0.3]), 0.5).astype(jnp.float32).tolist()
        [2.0, 448.0, 0.625]
    """
    import jax.numpy as jnp

    y = jnp.clip(jnp.asarray(x, jnp.float32) / jnp.float32(scale), -448.0, 448.0)
    return y.astype(dtypes.to_numpy(FP8))


def reshape_and_cache_xla(key: Any, value: Any, key_cache: Any, value_cache: Any,
                          slot_mapping: Any, *, layout: str = "vllm", k_scale: float = 1.0,
                          v_scale: float = 1.0) -> tuple[Any, Any]:
    """``reshape_and_cache`` in plain jax.numpy: one scatter per cache, jit-compatible."""
    import jax.numpy as jnp

    if np.dtype(key_cache.dtype) == dtypes.to_numpy(FP8):
        key, value = quantize_fp8_xla(key, k_scale), quantize_fp8_xla(value, v_scale)

    num_blocks, block_size = _blocks(tuple(key_cache.shape), layout)
    capacity = num_blocks * block_size
    slots = jnp.asarray(slot_mapping, jnp.int32)
    # Skipped slots point past the end, where mode="drop" discards them.
    slots = jnp.where((slots >= 0) & (slots < capacity), slots, capacity)
    out = []
    for cache, rows in ((jnp.asarray(key_cache), jnp.asarray(key)),
                        (jnp.asarray(value_cache), jnp.asarray(value))):
        if layout == "vllm":
            flat = cache.reshape(capacity, *cache.shape[2:])
            flat = flat.at[slots].set(rows.astype(cache.dtype), mode="drop")
        else:  # [heads, blocks, block_size, d]
            flat = cache.reshape(cache.shape[0], capacity, cache.shape[3])
            flat = flat.at[:, slots].set(jnp.swapaxes(rows, 0, 1).astype(cache.dtype),
                                         mode="drop")
        out.append(flat.reshape(cache.shape))
    return out[0], out[1]
