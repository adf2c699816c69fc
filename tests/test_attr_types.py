"""Attribute types are codecs: each type's coercion, C++ type, MLIR text, torch schema,
eager encoding and hash come from one class. ``tuple[int, int]`` (attr_types/int_tuple.py)
is the proof that a type added in one file works in every frontend."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels.attr_types import IntTuple, attr_type
from xla_kernels.frontends.torch import call, schema, torch_op

ECHO = "fixtures/attrs_echo/attrs_echo.cc"
BASE = dict(i=1, i32=2, f=0.5, d=0.25, b=False, s="", floats=[], raw=b"")

echo_pair = xk.Op(
    "xk_tests.attrs_echo_pair",
    inputs=[xk.Tensor("x", dtypes=("f32",), rank=1)],
    attrs=[xk.Attr("i", int), xk.Attr("i32", np.int32), xk.Attr("f", float),
           xk.Attr("d", np.float64), xk.Attr("b", bool), xk.Attr("s", str),
           xk.Attr("ints", tuple[int, int], default=(7, -8)), xk.Attr("floats", list[float]),
           xk.Attr("raw", bytes)],
    outputs=lambda x, **_: xk.Spec((32,), "f64"),
    kernels={"cpu": xk.Kernel([ECHO], handler="AttrsEcho")},
)


def echoed_ints(out) -> list[int]:
    out = np.asarray(out)
    return [int(out[10]), int(out[11]), int(out[12])]


def test_the_new_type_is_found_for_its_declaration():
    codec = attr_type(tuple[int, int])
    assert isinstance(codec, IntTuple) and codec.length == 2
    assert codec.cpp_type == "ffi::Span<const int64_t>"


def test_the_new_type_reaches_the_kernel_through_jax():
    out = jax.jit(lambda x: echo_pair(x, ints=(3, -4), **BASE))(np.ones(2, np.float32))
    assert echoed_ints(out) == [2, 3, -4]


def test_the_new_type_default_reaches_the_kernel_through_jax():
    assert echoed_ints(echo_pair(np.ones(2, np.float32), **BASE)) == [2, 7, -8]


def test_the_new_type_has_a_torch_schema_and_runs_eagerly():
    assert "int[2] ints=[7, -8]" in schema(echo_pair)
    out = call(echo_pair, torch.ones(2), ints=(5, 6), **BASE)
    assert echoed_ints(out) == [2, 5, 6]
    assert echoed_ints(torch_op(echo_pair)(torch.ones(2), **{**BASE, "raw": []})) == [2, 7, -8]


def test_the_new_type_is_in_the_hlo_as_an_array():
    text = xk.hlo_text(lambda x: echo_pair(x, ints=(3, 4), **BASE), np.ones(2, np.float32))
    assert "ints = array<i64: 3, 4>" in text


def test_the_new_type_checks_its_length_with_the_library_message():
    with pytest.raises(xk.OpInputError, match=r"xk_tests.attrs_echo_pair: argument 'ints': "
                                              r"expected 2 ints, got 3. Fix: pass a tuple "
                                              r"of 2 ints"):
        echo_pair(np.ones(2, np.float32), ints=(1, 2, 3), **BASE)


@pytest.mark.parametrize("declared, value, text", [
    (float, float("inf"), "0x7F800000 : f32"),
    (np.float64, 0.1, "1.000000e-01 : f64"),
    (float, 128 ** -0.5, "8.8388346e-02 : f32"),
    (list[np.uint32], [1, 2], "dense<[1, 2]> : tensor<2xui32>"),
    (bytes, b"", "dense<> : tensor<0xui8>"),
    (str, 'a"b', '"a\\22b"'),
])
def test_mlir_text_round_trips_exactly(declared, value, text):
    from jax._src.interpreters.mlir import make_ir_context
    from jax._src.lib.mlir import ir

    codec = attr_type(declared)
    assert codec.mlir_text(codec.coerce(value, op="op", name="a")) == text
    with make_ir_context(), ir.Location.unknown():
        ir.Attribute.parse(text)  # XLA's parser must take what the codec writes


def test_an_unsupported_declared_type_names_what_is_supported():
    with pytest.raises(xk.OpDeclarationError, match=r"attribute 'm' has unsupported type "
                                                    r"<class 'dict'>. Fix: use int, float"):
        xk.Attr("m", dict)
