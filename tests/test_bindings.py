"""A handler whose binding disagrees with its op's declaration: the first call, in plain
JAX and in torch eager, names the op, the item and both sides (docs/tutorial.md, section 3).

The handlers are in fixtures/bindings/bindings.cc, one disagreement each.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels.runtime.eager import BindingMismatchError


def _op(name: str, handler: str, dtype: str = "f32", attrs: tuple = ()) -> xk.Op:
    return xk.Op(f"xk_tests.bindings_{name}", inputs=[xk.Tensor("x", (dtype,))],
                 outputs=lambda x, **_: xk.like(x), attrs=list(attrs),
                 kernels={"cpu": xk.Kernel(["fixtures/bindings/bindings.cc"], handler)})


agrees = _op("agrees", "BindCopy")
two_args = _op("two_args", "BindTwoArgs")
two_results = _op("two_results", "BindTwoRets")
f16_for_f32 = _op("f16_for_f32", "BindF32", dtype="f16")
int_for_float = _op("int_for_float", "BindScale", attrs=[xk.Attr("scale", int)])
other_name = _op("other_name", "BindScale", attrs=[xk.Attr("gain", float)])

CASES = {
    # op, the call's attributes, the input dtype, what the message must say
    "argument count": (two_args, {}, np.float32, [
        "xk_tests.bindings_two_args: its cpu handler BindTwoArgs does not bind what the "
        "declaration passes: the number of arguments: the declaration passes 1 input "
        "buffer(s) ('x'), but the handler binds 2"]),
    "result count": (two_results, {}, np.float32, [
        "xk_tests.bindings_two_results: its cpu handler BindTwoRets",
        "the number of results: the declaration passes 1 result buffer(s), but the handler "
        "binds 2"]),
    "buffer dtype": (f16_for_f32, {}, np.float16, [
        "xk_tests.bindings_f16_for_f32: its cpu handler BindF32",
        "argument 0 'x': the declaration passes f16 (declared dtypes: f16), but the handler "
        "binds ffi::Buffer<ffi::F32> (f32)",
        "result 0: the declaration passes f16"]),
    "attribute type": (int_for_float, {"scale": 2}, np.float32, [
        "xk_tests.bindings_int_for_float: its cpu handler BindScale",
        "attribute 'scale': the declaration passes int (int64_t), but the handler binds "
        "float", "declare xk.Attr('scale', float)"]),
    "attribute name": (other_name, {"gain": 2.0}, np.float32, [
        "xk_tests.bindings_other_name: its cpu handler BindScale",
        "attribute 'gain': the declaration passes an attribute named 'gain' where the "
        "handler binds one named 'scale'"]),
}


@pytest.mark.parametrize("case", CASES)
def test_plain_jax_names_the_op_the_item_and_both_sides(case):
    op, attrs, dtype, said = CASES[case]
    x = jax.device_put(jnp.ones(4, dtype), jax.devices("cpu")[0])  # the ops run on the CPU
    with pytest.raises(jax.errors.JaxRuntimeError) as e:
        jax.block_until_ready(jax.jit(lambda x: op(x, **attrs))(x))
    for text in said:
        assert text in str(e.value)
    assert "XLA's typed FFI said: [execute] " in str(e.value)


@pytest.mark.parametrize("case", ["argument count", "result count", "buffer dtype",
                                  "attribute name"])
def test_torch_eager_names_the_op_the_item_and_both_sides(case):
    torch = pytest.importorskip("torch")
    from xla_kernels.frontends.torch import torch_op

    op, attrs, dtype, said = CASES[case]
    with pytest.raises(BindingMismatchError) as e:
        torch_op(op)(torch.ones(4, dtype=getattr(torch, np.dtype(dtype).name)), **attrs)
    for text in said:  # the eager runtime does not say which platform's handler failed
        assert re.sub(r"its cpu handler \w+", "its handler", text) in str(e.value)


def test_an_agreeing_handler_runs_behind_the_guard():
    x = jax.device_put(jnp.arange(4.0), jax.devices("cpu")[0])
    np.testing.assert_array_equal(jax.jit(agrees)(x), np.arange(4.0))

