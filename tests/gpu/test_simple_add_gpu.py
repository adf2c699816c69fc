"""simple_add's CUDA kernel on the GPU: every dtype, odd sizes, large sizes, the HLO."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels import dtypes
from xla_kernels.hlo import assert_single_custom_call, hlo_text
from xla_kernels.kernels.simple_add import simple_add

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 8, 9, 31, 1021, 4099, 65537, 1 << 20, 1 << 26])
def test_matches_float64_sum_rounded_once(rng, dtype, size):
    np_dtype = dtypes.to_numpy(dtype)
    a = rng.standard_normal(size).astype(np_dtype)
    b = rng.standard_normal(size).astype(np_dtype)
    out = np.asarray(jax.jit(simple_add)(jnp.asarray(a), jnp.asarray(b)))
    want = (a.astype(np.float64) + b.astype(np.float64)).astype(np_dtype)
    np.testing.assert_array_equal(out.astype(np.float64), want.astype(np.float64))


def test_runs_on_gpu_and_is_one_custom_call():
    a = jnp.ones(1024)
    assert a.devices().pop().platform == "gpu"
    assert_single_custom_call(hlo_text(simple_add, a, a), simple_add.target)


def test_f64_is_rejected_on_the_gpu_with_a_clear_error():
    jax.config.update("jax_enable_x64", True)
    try:
        with pytest.raises(xk.OpTypeError, match="dtype f64 is not supported on cuda"):
            jax.jit(simple_add)(jnp.ones(3, jnp.float64), jnp.ones(3, jnp.float64))
    finally:
        jax.config.update("jax_enable_x64", False)
