"""The torch frontend: torch.ops operators derived from an op's declaration (CPU here).

Covers the schema and namespace rules, eager results against NumPy, attributes of every
type reaching a kernel intact, workspace outputs, poisoned outputs, opcheck,
torch.compile, fake/meta tensors and the library's own error messages.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import xla_kernels as xk
from xla_kernels import dtypes
from xla_kernels.frontends.torch import attrs_for_torch, call, qualified_name, schema, torch_op
from xla_kernels.frontends.torch import eager as torch_eager
from xla_kernels.kernels.simple_add import simple_add

FIXTURE = Path(__file__).parent / "fixtures" / "torch_attrs" / "torch_attrs.cc"
SIZES = [1, 2, 3, 7, 31, 127, 1021, 4099]
TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
                "f64": torch.float64}


def _attrs_rule(x: xk.Spec, *, i, i32, u8, flag, f, f64, s, list_i, list_f, blob):
    n_ints = 5 + len(s.encode()) + 1 + len(list_i) + 1 + len(blob)
    return (xk.Spec((n_ints,), "i64"), xk.Spec((3 + len(list_f),), "f64"), xk.like(x),
            xk.Spec(x.shape, "f32", workspace=True))


torch_attrs = xk.Op(
    "xk_tests.torch_attrs",
    inputs=[xk.Tensor("x", dtypes=("f32",))],
    attrs=[xk.Attr("i", int, default=7), xk.Attr("i32", np.int32),
           xk.Attr("u8", np.uint8, default=255), xk.Attr("flag", bool, default=False),
           xk.Attr("f", float, default=0.5), xk.Attr("f64", np.float64, default=float("inf")),
           xk.Attr("s", str, default="hi"), xk.Attr("list_i", list[int], default=(1, -2)),
           xk.Attr("list_f", list[float], default=()),
           xk.Attr("blob", bytes, default=b"\x00\xff")],
    outputs=_attrs_rule,
    kernels={"cpu": xk.Kernel([str(FIXTURE)], handler="XkTestTorchAttrs")},
    doc="Echoes its attributes (test op).",
)

writes_nothing = xk.Op(
    "xk_tests.writes_nothing",
    inputs=[xk.Tensor("x", dtypes=("f32",))],
    outputs=lambda x: xk.like(x),
    kernels={"cpu": xk.Kernel([str(FIXTURE)], handler="XkTestWritesNothing")},
)

cuda_only = xk.Op(
    "xk_tests.cuda_only_add",
    inputs=[xk.Tensor("a", dtypes=("f32",)), xk.Tensor("b", dtypes=("f32",))],
    outputs=lambda a, b: xk.like(a),
    kernels={"cuda": xk.Kernel(["nowhere.cu"], handler="Nowhere")},
)


def expected_ints(i, i32, u8, flag, s, list_i, blob):
    raw = s.encode()
    return [i, i32, u8, int(flag), len(raw), *raw, len(list_i), *list_i, len(blob), *blob]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as NumPy, bf16 included (through its bits)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# ------------------------------------------------------------------------ schema


def test_namespace_and_name_derive_from_the_op_name():
    assert qualified_name(simple_add) == "xla_kernels::simple_add"
    assert qualified_name(simple_add, namespace="mine") == "mine::simple_add"
    nested = xk.Op("my_lib.sub.add", inputs=[xk.Tensor("x", ("f32",))],
                   outputs=lambda x: x, kernels={"cpu": xk.Kernel(["k.cc"], "K")})
    bare = xk.Op("lonely", inputs=[xk.Tensor("x", ("f32",))],
                 outputs=lambda x: x, kernels={"cpu": xk.Kernel(["k.cc"], "K")})
    colons = xk.Op("ns.v1:add", inputs=[xk.Tensor("x", ("f32",))],
                   outputs=lambda x: x, kernels={"cpu": xk.Kernel(["k.cc"], "K")})
    assert qualified_name(nested) == "my_lib_sub::add"
    assert qualified_name(bare) == "xk_user::lonely"
    assert qualified_name(colons) == "ns::v1_add"


def test_schema_of_simple_add():
    assert schema(simple_add) == "(Tensor a, Tensor b) -> Tensor"
    packet = torch_op(simple_add)
    assert packet is torch.ops.xla_kernels.simple_add
    assert str(packet.default._schema) == "xla_kernels::simple_add(Tensor a, Tensor b) -> Tensor"


def test_schema_maps_every_attribute_type():
    assert schema(torch_attrs) == (
        '(Tensor x, *, int i=7, int? i32=None, int u8=255, bool flag=False, float f=0.5, '
        'float? f64=None, str s="hi", int[] list_i=[1, -2], float[] list_f=[], '
        "int[] blob=[0, 255]) -> (Tensor, Tensor, Tensor)")
    parsed = torch_op(torch_attrs).default._schema
    assert [a.name for a in parsed.arguments] == ["x", *(a.name for a in torch_attrs.attrs)]
    assert [a.kwarg_only for a in parsed.arguments] == [False] + [True] * len(torch_attrs.attrs)
    assert len(parsed.returns) == 3  # the workspace output is not returned


def test_schema_spells_defaults_or_falls_back_to_optional():
    op = xk.Op("xk_tests.defaults", inputs=[xk.Tensor("x", ("f32",))],
               attrs=[xk.Attr("nan", float, default=float("nan")),
                      xk.Attr("quote", str, default='say "hi"'),
                      xk.Attr("big", np.uint64, default=2**64 - 1),
                      xk.Attr("small", np.int8, default=-128),
                      xk.Attr("tiny", float, default=1e-6),
                      xk.Attr("on", np.bool_, default=True),
                      xk.Attr("i32s", list[np.int32], default=[3]),
                      xk.Attr("f64s", list[np.float64], default=[0.1, 2.0])],
               outputs=lambda x, **_: x, kernels={"cpu": xk.Kernel(["k.cc"], "K")})
    assert schema(op) == (
        "(Tensor x, *, float? nan=None, str? quote=None, int? big=None, int small=-128, "
        "float tiny=1e-06, bool on=True, int[] i32s=[3], float[] f64s=[0.1, 2.0]) -> Tensor")
    torch._C.parse_schema("xk_tests::defaults" + schema(op))  # torch accepts it


def test_return_count_is_probed_or_given():
    picky = xk.Op("xk_tests.picky", inputs=[xk.Tensor("x", ("f32",))],
                  outputs=lambda x: _reject(x), kernels={"cpu": xk.Kernel(["k.cc"], "K")})
    with pytest.raises(xk.RegistrationError, match="num_outputs"):
        schema(picky)
    assert schema(picky, num_outputs=2) == "(Tensor x) -> (Tensor, Tensor)"
    ranked = xk.Op("xk_tests.ranked", inputs=[xk.Tensor("m", ("f32",), rank=2),
                                              xk.Tensor("v", ("f16",), rank=1)],
                   outputs=lambda m, v: _matvec(m, v),
                   kernels={"cpu": xk.Kernel(["k.cc"], "K")})
    assert schema(ranked) == "(Tensor m, Tensor v) -> Tensor"


def _reject(x: xk.Spec) -> xk.Spec:
    raise xk.Invalid("x", "never")


def _matvec(m: xk.Spec, v: xk.Spec) -> xk.Spec:
    if m.shape[1] != v.shape[0]:
        raise xk.Invalid("v", "size mismatch")
    return xk.Spec((m.shape[0],), "f32")


def test_torch_op_is_idempotent_and_cached():
    first = torch_op(simple_add)
    assert torch_op(simple_add) is first
    assert torch_op(simple_add, namespace="xk_tests_other") is torch.ops.xk_tests_other.simple_add
    assert torch_op(simple_add) is first


def test_a_name_torch_already_has_is_refused_with_a_fix():
    torch.library.define("xk_tests_taken::simple_add", "(Tensor a) -> Tensor")
    with pytest.raises(xk.RegistrationError, match="pass namespace="):
        torch_op(simple_add, namespace="xk_tests_taken")


# ------------------------------------------------------------------------ eager results


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize("size", SIZES)
def test_eager_cpu_matches_numpy(rng, dtype, size):
    np_dtype = dtypes.to_numpy(dtype)
    a = rng.standard_normal(size).astype(np_dtype)
    b = rng.standard_normal(size).astype(np_dtype)
    out = torch.ops.xla_kernels.simple_add(from_numpy(a), from_numpy(b))
    assert out.dtype == TORCH_DTYPES[dtype] and out.shape == (size,)
    want = (a.astype(np.float64) + b.astype(np.float64)).astype(np_dtype)
    np.testing.assert_array_equal(to_numpy(out).astype(np.float64), want.astype(np.float64))


def test_eager_keeps_shapes_and_handles_empty_tensors(rng):
    a = torch.from_numpy(rng.standard_normal((3, 5, 7)).astype(np.float32))
    torch.testing.assert_close(call(simple_add, a, a), a + a, rtol=0, atol=0)
    empty = torch.empty(0, 4)
    assert call(simple_add, empty, empty).shape == (0, 4)
    scalar = torch.tensor(1.5)
    assert call(simple_add, scalar, scalar).item() == 3.0


def test_non_contiguous_inputs(rng):
    base = torch.from_numpy(rng.standard_normal((6, 10)).astype(np.float32))
    other = torch.from_numpy(rng.standard_normal((10, 6)).astype(np.float32))
    cases = [
        (base.t(), other),                                   # transposed
        (base[:, ::3], other.t()[:, ::3]),                   # strided
        (base[2:, 1:], base[:-2, :-1]),                      # storage offsets
        (torch.tensor([1.0, 2.0]).expand(4, 2), base[:4, :2]),  # stride 0
    ]
    for a, b in cases:
        assert not (a.is_contiguous() and b.is_contiguous())
        out = torch.ops.xla_kernels.simple_add(a, b)
        torch.testing.assert_close(out, a + b, rtol=0, atol=0)
        assert out.is_contiguous()


def test_results_are_fresh_and_inputs_untouched(rng):
    a = torch.from_numpy(rng.standard_normal(9).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(9).astype(np.float32))
    a0, b0 = a.clone(), b.clone()
    out1 = simple_add_torch(a, b)
    out2 = simple_add_torch(a, b)
    assert out1.data_ptr() != out2.data_ptr()
    assert torch.equal(a, a0) and torch.equal(b, b0)


def simple_add_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch_op(simple_add)(a, b)


def test_poisoned_outputs_show_what_a_kernel_does_not_write(monkeypatch, rng):
    monkeypatch.setattr(torch_eager, "POISON_OUTPUTS", True)
    x = torch.ones(5)
    assert torch.isnan(call(writes_nothing, x)).all()
    for size in (1, 7, 1021):
        a = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
        out = call(simple_add, a, a)
        assert not torch.isnan(out).any()
        torch.testing.assert_close(out, a + a, rtol=0, atol=0)
    ints, reals, y = call(torch_attrs, torch.ones(3), i32=1)
    assert not torch.isnan(reals).any() and not torch.isnan(y).any()
    assert ints.tolist() == expected_ints(7, 1, 255, False, "hi", [1, -2], b"\x00\xff")


# ------------------------------------------------------------------------ attributes


def test_every_attribute_type_reaches_the_kernel_intact(rng):
    x = torch.from_numpy(rng.standard_normal(11).astype(np.float32))
    values = dict(i=-(2**63), i32=2**31 - 1, u8=0, flag=True, f=1.5, f64=1e300,
                  s="héllo ☃ \"q\"", list_i=[2**62, -1, 0], list_f=[0.25, -3.5, 1e-3],
                  blob=b"\x00\x01\xfe\xff")
    ints, reals, y = call(torch_attrs, x, **values)
    assert ints.dtype == torch.int64 and reals.dtype == torch.float64
    assert ints.tolist() == expected_ints(values["i"], values["i32"], values["u8"], True,
                                          values["s"], values["list_i"], values["blob"])
    want_reals = [1.5, 1e300, 3.0, *np.float32(values["list_f"]).astype(np.float64)]
    assert reals.tolist() == want_reals
    torch.testing.assert_close(y, x * 2 + 1.5, rtol=0, atol=0)

    # The same through torch.ops directly: bytes travel as a list of ints.
    direct = torch.ops.xk_tests.torch_attrs(x, **attrs_for_torch(torch_attrs, values))
    for got, want in zip(direct, (ints, reals, y), strict=True):
        assert torch.equal(got, want)


def test_declared_defaults_reach_the_kernel():
    ints, reals, y = torch.ops.xk_tests.torch_attrs(torch.zeros(2), i32=-5)
    assert ints.tolist() == expected_ints(7, -5, 255, False, "hi", [1, -2], b"\x00\xff")
    assert reals.tolist() == [0.5, float("inf"), 0.0]
    assert y.tolist() == [0.5, 0.5]


def test_attrs_for_torch_only_converts_bytes():
    assert attrs_for_torch(torch_attrs, {"blob": b"\x01", "s": "x", "i": 3}) == {
        "blob": [1], "s": "x", "i": 3}


# ------------------------------------------------------------------------ errors


def test_wrong_dtype_is_the_library_error():
    a = torch.ones(3, dtype=torch.int32)
    with pytest.raises(xk.OpTypeError) as info:
        torch.ops.xla_kernels.simple_add(a, a)
    assert str(info.value) == ("xla_kernels.simple_add: argument 'a': dtype i32 is not "
                               "supported. Fix: pass one of f16, bf16, f32, f64 (cast the "
                               "input first).")


def test_mismatched_shapes_is_the_library_error():
    with pytest.raises(xk.OpInputError) as info:
        torch.ops.xla_kernels.simple_add(torch.ones(3), torch.ones(4))
    assert str(info.value) == ("xla_kernels.simple_add: argument 'b': shape (4,) differs from "
                               "a's shape (3,). Fix: pass arrays of one shape (broadcast them "
                               "first).")
    with pytest.raises(xk.OpInputError, match="dtype f64 differs from a's dtype f32"):
        call(simple_add, torch.ones(3), torch.ones(3, dtype=torch.float64))


def test_missing_attribute_is_the_library_error():
    with pytest.raises(xk.OpInputError) as info:
        torch.ops.xk_tests.torch_attrs(torch.ones(2))
    assert str(info.value) == ("xk_tests.torch_attrs: argument 'i32': missing required "
                               "attribute. Fix: pass i32=<int32>.")
    with pytest.raises(xk.OpInputError, match="argument 'i32': missing required"):
        torch.ops.xk_tests.torch_attrs(torch.ones(2), i32=None)


def test_bad_attribute_values_are_library_errors():
    x = torch.ones(2)
    with pytest.raises(xk.OpInputError, match="argument 'u8': 256 does not fit in uint8"):
        call(torch_attrs, x, i32=0, u8=256)
    with pytest.raises(xk.OpInputError, match="argument 'i32': 2147483648 does not fit"):
        call(torch_attrs, x, i32=2**31)
    with pytest.raises(xk.OpInputError, match=r"argument 'blob': expected bytes \(a list"):
        torch.ops.xk_tests.torch_attrs(x, i32=0, blob=[1, 300])
    with pytest.raises(xk.OpInputError, match="argument 'nope': unknown attribute"):
        call(torch_attrs, x, i32=0, nope=1)


def test_no_kernel_for_the_platform_is_a_platform_error():
    with pytest.raises(xk.PlatformError, match=r"xk_tests.cuda_only_add: no kernel for "
                                               r"platform 'cpu' \(it has kernels for cuda\)"):
        call(cuda_only, torch.ones(2), torch.ones(2))


def test_errors_under_fake_tensors_are_the_library_errors():
    with FakeTensorMode(), pytest.raises(xk.OpInputError, match=r"shape \(4,\) differs"):
        torch.ops.xla_kernels.simple_add(torch.empty(3), torch.empty(4))


# ------------------------------------------------------------------------ fake, opcheck, compile


def test_fake_and_meta_shapes_come_from_the_declaration():
    with FakeTensorMode():
        out = torch.ops.xla_kernels.simple_add(torch.empty(2, 3, dtype=torch.bfloat16),
                                               torch.empty(2, 3, dtype=torch.bfloat16))
        assert out.shape == (2, 3) and out.dtype == torch.bfloat16
        ints, reals, y = torch.ops.xk_tests.torch_attrs(torch.empty(4, 5), i32=0, s="abc",
                                                        list_f=[1.0, 2.0])
        assert ints.shape == (5 + 3 + 1 + 2 + 1 + 2,) and ints.dtype == torch.int64
        assert reals.shape == (5,) and reals.dtype == torch.float64
        assert y.shape == (4, 5) and y.dtype == torch.float32
    meta = torch.ops.xla_kernels.simple_add(torch.empty(7, device="meta"),
                                            torch.empty(7, device="meta"))
    assert meta.device.type == "meta" and meta.shape == (7,)


def test_opcheck_passes(rng):
    a = torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32))
    torch.library.opcheck(torch.ops.xla_kernels.simple_add.default, (a, b))
    torch.library.opcheck(torch.ops.xla_kernels.simple_add.default, (a.half(), b.half()))
    torch.library.opcheck(torch.ops.xk_tests.torch_attrs.default, (a,),
                          {"i32": 3, "s": "xy", "list_f": [1.0], "blob": [7, 8]})


# torch.compile runs in a fresh interpreter: once torchax is imported (other test files do),
# torch 2.13 CPU builds take torchax's "jax" device for the accelerator and Dynamo fails
# asking it for a stream, whatever the graph holds.


def compile_aot_eager_checks() -> None:
    """torch.compile(fullgraph=True, backend="aot_eager"): attributes of every kind, a
    multi-output op and simple_add in one graph, two input sizes."""
    rng = np.random.default_rng(0)
    torch_op(torch_attrs), torch_op(simple_add)

    def f(x, y):
        ints, _, z = torch.ops.xk_tests.torch_attrs(x, i32=2, s="ok", blob=[1, 2, 3])
        return torch.ops.xla_kernels.simple_add(z, y) * 2, ints

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for size in (5, 8):
        x = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
        y = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
        got, ints = compiled(x, y)
        want, want_ints = f(x, y)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.equal(ints, want_ints)


def compile_inductor_checks() -> None:
    """torch.compile(fullgraph=True) with the default backend, and no graph break."""
    rng = np.random.default_rng(1)
    add = torch_op(simple_add)
    compiled = torch.compile(lambda a, b: add(a * 2, b).sin() + 1, fullgraph=True)
    a = torch.from_numpy(rng.standard_normal(33).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(33).astype(np.float32))
    torch.testing.assert_close(compiled(a, b), (a * 2 + b).sin() + 1)
    explanation = torch._dynamo.explain(lambda a, b: add(a, b) + 1)(a, b)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def in_fresh_python(check: str, module: str = "test_torch_frontend") -> None:
    """Run ``module.check()`` in a new interpreter: torch.compile breaks in a process that
    imported torchax (it makes "jax" torch's accelerator)."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"import {module} as t\nt.{check}()\nprint('CHECKS PASSED')\n")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0 and "CHECKS PASSED" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_torch_compile_fullgraph_aot_eager():
    in_fresh_python("compile_aot_eager_checks")


@pytest.mark.slow
def test_torch_compile_fullgraph_inductor():
    in_fresh_python("compile_inductor_checks")


def test_every_shipped_op_is_a_torch_op_out_of_the_box():
    import importlib
    import pkgutil

    import xla_kernels.kernels as shipped

    for module in pkgutil.iter_modules(shipped.__path__):
        importlib.import_module(f"xla_kernels.kernels.{module.name}")
    ops = [op for name, op in xk.declared_ops().items() if name.startswith("xla_kernels.")]
    assert {op.name for op in ops} >= {"xla_kernels.simple_add", "xla_kernels.paged_attention"}
    for op in ops:
        packet = torch_op(op)
        assert packet is getattr(torch.ops.xla_kernels, op.name.rpartition(".")[2])
