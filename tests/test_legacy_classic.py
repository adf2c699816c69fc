"""Kernels in XLA's classic CPU custom-call form ``void fn(void* out, const void** in)``
(optionally with ``XlaCustomCallStatus*``) run unchanged, as typed FFI."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels.hlo import assert_single_custom_call, hlo_text

SOURCE = "fixtures/legacy_classic/classic_cpu.cc"
INPUTS = [xk.Tensor("n", dtypes=("i32",), rank=0), xk.Tensor("a", dtypes=("f32",), rank=1),
          xk.Tensor("b", dtypes=("f32",), rank=1)]

classic_add = xk.Op(
    "xk_tests.classic_add", inputs=INPUTS, outputs=lambda n, a, b: xk.like(a),
    kernels={"cpu": xk.Kernel.legacy(SOURCE, "ClassicAdd", signature="cpu_classic")})

classic_sum_diff = xk.Op(
    "xk_tests.classic_sum_diff", inputs=INPUTS,
    outputs=lambda n, a, b: (xk.like(a), xk.like(a)),
    kernels={"cpu": xk.Kernel.legacy(SOURCE, "ClassicSumDiff", signature="cpu_classic")})

classic_checked = xk.Op(
    "xk_tests.classic_checked", inputs=INPUTS, outputs=lambda n, a, b: xk.like(a),
    kernels={"cpu": xk.Kernel.legacy(SOURCE, "ClassicChecked", signature="cpu_classic")})


def _args(rng, size):
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    return np.int32(size), a, b


@pytest.mark.parametrize("size", [1, 7, 1000])
def test_classic_cpu_single_output(rng, size):
    n, a, b = _args(rng, size)
    np.testing.assert_array_equal(np.asarray(jax.jit(classic_add)(n, a, b)), a + b)


def test_classic_cpu_several_outputs_arrive_as_a_pointer_table(rng):
    n, a, b = _args(rng, 33)
    total, diff = jax.jit(classic_sum_diff)(n, a, b)
    np.testing.assert_array_equal(np.asarray(total), a + b)
    np.testing.assert_array_equal(np.asarray(diff), a - b)


def test_classic_cpu_status_form_reports_failure(rng):
    n, a, b = _args(rng, 5)
    np.testing.assert_array_equal(np.asarray(jax.jit(classic_checked)(n, a, b)), a)
    with pytest.raises(Exception, match="ClassicChecked: negative element count"):
        jax.block_until_ready(jax.jit(classic_checked)(np.int32(-1), a, b))


def test_classic_cpu_lowers_to_typed_ffi():
    text = hlo_text(classic_add, jnp.int32(3), jnp.ones(3), jnp.ones(3))
    assert_single_custom_call(text, "xk_tests.classic_add", "API_VERSION_TYPED_FFI")


def test_unknown_legacy_signature_is_rejected():
    with pytest.raises(xk.OpDeclarationError, match=r"signature 'cpu'.*buffers, cpu_classic"):
        xk.Kernel.legacy(SOURCE, "ClassicAdd", signature="cpu")
