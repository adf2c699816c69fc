"""Declaring ops, and the errors a wrong declaration or a wrong call raises."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels.kernels.simple_add import simple_add

CPU = {"cpu": xk.Kernel(["nowhere.cc"], handler="Nothing")}


def test_spec_canonicalizes_shape_and_dtype():
    assert xk.Spec([2, np.int64(3)], np.float32) == xk.Spec((2, 3), "f32")


def test_kernel_sources_resolve_against_the_declaring_file():
    op = xk.Op("t.k", inputs=[xk.Tensor("x", ("f32",))], outputs=xk.like, kernels=CPU)
    assert op.kernels["cpu"].resolved_sources()[0] == __import__("pathlib").Path(
        __file__).parent / "nowhere.cc"


def test_a_missing_source_of_an_op_declared_interactively_names_the_current_directory(
        tmp_path):
    code = ("import jax.numpy as jnp, xla_kernels as xk\n"
            "op = xk.Op('repl.op', inputs=[xk.Tensor('x', ('f32',))], outputs=xk.like,\n"
            "           kernels={'cpu': xk.Kernel(['nowhere.cc'], 'H')})\n"
            "op(jnp.ones(2))\n")
    proc = subprocess.run([sys.executable, "-"], input=code, text=True, capture_output=True,
                          cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode != 0
    assert (f"looked for {tmp_path.resolve() / 'nowhere.cc'}; relative paths are taken from "
            f"the current directory, {tmp_path.resolve()}, for an op declared in an "
            "interactive session") in proc.stderr, proc.stderr
    assert "None" not in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize("name", ["has space", "", "tab\there", "new\nline", None])
def test_bad_op_name_is_rejected(name):
    with pytest.raises(xk.OpDeclarationError, match="valid custom-call target"):
        xk.Op(name, inputs=[xk.Tensor("x", ("f32",))], outputs=xk.like, kernels=CPU)


def test_duplicate_argument_names_are_rejected():
    with pytest.raises(xk.OpDeclarationError, match=r"duplicate argument names \['x'\]"):
        xk.Op("t.dup", inputs=[xk.Tensor("x", ("f32",))], attrs=[xk.Attr("x", int)],
              outputs=xk.like, kernels=CPU)


def test_unknown_platform_is_rejected():
    with pytest.raises(xk.OpDeclarationError, match=r"unknown platforms \['rocm'\]"):
        xk.Op("t.p", inputs=[xk.Tensor("x", ("f32",))], outputs=xk.like,
              kernels={"rocm": xk.Kernel(["a.cc"], "A")})


def test_unknown_vmap_method_is_rejected():
    with pytest.raises(xk.OpDeclarationError, match="unknown vmap_method 'magic'"):
        xk.Op("t.v", inputs=[xk.Tensor("x", ("f32",))], outputs=xk.like, kernels=CPU,
              vmap_method="magic")


def test_unsupported_attribute_type_is_rejected():
    with pytest.raises(xk.OpDeclarationError, match="unsupported type"):
        xk.Attr("a", set)


def test_dtypes_given_as_a_bare_string_are_rejected_with_the_fix():
    with pytest.raises(xk.OpDeclarationError, match=re.escape('dtypes=("f32",)')):
        xk.Tensor("x", "f32")


def test_wrong_dtype_names_op_argument_and_fix():
    with pytest.raises(xk.OpTypeError) as e:
        simple_add.bind([xk.Spec((3,), "i32"), xk.Spec((3,), "i32")], {})
    assert str(e.value) == ("xla_kernels.simple_add: argument 'a': dtype i32 is not supported. "
                            "Fix: pass one of f16, bf16, f32, f64 (cast the input first).")
    assert isinstance(e.value, TypeError)


def test_mismatched_shapes_name_the_argument():
    with pytest.raises(xk.OpInputError, match=r"argument 'b': shape \(4,\) differs from a's "
                                              r"shape \(3,\)\. Fix: pass arrays of one shape"):
        simple_add.bind([xk.Spec((3,), "f32"), xk.Spec((4,), "f32")], {})


def test_mismatched_dtypes_name_the_argument():
    with pytest.raises(xk.OpInputError, match="argument 'b': dtype f16 differs from a's"):
        simple_add.bind([xk.Spec((3,), "f32"), xk.Spec((3,), "f16")], {})


def test_wrong_number_of_inputs():
    with pytest.raises(xk.OpInputError, match=r"expected 2 array inputs \(a, b\), got 1"):
        simple_add.bind([xk.Spec((3,), "f32")], {})


def test_wrong_rank():
    op = xk.Op("t.rank", inputs=[xk.Tensor("x", ("f32",), rank=(1, 2))], outputs=xk.like,
               kernels=CPU)
    with pytest.raises(xk.OpInputError, match=r"argument 'x': expected rank 1 or 2, got shape"):
        op.bind([xk.Spec((1, 2, 3), "f32")], {})


ATTR_OP = xk.Op("t.attrs", inputs=[xk.Tensor("x", ("f32",))],
                attrs=[xk.Attr("n", int), xk.Attr("eps", float, default=1e-5),
                       xk.Attr("dims", list[int], default=(1,)), xk.Attr("name", str,
                                                                         default="x")],
                outputs=lambda x, **_: xk.like(x), kernels=CPU)


def test_missing_attribute():
    with pytest.raises(xk.OpInputError, match=re.escape(
            "argument 'n': missing required attribute. Fix: pass n=<int>")):
        ATTR_OP.bind([xk.Spec((3,), "f32")], {})


def test_unknown_attribute_lists_the_known_ones():
    with pytest.raises(xk.OpInputError, match=re.escape(
            "'m': unknown attribute. Fix: known attributes: n, eps, dims, name")):
        ATTR_OP.bind([xk.Spec((3,), "f32")], {"n": 1, "m": 2})


@pytest.mark.parametrize(("attrs", "message"), [
    ({"n": 1.5}, "argument 'n': expected an integer"),
    ({"n": True}, "argument 'n': expected an integer"),
    ({"n": 2**70}, "does not fit in int64"),
    ({"n": 1, "eps": "small"}, "argument 'eps': expected a float scalar, got str"),
    ({"n": 1, "eps": 1e300}, "overflows float32"),
    ({"n": 1, "dims": 3}, "argument 'dims': expected a sequence"),
    ({"n": 1, "dims": [1, 2.5]}, "argument 'dims': expected an integer"),
    ({"n": 1, "name": 3}, "argument 'name': expected a str"),
])
def test_bad_attribute_values(attrs, message):
    with pytest.raises(xk.OpInputError, match=re.escape(message)):
        ATTR_OP.bind([xk.Spec((3,), "f32")], attrs)


def test_attribute_defaults_are_coerced_to_kernel_types():
    bound = ATTR_OP.bind([xk.Spec((3,), "f32")], {"n": 4})
    assert bound.attrs["n"].dtype == np.int64 and bound.attrs["eps"].dtype == np.float32
    assert bound.attrs["dims"].dtype == np.int64 and bound.attrs["name"] == "x"


def test_a_non_array_input_is_a_type_error():
    with pytest.raises(xk.OpTypeError, match="argument 'a': expected an array, got list"):
        simple_add.bind([[1.0], [2.0]], {})


def test_output_rule_must_return_specs():
    op = xk.Op("t.badrule", inputs=[xk.Tensor("x", ("f32",))], outputs=lambda x: 3,
               kernels=CPU)
    with pytest.raises(xk.OpDeclarationError, match="the output rule returned 3"):
        op.bind([xk.Spec((3,), "f32")], {})


def _returning(name: str, shape: tuple, **kw) -> xk.Op:
    return xk.Op(name, inputs=[xk.Tensor("x", ("f32",))],
                 outputs=lambda x: xk.Spec(shape, "f32"), kernels=CPU, **kw)


def test_a_negative_output_size_names_op_output_and_fix():
    op = _returning("t.negative", (4, -1), output_names=("out",))
    with pytest.raises(xk.OpDeclarationError) as e:
        op.bind([xk.Spec((3,), "f32")], {})
    assert str(e.value) == (
        "t.negative: output 'out': the shape rule returned shape (4, -1), whose dimension 1 "
        "is -1, a negative size. Fix: check in the shape rule the inputs and attributes this "
        "size is computed from, and raise xk.Invalid(argument, problem, fix) for values that "
        "make it negative.")


def test_a_negative_output_size_under_jit_is_the_declaration_error_not_mlirs():
    import jax
    import jax.numpy as jnp

    op = _returning("t.negative_jit", (-2,))
    with pytest.raises(xk.OpDeclarationError, match=r"t.negative_jit: output 0: .* is -2, a "
                                                     "negative size"):
        jax.jit(op)(jnp.ones(3))


@pytest.mark.parametrize("dim", [2.5, np.float32(2.0), "3", True])
def test_a_non_int_output_size_is_refused_not_truncated(dim):
    op = _returning("t.non_int", (2, dim))
    with pytest.raises(xk.OpDeclarationError) as e:
        op.bind([xk.Spec((3,), "f32")], {})
    assert str(e.value) == (
        f"t.non_int: output 0: the shape rule returned shape (2, {dim!r}), whose dimension 1 "
        f"is {dim!r} ({type(dim).__name__}), not an int. Fix: return int sizes from the shape "
        "rule (// rather than /).")


def test_a_zero_output_size_is_an_empty_array():
    op = _returning("t.empty", (0, 4))
    assert op.bind([xk.Spec((3,), "f32")], {}).outputs == (xk.Spec((0, 4), "f32"),)


def test_workspace_outputs_are_hidden_from_callers():
    op = xk.Op("t.ws", inputs=[xk.Tensor("x", ("f32",))],
               outputs=lambda x: [xk.like(x), xk.Spec((8,), "f32", workspace=True)],
               kernels=CPU)
    bound = op.bind([xk.Spec((3,), "f32")], {})
    assert len(bound.outputs) == 2 and bound.visible_outputs == (xk.Spec((3,), "f32"),)


def test_legacy_kernels_get_an_opaque_bytes_attribute():
    op = xk.Op("t.legacy", inputs=[xk.Tensor("x", ("f32",))], outputs=xk.like,
               kernels={"cpu": xk.Kernel.legacy(["l.cc"], function="Fn")})
    bound = op.bind([xk.Spec((3,), "f32")], {"opaque": b"\x01\x02"})
    assert bound.attrs["opaque"].tolist() == [1, 2]
    assert op.kernels["cpu"].handler == "XlaKernelsLegacy_Fn"


def test_a_traced_attribute_says_attributes_are_static():
    import jax

    with pytest.raises(xk.OpTypeError, match=re.escape(
            "attributes are static, but it got a traced value. Fix: pass a Python value")):
        jax.jit(lambda x, n: ATTR_OP(x, n=n))(np.ones(3, np.float32), 3)


def _documented() -> xk.Op:
    return xk.Op("t.documented", inputs=[xk.Tensor("x", ("f32", "bf16"), rank=2, doc="rows")],
                 attrs=[xk.Attr("eps", float, default=1e-6, doc="added to the variance"),
                        xk.Attr("mode", str)],
                 outputs=lambda x, *, eps, mode: xk.like(x), output_names=("y",),
                 kernels=CPU, doc="Normalizes each row of x.")


def test_help_of_an_op_shows_its_own_doc_and_signature():
    import pydoc

    text = pydoc.render_doc(_documented(), renderer=pydoc.plaintext)
    assert "t.documented(x, /, *, eps=1e-06, mode)" in text
    assert "Normalizes each row of x." in text
    assert "x: f32, bf16, rank 2  rows" in text
    assert "eps: float = 1e-06  added to the variance" in text and "mode: str" in text
    assert "Outputs: y" in text and "Kernels: cpu" in text
    assert "usable from every frontend" not in text  # not the class docstring


def test_an_ops_signature_takes_arrays_by_position_and_attributes_by_keyword():
    import inspect

    params = inspect.signature(_documented()).parameters
    assert [(p.name, p.kind.name) for p in params.values()] == [
        ("x", "POSITIONAL_ONLY"), ("eps", "KEYWORD_ONLY"), ("mode", "KEYWORD_ONLY")]
    assert params["mode"].default is inspect.Parameter.empty


def test_help_of_op_states_the_shape_rule_and_gradient_rules():
    import pydoc

    words = pydoc.render_doc(xk.Op, renderer=pydoc.plaintext).split()
    text = " ".join(w for w in words if w != "|")  # pydoc's margin of a class's lines
    assert "raise Invalid(argument, problem, fix)" in text
    assert "each input's dtype and rank against its :class:`Tensor`" in text
    assert "the rule must check itself, for every input it uses" in text
    assert "Symbolic shapes (``jax.export.symbolic_shape`` through ``xk.export``)" in text
    assert "an op with a ``vjp`` declares ``output_names``" in text
    assert "a second-order gradient needs the backward op's own ``vjp``" in text
