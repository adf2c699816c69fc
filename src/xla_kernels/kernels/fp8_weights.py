"""fp8 e4m3 weights with f32 scales, vLLM's layout, shared by the ops that take them
(``fused_moe_fp8``, ``fp8_linear``): the scales' shape, dequantization in JAX and
quantization in NumPy (for tests and benchmarks).

A weight matrix [..., rows, cols] (rows: output channels) is stored as e4m3 values ``q``
and f32 scales ``s``; the weight is ``q * s`` of its scale:

* ``block_shape == (0, 0)``: one scale per output channel, ``s`` [..., rows, 1];
* ``block_shape == (bn, bk)``: one scale per bn x bk block (DeepSeek's 128 x 128),
  ``s`` [..., ceil(rows / bn), ceil(cols / bk)]; the last blocks may be partial.

Example:
    >>> import numpy as np
    >>> q, s = fp8_quantize(np.ones((3, 200), np.float32), (128, 128))
    >>> s.shape, block_scale_shape(3, 200, (128, 128)), block_scale_shape(3, 200, (0, 0))
    ((1, 2), (1, 2), (3, 1))
    >>> float(dequantize(q, s, (128, 128))[2, 199])
    1.0
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

#: The largest finite float8_e4m3fn value.
E4M3_MAX = 448.0


def block_scale_shape(rows: int, cols: int, block_shape: tuple[int, int]) -> tuple[int, int]:
    """The shape of one weight matrix's scales: ``(rows, 1)`` per channel, else the blocks."""
    bn, bk = (int(b) for b in block_shape)
    if bn == 0:
        return (rows, 1)
    return (-(-rows // bn), -(-cols // bk))


def dequantize(w: Any, scale: Any, block_shape: tuple[int, int]) -> Any:
    """f32 weights [..., rows, cols] from e4m3 values and their scales: per output channel
    (``block_shape == (0, 0)``: scale [..., rows, 1]) or per (bn x bk) block (scale
    [..., ceil(rows / bn), ceil(cols / bk)])."""
    w = jnp.asarray(w).astype(jnp.float32)
    scale = jnp.asarray(scale, jnp.float32)
    bn, bk = (int(b) for b in block_shape)
    if bn == 0:
        return w * scale
    rows, cols = w.shape[-2:]
    full = jnp.repeat(jnp.repeat(scale, bn, axis=-2), bk, axis=-1)
    return w * full[..., :rows, :cols]


def fp8_quantize(w: Any, block_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 weights, f32 scales) of f32 weights [..., rows, cols], vLLM's way: each
    output channel (``(0, 0)``) or (bn x bk) block scaled so that its largest magnitude maps
    to 448, the largest e4m3 value. A helper for tests and benchmarks (NumPy)."""
    import ml_dtypes

    w = np.asarray(w, np.float32)
    *lead, rows, cols = w.shape
    bn, bk = (int(b) for b in block_shape)
    if bn == 0:
        amax = np.abs(w).max(axis=-1, keepdims=True)
        scale = np.maximum(amax, 1e-12) / E4M3_MAX
        return (w / scale).astype(ml_dtypes.float8_e4m3fn), scale.astype(np.float32)
    nb, kb = -(-rows // bn), -(-cols // bk)
    padded = np.zeros((*lead, nb * bn, kb * bk), np.float32)
    padded[..., :rows, :cols] = w
    blocks = padded.reshape(*lead, nb, bn, kb, bk)
    scale = np.maximum(np.abs(blocks).max(axis=(-3, -1)), 1e-12) / E4M3_MAX
    full = np.repeat(np.repeat(scale, bn, axis=-2), bk, axis=-1)[..., :rows, :cols]
    return (w / full).astype(ml_dtypes.float8_e4m3fn), scale.astype(np.float32)
