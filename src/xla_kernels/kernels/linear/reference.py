"""``linear`` in plain XLA (:func:`linear_xla`: XLA's dot, the peer the benchmark times and
the fallback) and in float64 NumPy (:func:`linear_numpy_f64`, the tests' reference, sharing
no code with the kernels).

Example:
    >>> import numpy as np
    >>> linear_numpy_f64(np.ones((2, 3), np.float32), np.eye(3, dtype=np.float32)).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np


def linear_xla(x: Any, weight: Any) -> Any:
    """``x @ weight.T`` as one XLA dot with f32 accumulation, rounded once to x's dtype
    (cuBLAS on NVIDIA GPUs)."""
    import jax

    y = jax.lax.dot_general(x, weight, (((1,), (1,)), ((), ())),
                            preferred_element_type=np.float32)
    return y.astype(x.dtype)


def linear_numpy_f64(x: Any, weight: Any) -> np.ndarray:
    """``x @ weight.T`` in float64 (no rounding to x's dtype)."""
    return np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T
