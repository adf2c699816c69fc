"""Attribute types are codecs: each type's coercion, C++ type, MLIR text, torch schema,
eager encoding and hash come from one class. ``tuple[int, int]`` (attr_types/int_tuple.py)
is the proof that a type added in one file works in every frontend."""

from __future__ import annotations

import typing

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
    (dict, {"b": "x", "a": 1}, '{a = 1 : i64, b = "x"}'),
    (dict, {"o": {"z": [1.5], "y": np.uint8(7)}, "e": {}},
     "{e = {}, o = {y = 7 : ui8, z = array<f32: 1.500000e+00>}}"),
    (dict[str, typing.Any], {"f": np.float64(0.1)}, "{f = 1.000000e-01 : f64}"),
    (dict[str, np.int32], {"n": 3}, "{n = 3 : i32}"),
    (dict[str, float], {"n": 3}, "{n = 3.000000e+00 : f32}"),
    (dict[str, dict[str, np.uint8]], {"o": {"y": 7}}, "{o = {y = 7 : ui8}}"),
    (list[np.int8], [-1, 2], "array<i8: -1, 2>"),
    (list[np.uint64], [2 ** 64 - 1], "dense<[18446744073709551615]> : tensor<1xui64>"),
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
                                                    r"<class 'set'>. Fix: use int, float, bool, "
                                                    r"str, bytes, dict"):
        xk.Attr("m", set)


@pytest.mark.parametrize("value, cpp", [
    (True, "bool"), (3, "int64_t"), (0.5, "float"), ("s", "std::string_view"),
    ([1, 2], "ffi::Span<const int64_t>"), ((1, 2.5), "ffi::Span<const float>"),
    (b"x", "ffi::Span<const uint8_t>"), ({"a": 1}, "ffi::Dictionary"),
    (np.int16(1), "int16_t"), (np.arange(2, dtype=np.uint32), "ffi::Span<const uint32_t>"),
])
def test_raw_python_values_get_the_codec_of_their_declared_type(value, cpp):
    from xla_kernels.attr_types import attr_type_of_value

    assert attr_type_of_value(value, raw=True).cpp_type == cpp


def test_raw_python_values_need_the_opt_in():
    from xla_kernels.attr_types import attr_type_of_value

    with pytest.raises(xk.OpTypeError, match=r"op: argument 'n': expected a NumPy scalar .* "
                                             r"got int 3. Fix: coerce it"):
        attr_type_of_value(3, op="op", name="n")


def test_a_dict_codec_has_no_torch_schema_type_and_says_why():
    codec = attr_type(dict)
    assert codec.cpp_type == "ffi::Dictionary" and codec.torch_schema_type is None
    assert "a torch schema cannot spell a dictionary" in codec.torch_refusal


def test_a_dict_declared_with_an_entry_type_coerces_every_entry_to_it():
    opts = xk.Attr("opts", dict[str, float]).coerce({"a": 1, "b": np.float64(0.5)}, op="my.op")
    assert opts == {"a": np.float32(1.0), "b": np.float32(0.5)}
    assert all(type(v) is np.float32 for v in opts.values())


def test_a_dict_entry_of_another_type_names_op_entry_and_fix():
    attr = xk.Attr("opts", dict[str, int])
    with pytest.raises(xk.OpTypeError) as e:
        attr.coerce({"n": 2, "scale": 0.5}, op="my.op")
    assert str(e.value) == ("my.op: argument 'opts.scale': expected an integer (int), got 0.5 "
                            "(its dictionary is declared dict[str, int]). Fix: pass int values, "
                            "or declare dict[str, Any] for entries of mixed types.")


def test_a_dict_entry_type_that_is_no_attribute_type_is_refused_at_declaration():
    with pytest.raises(xk.OpDeclarationError) as e:
        xk.Attr("opts", dict[str, set])
    assert str(e.value).startswith(
        "attribute 'opts' has unsupported type dict[str, set]: its entry type <class 'set'> is "
        "not an attribute type. Fix: declare dict[str, T] with T one of int, float, bool, str")
    assert str(e.value).endswith("or dict[str, Any] for entries of mixed types.")
