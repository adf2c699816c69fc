"""What tests/test_fp8_linear.py and tests/gpu/test_fp8_linear_gpu.py share: tolerances, the
relative error and inputs. The float64 reference is the package's
(:func:`xla_kernels.kernels.fp8_linear.fp8_linear_numpy_f64`, NumPy and ml_dtypes only,
sharing no code with the kernels or the plain-XLA path)."""

from __future__ import annotations

from typing import Any

import numpy as np

from xla_kernels.kernels.fp8_linear.reference import dequantize_f64, quantize_rows_f32
from xla_kernels.kernels.fp8_linear.reference import fp8_linear_numpy_f64 as fp8_linear_f64

__all__ = ["TOL", "dequantize_f64", "fp8_linear_f64", "make_inputs", "quantize_rows_f32", "rel"]

TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}


def rel(a: Any, b: Any) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


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
