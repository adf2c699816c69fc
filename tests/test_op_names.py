"""Op names: every custom-call target XLA takes (``foo-fwd``, as in JAX's FFI examples),
end to end in JAX and torch, with a torch operator name derived from it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels.frontends.torch import native as torch_native
from xla_kernels.frontends.torch import qualified_name, torch_op
from xla_kernels.kernels.simple_add import simple_add


def _add(name: str) -> xk.Op:
    """simple_add's CPU kernel under another target name."""
    return xk.Op(name, inputs=simple_add.inputs, outputs=simple_add.output_rule,
                 kernels={"cpu": simple_add.kernels["cpu"]})


dashed = _add("xk_tests.add-fwd")
dashed_python = _add("xk_tests.add-fwd-python")


@pytest.mark.parametrize("name", ["foo-fwd", "1abc-", "my_lib/v2.add+bias@x"])
def test_every_target_name_without_whitespace_is_accepted(name):
    assert _add(name).target == name


@pytest.mark.parametrize(("name", "qualname"), [
    ("foo-fwd", "xk_user::foo_fwd"), ("1abc-", "xk_user::_1abc_"),
    ("my-lib.v2.add+bias", "my_lib_v2::add_bias"), ("ns.caf\u00e9", "ns::caf_")])
def test_the_torch_name_is_an_identifier_derived_from_the_target(name, qualname):
    assert qualified_name(_add(name)) == qualname


def test_a_dashed_target_runs_in_jax_eagerly_and_under_jit():
    a, b = jnp.arange(3.0, dtype=jnp.float32), jnp.ones(3, jnp.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        np.testing.assert_array_equal(dashed(a, b), [1, 2, 3])
        np.testing.assert_array_equal(jax.jit(dashed)(a, b), [1, 2, 3])
        xk.assert_single_custom_call(xk.hlo_text(dashed, a, b), "xk_tests.add-fwd")


def test_a_dashed_target_runs_in_torch_on_the_native_path():
    if not torch_native.available():
        pytest.skip(f"native torch kernels unavailable: {torch_native.native_status()}")
    op = torch_op(dashed)
    assert op is torch.ops.xk_tests.add_fwd
    assert op(torch.arange(3.0), torch.ones(3)).tolist() == [1.0, 2.0, 3.0]


def test_a_dashed_target_runs_in_torch_on_the_python_path(monkeypatch):
    monkeypatch.setenv("XLA_KERNELS_TORCH_NATIVE", "0")
    op = torch_op(dashed_python)
    assert op(torch.arange(3.0), torch.ones(3)).tolist() == [1.0, 2.0, 3.0]
