"""Float64 references for the all-reduce and the all-reduce + residual add + RMSNorm.

Example:
    >>> import numpy as np
    >>> all_reduce_numpy_f64([np.ones(3, np.float32), np.full(3, 2, np.float32)])
    array([3., 3., 3.])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from xla_kernels.kernels.rms_norm import fused_add_rms_norm_numpy_f64


def all_reduce_numpy_f64(xs: Sequence[Any]) -> np.ndarray:
    """The sum of every rank's array, in float64."""
    return np.sum([np.asarray(x, np.float64) for x in xs], axis=0)


def all_reduce_add_rms_norm_numpy_f64(xs: Sequence[Any], residual: Any, weight: Any, *,
                                      eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """``(out, residual_out)`` in float64 of ``fused_add_rms_norm(all_reduce(xs), residual,
    weight)``. The sum is rounded to the dtype first, as the unfused program's all-reduce in
    that dtype does: the rounding is part of the op's definition, not an error of it."""
    total = all_reduce_numpy_f64(xs).astype(np.asarray(xs[0]).dtype)
    return fused_add_rms_norm_numpy_f64(total, residual, weight, eps=eps)
