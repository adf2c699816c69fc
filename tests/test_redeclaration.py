"""The one rule for a second declaration of a target, in every frontend and every order.

A redeclaration replaces the first declaration everywhere, unless a kernel of the first is
already loaded (XLA cannot replace a handler) with another declaration, or its torch
operator exists with another schema; then the declaration itself raises.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import xla_kernels as xk
from xla_kernels.frontends.torch import torch_op
from xla_kernels.frontends.torchax import import_torchax, register_torchax

FIXTURE = "fixtures/redeclare/times.cc"
_names = itertools.count()


def declare(target: str, handler: str, rule=None) -> xk.Op:
    return xk.Op(target, inputs=[xk.Tensor("x", ("f32",))],
                 outputs=rule or (lambda x: xk.like(x)),
                 kernels={"cpu": xk.Kernel([FIXTURE], handler)})


def run_jax(op: xk.Op) -> np.ndarray:
    return np.asarray(jax.jit(op)(np.ones(3, np.float32)))


def run_torch(op: xk.Op) -> np.ndarray:
    return torch_op(op)(torch.ones(3)).numpy()


def run_torchax(op: xk.Op) -> np.ndarray:
    torchax = import_torchax()
    register_torchax(op)
    packet = torch_op(op)
    with torchax.default_env():
        out = packet(torch.ones(3, device="jax"))
    return np.asarray(out.jax())


FRONTENDS = {"jax": run_jax, "torch": run_torch, "torchax": run_torchax}
ORDERS = [pytest.param(order, id="-then-".join(order))
          for order in itertools.permutations(FRONTENDS, 2)]


def fresh_target() -> str:
    return f"xk_tests.redeclared_{next(_names)}"


@pytest.mark.parametrize("order", ORDERS)
def test_other_kernels_are_refused_once_any_frontend_loaded_the_first(order):
    target = fresh_target()
    first = declare(target, "XkTestTimesTwo")
    for name in order:
        np.testing.assert_array_equal(FRONTENDS[name](first), [2, 2, 2])
    with pytest.raises(xk.OpDeclarationError,
                       match=rf"{target}: already declared in test_redeclaration, and its cpu "
                             r"kernel \(XkTestTimesTwo from .*\) is already loaded.* Fix: give "
                             "this op another name, or reuse the first declaration"):
        declare(target, "XkTestTimesThree")
    for name in reversed(order):  # the first declaration still runs everywhere
        np.testing.assert_array_equal(FRONTENDS[name](first), [2, 2, 2])


@pytest.mark.parametrize("order", ORDERS)
def test_a_redeclaration_before_any_use_runs_its_own_kernel_everywhere(order):
    target = fresh_target()
    first = declare(target, "XkTestTimesTwo")
    second = declare(target, "XkTestTimesThree")
    for name in order:
        np.testing.assert_array_equal(FRONTENDS[name](second), [3, 3, 3])
        np.testing.assert_array_equal(FRONTENDS[name](first), [3, 3, 3])


@pytest.mark.parametrize("order", ORDERS)
def test_a_redeclaration_with_the_same_kernel_takes_over_the_shape_rule(order):
    target = fresh_target()
    first = declare(target, "XkTestTimesTwo")
    for name in order:
        FRONTENDS[name](first)

    def checked(x):
        if x.shape == (4,):
            raise xk.Invalid("x", f"shape {x.shape} is refused", "pass another shape")
        return xk.like(x)

    second = declare(target, "XkTestTimesTwo", checked)
    assert xk.record_of(target).op is second
    for name in order:
        np.testing.assert_array_equal(FRONTENDS[name](second), [2, 2, 2])
    with pytest.raises(xk.OpInputError, match=rf"{target}: argument 'x': shape \(4,\) is refused"):
        torch_op(first)(torch.ones(4))
    with pytest.raises(xk.OpInputError, match=rf"{target}: argument 'x': shape \(4,\) is refused"):
        first(np.ones(4, np.float32))


def test_a_torch_schema_change_is_refused_once_the_operator_exists():
    target = fresh_target()
    torch_op(declare(target, "XkTestTimesTwo"))
    with pytest.raises(xk.OpDeclarationError,
                       match=r"its torch operator xk_tests::redeclared_\d+ is defined with "
                             r"schema \(Tensor x\) -> Tensor, while this declaration needs "
                             r"\(Tensor x\) -> \(Tensor, Tensor\)"):
        declare(target, "XkTestTimesTwo", lambda x: (xk.like(x), xk.like(x)))


def test_a_schema_change_before_torch_saw_the_op_is_fine():
    target = fresh_target()
    declare(target, "XkTestTimesTwo")
    two = declare(target, "XkTestTimesTwo", lambda x: (xk.like(x), xk.like(x)))
    with FakeTensorMode():
        assert [t.shape for t in torch_op(two)(torch.ones(3))] == [(3,), (3,)]
