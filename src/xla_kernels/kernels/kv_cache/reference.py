"""Reference implementations of ``reshape_and_cache``.

* :func:`reshape_and_cache_xla`: plain jax.numpy (a scatter), the fallback for platforms
  without a kernel. Under ``jax.jit(..., donate_argnums=...)`` XLA updates the donated
  caches in place.
* :func:`reshape_and_cache_numpy`: NumPy, written as a loop over tokens, for tests.

Token ``t`` goes to slot ``slot_mapping[t]`` (``block * block_size + offset``); a slot below 0
(padding) or at or beyond ``num_blocks * block_size`` is skipped.

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

from xla_kernels.kernels.paged_cache import cache_dims


def _blocks(cache_shape: tuple[int, ...], layout: str) -> tuple[int, int]:
    return cache_dims(cache_shape, layout)[:2]


def reshape_and_cache_numpy(key: Any, value: Any, key_cache: Any, value_cache: Any,
                            slot_mapping: Any, *, layout: str = "vllm"
                            ) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the caches with each token's rows written to its slot (NumPy, a loop)."""
    caches = [np.array(key_cache, copy=True), np.array(value_cache, copy=True)]
    num_blocks, block_size = _blocks(caches[0].shape, layout)
    for t, slot in enumerate(np.asarray(slot_mapping).tolist()):
        if not 0 <= slot < num_blocks * block_size:
            continue
        block, offset = divmod(slot, block_size)
        for cache, rows in zip(caches, (np.asarray(key), np.asarray(value)), strict=True):
            for h in range(rows.shape[1]):
                if layout == "vllm":
                    cache[block, offset, h] = rows[t, h]
                else:
                    cache[h, block, offset] = rows[t, h]
    return caches[0], caches[1]


def reshape_and_cache_xla(key: Any, value: Any, key_cache: Any, value_cache: Any,
                          slot_mapping: Any, *, layout: str = "vllm") -> tuple[Any, Any]:
    """``reshape_and_cache`` in plain jax.numpy: one scatter per cache, jit-compatible."""
    import jax.numpy as jnp

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
