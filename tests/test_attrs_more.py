"""Dictionary attributes, undeclared attributes (``extra_attrs=True``), arrays of every
element type the typed FFI decodes, and declaration/handler type mismatches: each through
JAX and through the eager runtime on torch tensors, with the library's messages."""

from __future__ import annotations

import contextlib
import re

import jax
import ml_dtypes
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels.frontends.torch import torch_op
from xla_kernels.runtime.eager import AttrMismatchError, Buffer, KernelError, call_handler

SRC = "fixtures/attrs_more/attrs_more.cc"


def _out(x, **_):
    return xk.Spec((16,), "f64")


def _op(name, handler, attrs, **kwargs):
    return xk.Op(f"xk_tests.attrs_more_{name}", inputs=[xk.Tensor("x", ("f32",), rank=1)],
                 attrs=attrs, outputs=_out, kernels={"cpu": xk.Kernel([SRC], handler=handler)},
                 **kwargs)


dict_echo = _op("dict_echo", "XkDictEcho", [xk.Attr("opts", dict)])
ELEMENTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
            np.float32, np.float64)
array_sums = _op("array_sums", "XkArraySums",
                 [xk.Attr(n, list[t]) for n, t in zip("abcdefghij", ELEMENTS, strict=True)])
all_attrs = _op("all_attrs", "XkAllAttrs", [xk.Attr("n", int, default=1)], extra_attrs=True)
narrow = _op("narrow", "XkNarrow", [xk.Attr("n", int), xk.Attr("scale", float)])
narrow_scale = _op("narrow_scale", "XkNarrow", [xk.Attr("n", np.int32), xk.Attr("scale", float)])

OPTS = {"tag": "abc", "count": 3, "scale": 0.5, "flag": True, "dims": [4, 5, 6],
        "inner": {"k": -7}}
OPTS_SEEN = [3, 0.5, 1, 3, 15, -7, 6, 1]


def run_jax(op, **attrs):
    return np.asarray(jax.jit(lambda x: op(x, **attrs))(np.ones(2, np.float32)))


def run_eager(op, *, explained: bool = True, **attrs):
    """The op's handler through the eager runtime, on torch tensors (no XLA). The runtime
    raises a plain KernelError; ``explained`` runs it as a frontend would, explaining it."""
    x, out = torch.ones(2), torch.empty(16, dtype=torch.float64)
    plan = op.bind([x], attrs)
    with xk.explained_errors() if explained else contextlib.nullcontext():
        call_handler(plan.kernel("cpu").address, args=[Buffer.from_array(x)],
                     rets=[Buffer.from_array(out)], attrs=plan.eager_attrs(), op_name=op.name)
    return out.numpy()


RUNNERS = pytest.mark.parametrize("run", [run_jax, run_eager], ids=["jax", "eager"])


# ------------------------------------------------------------------------ dictionaries

@RUNNERS
def test_a_dict_attribute_reaches_the_handler_nested_dicts_too(run):
    assert run(dict_echo, opts=OPTS)[:8].tolist() == OPTS_SEEN


@RUNNERS
def test_each_dict_value_is_its_own_call(run):
    assert run(dict_echo, opts={**OPTS, "count": 9, "inner": {"k": 2, "z": "x"}})[
        [0, 5, 7]].tolist() == [9, 2, 2]


def test_a_dict_attribute_is_an_mlir_dictionary_in_the_hlo():
    text = xk.hlo_text(lambda x: dict_echo(x, opts=OPTS), np.ones(2, np.float32))
    assert ('opts = {count = 3 : i64, dims = array<i64: 4, 5, 6>, flag = true, '
            'inner = {k = -7 : i64}, scale = 5.000000e-01 : f32, tag = "abc"}') in text


def test_torch_xla_text_of_a_dict_attribute():
    plan = dict_echo.bind([xk.Spec((2,), "f32")], {"opts": {"b": [1.5], "a": {"c": "x"}}})
    assert plan.mlir_dict() == '{opts = {a = {c = "x"}, b = array<f32: 1.500000e+00>}}'


@pytest.mark.parametrize("opts, message", [
    ({"a b": 1}, r"argument 'opts': dictionary key 'a b' is not an identifier. Fix: use str "
                 r"keys"),
    ({"w": [True, False]}, r"argument 'opts.w': a list of bools: XLA's typed FFI decodes no "
                           r"bool arrays"),
    ({"w": []}, r"argument 'opts.w': an empty list has no element type. Fix: pass a typed "
                r"empty array"),
    ({"w": object()}, r"argument 'opts.w': expected a NumPy scalar .* got object"),
    ([("a", 1)], r"argument 'opts': expected a dict, got list. Fix: pass a dict"),
])
def test_dict_values_are_checked_with_the_library_message(opts, message):
    with pytest.raises(xk.OpTypeError, match="xk_tests.attrs_more_dict_echo: " + message):
        dict_echo(np.ones(2, np.float32), opts=opts)


def test_torch_op_refuses_a_dict_attribute_naming_op_attribute_and_fix():
    with pytest.raises(xk.RegistrationError, match=re.escape(
            "xk_tests.attrs_more_dict_echo: argument 'opts': cannot define a torch operator: "
            "the attribute is declared dict (ffi::Dictionary) and a torch schema cannot spell "
            "a dictionary of mixed values. Fix: run the op through JAX (or torchax/torch_xla), "
            "or declare each entry as its own typed attribute")):
        torch_op(dict_echo)


def test_the_eager_runtime_checks_a_dictionary_block():
    from xla_kernels.attr_types import FFI_DICTIONARY, EagerAttr, attr_type_of_value
    from xla_kernels.attr_types.dictionary import encode_block

    one = attr_type_of_value(np.int64(1)).eager(np.int64(1))
    block = bytearray(encode_block([("a", one), ("b", one)]))
    block[48 * 2:48 * 2 + 8], block[48 * 2 + 8:48 * 2 + 16] = b"b" + bytes(7), b"a" + bytes(7)
    x, out = torch.ones(2), torch.empty(16, dtype=torch.float64)
    bad = EagerAttr(FFI_DICTIONARY, 0, "8s", b"", bytes(block), 2)
    with pytest.raises(KernelError, match="dictionary attribute 'opts' has entries that are "
                                          "not sorted by name or repeat one"):
        call_handler(dict_echo.bind([x], {"opts": {}}).kernel("cpu").address,
                     args=[Buffer.from_array(x)], rets=[Buffer.from_array(out)],
                     attrs={"opts": bad}, op_name="op")


# ------------------------------------------------------------------------ extra attributes

@RUNNERS
def test_undeclared_attributes_reach_an_attrs_handler_by_their_value_type(run):
    seen = run(all_attrs, x=2.5, name="abcd", ws=np.array([1, 2, 3], np.int32))
    assert seen[:5].tolist() == [4, 1, 2.5, 4, 6]
    assert run(all_attrs, n=5)[:2].tolist() == [1, 5]


def test_undeclared_attributes_are_coerced_and_typed_in_the_hlo():
    text = xk.hlo_text(lambda x: all_attrs(x, x=2.5, name="ab", ws=[1, 2]),
                       np.ones(2, np.float32))
    assert 'n = 1 : i64, name = "ab", ws = array<i64: 1, 2>, x = 2.500000e+00 : f32' in text


def test_without_the_opt_in_an_unknown_attribute_names_the_fix():
    with pytest.raises(xk.OpInputError, match=re.escape(
            "xk_tests.attrs_more_dict_echo: argument 'zz': unknown attribute. Fix: known "
            "attributes: opts (or declare Op(..., extra_attrs=True) for a handler bound with "
            ".Attrs())")):
        dict_echo(np.ones(2, np.float32), opts={}, zz=1)


def test_an_undeclared_attribute_of_no_known_type_is_refused():
    with pytest.raises(xk.OpTypeError, match=r"attrs_more_all_attrs: argument 'w': expected "
                                             r"a NumPy scalar"):
        all_attrs(np.ones(2, np.float32), w=object())
    with pytest.raises(xk.OpTypeError, match=r"argument 'w': a complex value: the typed FFI"):
        all_attrs(np.ones(2, np.float32), w=1j)


def test_torch_op_of_an_extra_attrs_op_takes_its_declared_attributes():
    out = torch_op(all_attrs)(torch.ones(2), n=5)
    assert out[:3].tolist() == [1, 5, -1]


def test_an_undeclared_attribute_name_must_be_an_identifier():
    with pytest.raises(xk.OpInputError, match=re.escape(
            "xk_tests.attrs_more_all_attrs: argument 'a b': attribute names must be "
            "identifiers. Fix: use letters, digits and '_' (not a leading digit).")):
        all_attrs.bind([xk.Spec((2,), "f32")], {"a b": 1})


def test_the_shape_rule_gets_the_declared_attributes_only():
    plan = all_attrs.bind([xk.Spec((2,), "f32")], {"q": 1})
    assert sorted(plan.attrs) == ["n", "q"] and plan.outputs[0].shape == (16,)


# ------------------------------------------------------------------------ element types

ARRAYS = {"a": [-3, 1], "b": [-300, 2], "c": [-70000, 3], "d": [2 ** 40, 4], "e": [250, 5],
          "f": [65000, 6], "g": [2 ** 31, 7], "h": [2 ** 63, 8], "i": [0.5, 9], "j": [0.25, 10]}


@RUNNERS
def test_arrays_of_every_element_type_the_ffi_decodes(run):
    expected = [float(np.sum(np.array(v, t), dtype=np.float64))
                for v, t in zip(ARRAYS.values(), ELEMENTS, strict=True)]
    assert run(array_sums, **ARRAYS)[:10].tolist() == expected


@pytest.mark.parametrize("declared, message", [
    (list[bool], r"XLA's typed FFI decodes no bool arrays .*Fix: declare list\[np.uint8\]"),
    (np.float16, r"decodes no f16 attributes \(scalars or arrays\). Fix: declare float"),
    (list[ml_dtypes.bfloat16], r"decodes no bf16 attributes .*Fix: declare list\[float\]"),
    (np.complex64, r"XLA cannot carry a complex attribute .*Fix: declare the real and "
                   r"imaginary parts as two np.float32 attributes"),
    (complex, r"std::complex<double> in the handler"),
])
def test_types_the_ffi_cannot_carry_are_refused_at_declaration(declared, message):
    with pytest.raises(xk.OpDeclarationError, match=r"attribute 'w' has unsupported type .*"
                                                    + message):
        xk.Attr("w", declared)


# ------------------------------------------------------------------------ mismatches

N_MISMATCH = (r"xk_tests.attrs_more_narrow: argument 'n': declared int \(C\+\+ int64_t\), but "
              r"the kernel's handler binds int32_t, so XLA's typed FFI cannot decode it; 1 more "
              r"attribute\(s\) mismatch too. Fix: declare xk.Attr\('n', np.int32\) to match the "
              r"handler, or bind .Attr<int64_t>\(\"n\"\) in the handler. \(XLA said: .*Failed "
              r"to decode all FFI handler operands \(bad operands at: 2, 3\)")
SCALE_MISMATCH = (r"xk_tests.attrs_more_narrow_scale: argument 'scale': declared float \(C\+\+ "
                  r"float\), but the kernel's handler binds double, .*Fix: declare "
                  r"xk.Attr\('scale', np.float64\)")


def test_a_type_mismatch_from_jax_names_op_attribute_and_both_types():
    with pytest.raises(AttrMismatchError, match=N_MISMATCH) as info, xk.explained_errors():
        run_jax(narrow, n=3, scale=2.0)
    assert (info.value.attr, info.value.expected) == ("n", "int32_t")
    with pytest.raises(AttrMismatchError, match=SCALE_MISMATCH), \
            xk.explained_errors(narrow_scale):
        run_jax(narrow_scale, n=3, scale=2.0)


def test_without_the_op_a_mismatch_names_every_registered_op_it_could_be():
    twin = _op("narrow_twin", "XkNarrow", [xk.Attr("n", int), xk.Attr("scale", float)])
    run_jax(dict_echo, opts=OPTS)  # registered, but its attributes cannot explain it
    xk.ensure_registered(twin, "cpu")
    with pytest.raises(AttrMismatchError, match=r"^one of xk_tests.attrs_more_narrow_twin or "
                                                r"xk_tests.attrs_more_narrow failed|^one of "
                                                r"xk_tests.attrs_more_narrow or xk_tests."
                                                r"attrs_more_narrow_twin failed") as info, \
            xk.explained_errors():
        run_jax(narrow, n=3, scale=2.0)
    assert "attrs_more_dict_echo" not in str(info.value)


def test_a_type_mismatch_from_the_eager_runtime_names_op_attribute_and_both_types():
    with pytest.raises(AttrMismatchError, match=N_MISMATCH) as info:
        run_eager(narrow, n=3, scale=2.0)
    assert isinstance(info.value, KernelError) and info.value.code_name == "INVALID_ARGUMENT"
    with pytest.raises(AttrMismatchError, match=SCALE_MISMATCH):
        run_eager(narrow_scale, n=3, scale=2.0)


def test_the_eager_runtime_raises_and_leaves_the_explaining_to_its_caller():
    with pytest.raises(KernelError, match="Failed to decode all FFI handler operands") as info:
        run_eager(narrow, explained=False, n=3, scale=2.0)
    assert not isinstance(info.value, AttrMismatchError)
    assert isinstance(xk.explain(info.value), AttrMismatchError)


def test_a_type_mismatch_from_torch_op_names_the_attribute():
    with pytest.raises(AttrMismatchError, match=SCALE_MISMATCH):
        torch_op(narrow_scale)(torch.ones(2), n=3, scale=2.0)


def test_matching_declarations_run():
    assert run_eager(narrow_scale.__class__(  # the same handler, declared as it binds
        "xk_tests.attrs_more_narrow_ok", inputs=narrow.inputs, outputs=_out,
        attrs=[xk.Attr("n", np.int32), xk.Attr("scale", np.float64)],
        kernels={"cpu": xk.Kernel([SRC], handler="XkNarrow")}), n=3, scale=2.0)[:2].tolist() \
        == [3, 2.0]
