"""Torch ops that update inputs in place, under autograd: never a silent wrong gradient.

An update bumps the version counter of every tensor it writes (as torch's own in-place ops
do), so a later backward that needs the old values raises torch's "modified by an inplace
operation" error; an input that requires grad is refused at the call, with a fix. Both on
the native (C++) dispatcher path and the Python one (``XLA_KERNELS_TORCH_NATIVE=0``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import xla_kernels as xk
from xla_kernels.frontends.torch import native as torch_native
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.kv_cache import reshape_and_cache

SOURCE = "fixtures/op_model/op_model.cc"
VERSION_ERROR = "modified by an inplace operation"


def _accumulate(path: str) -> xk.Op:
    """acc += x, updating acc in place; one op per dispatch path (a torch operator's
    kernels are chosen once, when it is defined)."""
    return xk.Op(f"xk_tests.accumulate_{path}",
                 inputs=[xk.Tensor("acc", ("f32",), in_place=True), xk.Tensor("x", ("f32",))],
                 outputs=lambda acc, x: xk.updated(acc),
                 kernels={"cpu": xk.Kernel([SOURCE], "XkTestAccumulate")})


OPS = {path: _accumulate(path) for path in ("native", "python")}


@contextlib.contextmanager
def _native(enabled: bool) -> Iterator[None]:
    old = os.environ.get("XLA_KERNELS_TORCH_NATIVE")
    os.environ["XLA_KERNELS_TORCH_NATIVE"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["XLA_KERNELS_TORCH_NATIVE"]
        else:
            os.environ["XLA_KERNELS_TORCH_NATIVE"] = old


def accumulate(path: str):
    """The torch operator of ``OPS[path]``, defined on that path."""
    if path == "native" and not torch_native.available():
        pytest.skip(f"native torch kernels unavailable: {torch_native.native_status()}")
    with _native(path == "native"):
        return torch_op(OPS[path])


PATHS = pytest.mark.parametrize("path", ["native", "python"])


@PATHS
def test_backward_refuses_a_saved_tensor_the_op_updated(path):
    op = accumulate(path)
    w, acc = torch.ones(3, requires_grad=True), torch.arange(3.0)
    loss = (w * acc).sum()  # saves acc for w's gradient
    op(acc, torch.ones(3))
    assert acc.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match=VERSION_ERROR):
        loss.backward()


@PATHS
def test_backward_refuses_an_update_through_a_detached_alias(path):
    op = accumulate(path)
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    loss = (y * y).sum()
    op(y.detach(), torch.ones(3))  # detach() shares y's memory and version counter
    with pytest.raises(RuntimeError, match=VERSION_ERROR):
        loss.backward()


@PATHS
def test_updating_a_tensor_that_requires_grad_is_refused_with_a_fix(path):
    op = accumulate(path)
    acc = torch.zeros(3, requires_grad=True)
    with pytest.raises(xk.OpInputError) as e:
        op(acc, torch.ones(3))
    assert str(e.value) == (f"xk_tests.accumulate_{path}: argument 'acc': requires grad and "
                            "is updated in place, which autograd cannot record. Fix: update "
                            "it under torch.no_grad(), or pass acc.detach().")
    assert acc.tolist() == [0.0, 0.0, 0.0]


@PATHS
def test_an_input_requiring_grad_beside_an_updated_one_is_refused_with_a_fix(path):
    op = accumulate(path)
    acc, x = torch.zeros(3), torch.ones(3, requires_grad=True)
    with pytest.raises(xk.OpInputError) as e:
        op(acc, x)
    assert str(e.value) == (f"xk_tests.accumulate_{path}: argument 'x': requires grad, but "
                            "the op updates 'acc' in place, which autograd cannot "
                            "differentiate. Fix: pass x.detach(), or call the op under "
                            "torch.no_grad().")
    assert acc.tolist() == [0.0, 0.0, 0.0]


@PATHS
def test_updating_a_leaf_that_requires_grad_under_no_grad_works(path):
    op = accumulate(path)
    w = torch.zeros(3, requires_grad=True)
    with torch.no_grad():
        op(w, torch.ones(3))
    assert w.tolist() == [1.0, 1.0, 1.0] and w._version == 1


def test_shipped_reshape_and_cache_bumps_the_cache_versions():
    key = torch.ones(2, 1, 16)
    key_cache, value_cache = torch.zeros(2, 4, 1, 16), torch.zeros(2, 4, 1, 16)
    w = torch.ones(2, 4, 1, 16, requires_grad=True)
    loss = (w * key_cache).sum()
    torch_op(reshape_and_cache)(key, key, key_cache, value_cache,
                                torch.tensor([0, 5], dtype=torch.int32))
    assert (key_cache._version, value_cache._version) == (1, 1)
    with pytest.raises(RuntimeError, match=VERSION_ERROR):
        loss.backward()


@settings(max_examples=24)
@given(path=st.sampled_from(["native", "python"]),
       requires_grad=st.sampled_from([None, "acc", "x"]), saved=st.booleans(),
       grad_mode=st.booleans())
def test_an_update_either_is_refused_or_makes_every_later_backward_right(
        path, requires_grad, saved, grad_mode):
    op = accumulate(path)
    w = torch.ones(3, requires_grad=True)
    acc, x = torch.arange(3.0), torch.ones(3)
    if requires_grad == "acc":
        acc.requires_grad_()
    elif requires_grad == "x":
        x.requires_grad_()
    loss = (w * acc).sum() if saved else (w * 2).sum()
    with torch.set_grad_enabled(grad_mode):
        if grad_mode and requires_grad is not None:
            with pytest.raises(xk.OpInputError, match=f"argument '{requires_grad}': requires "
                                                      "grad"):
                op(acc, x)
            assert acc.tolist() == [0.0, 1.0, 2.0]
            return
        op(acc, x)
    assert acc.tolist() == [1.0, 2.0, 3.0]
    if saved:
        with pytest.raises(RuntimeError, match=VERSION_ERROR):
            loss.backward()
    else:
        loss.backward()
        assert w.grad.tolist() == [2.0, 2.0, 2.0]


# ------------------------------------------------------------------ torch.compile

def _compiled_update():
    op = accumulate("native" if torch_native.available() else "python")

    def update(acc, x):
        op(acc, x)
        return acc * 1

    return torch.compile(update, fullgraph=True, backend="aot_eager")


def compiled_update_of_a_saved_tensor_checks() -> None:
    w, acc = torch.ones(3, requires_grad=True), torch.arange(3.0)
    loss = (w * acc).sum()
    _compiled_update()(acc, torch.ones(3))
    assert acc.tolist() == [1.0, 2.0, 3.0]
    try:
        loss.backward()
    except RuntimeError as e:
        assert VERSION_ERROR in str(e), e
    else:
        raise AssertionError("backward used the updated acc")


def compiled_update_of_a_tensor_that_requires_grad_checks() -> None:
    acc = torch.zeros(3, requires_grad=True)
    try:
        _compiled_update()(acc, torch.ones(3))
    except Exception as e:  # dynamo may wrap the library's error; the message is kept
        assert "argument 'acc': requires grad and is updated in place" in str(e), e
    else:
        raise AssertionError("a compiled update of a tensor that requires grad ran")
    assert acc.tolist() == [0.0, 0.0, 0.0]


def test_compiled_update_of_a_saved_tensor_makes_backward_raise():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("compiled_update_of_a_saved_tensor_checks",
                    module="test_torch_in_place_autograd")


def test_compiled_update_of_a_tensor_that_requires_grad_is_refused_with_a_fix():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("compiled_update_of_a_tensor_that_requires_grad_checks",
                    module="test_torch_in_place_autograd")
