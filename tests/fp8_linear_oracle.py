"""fp8_linear's float64 oracle, shared by tests/test_fp8_linear.py and
tests/gpu/test_fp8_linear_gpu.py. Written from the op's documented semantics, apart from the
kernels and from kernels/fp8_linear/reference.py: the weight is decoded by ml_dtypes and
scaled element by element; "dynamic" quantizes x in NumPy f32 exactly as documented, then
everything is float64."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}


def rel(a: Any, b: Any) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def dequantize_f64(q: Any, scale: Any, block_shape: tuple[int, int]) -> np.ndarray:
    """The weight [out, in]: each e4m3 value times its own scale."""
    q = np.asarray(q).astype(np.float64)
    scale = np.asarray(scale, np.float64)
    bn, bk = block_shape
    r = np.arange(q.shape[0])[:, None]
    c = np.arange(q.shape[1])[None, :]
    if bn == 0:
        return q * scale[r, 0]
    return q * scale[r // bn, c // bk]


def quantize_rows_f32(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 values as float64 [tokens, in], scales float64 [tokens, 1]): per row, in f32,
    s = max(amax, 1e-12) * f32(1 / 448) and q = e4m3(clip(x / s, -448, 448)) rounded to
    nearest even."""
    x = np.asarray(x).astype(np.float32)
    amax = np.abs(x).max(axis=1, keepdims=True) if x.shape[1] else np.zeros((len(x), 1))
    s = np.maximum(amax.astype(np.float32), np.float32(1e-12)) * np.float32(1 / 448)
    s = s.astype(np.float32)
    q = np.clip(x / s, np.float32(-448), np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float64), s.astype(np.float64)


def fp8_linear_f64(x: Any, weight: Any, scale: Any, *, block_shape: tuple[int, int] = (0, 0),
                   activation_scheme: str = "none") -> np.ndarray:
    """y [tokens, out] in float64."""
    w = dequantize_f64(weight, scale, block_shape)
    if activation_scheme == "none":
        return np.asarray(x).astype(np.float64) @ w.T
    q, s = quantize_rows_f32(x)
    return s * (q @ w.T)


def make_inputs(rng: np.random.Generator, tokens: int, k: int, out: int, dtype: str,
                block_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x in dtype, e4m3 weight, f32 scales): entries of y of order one; each row of x has
    its own magnitude, so the per-token scales differ."""
    from xla_kernels import dtypes
    from xla_kernels.kernels.fp8_weights import fp8_quantize

    x = rng.standard_normal((tokens, k)) * rng.uniform(0.1, 10, (tokens, 1))
    w = rng.standard_normal((out, k)) / np.sqrt(k) * rng.uniform(0.5, 2, (out, 1))
    q, s = fp8_quantize(w.astype(np.float32), block_shape)
    return x.astype(dtypes.to_numpy(dtype)), q, s
