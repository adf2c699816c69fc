"""``simple_add`` on the CPU through JAX and torch eager, against NumPy's float64 sum."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.simple_add import simple_add


def test_jax_sum_matches_float64(rng):
    # float32 inputs: their exact sum, rounded once, is within 2**-24 of the float64 sum.
    a, b = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    out = np.asarray(simple_add(jnp.asarray(a), jnp.asarray(b)))
    np.testing.assert_allclose(out, a.astype(np.float64) + b, rtol=1e-6)


def test_torch_eager_sum_matches_float64(rng):
    a, b = (rng.standard_normal((4, 7)).astype(np.float32) for _ in range(2))
    out = torch_op(simple_add)(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(out, a.astype(np.float64) + b, rtol=1e-6)


def test_a_shape_mismatch_names_the_argument_and_the_fix():
    with pytest.raises(Exception, match=r"b.*shape \(3,\) differs from a's shape \(2,\).*"
                                        r"broadcast them first"):
        simple_add(jnp.ones(2), jnp.ones(3))
