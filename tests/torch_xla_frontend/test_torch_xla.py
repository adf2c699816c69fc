"""torch_xla route: lowering to one typed-FFI custom call, and execution on the CPU client.

Runs in the env made by ``scripts/torch_xla_env.sh`` (torch 2.9.0, torch_xla 2.9.0,
jax/jaxlib 0.7.1 for XLA FFI 0.1 headers); skips where torch_xla is absent.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch_xla")
torch = pytest.importorskip("torch")
import torch_xla  # noqa: E402

from xla_kernels.attrs import Attr, mlir_dict  # noqa: E402
from xla_kernels.errors import OpInputError, RegistrationError  # noqa: E402
from xla_kernels.frontends import torch_xla as xt  # noqa: E402
from xla_kernels.runtime import torch_xla_registry  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
_CUSTOM_CALL = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>\S+)\s*=\s*(?P<result>.+?)\s+"
                          r"custom-call\((?P<operands>[^)]*)\),\s*(?P<rest>.*)$", re.MULTILINE)


def _attrs() -> dict:
    decl = [Attr("alpha", float), Attr("n", int), Attr("flag", bool), Attr("name", str),
            Attr("dims", list[int])]
    values = {"alpha": 0.5, "n": 3, "flag": True, "name": "x", "dims": [1, 2]}
    return {a.name: a.coerce(values[a.name], op="test") for a in decl}


def _dev():
    return torch_xla.device()


def _custom_calls(hlo: str) -> list[re.Match]:
    return list(_CUSTOM_CALL.finditer(hlo))


# --------------------------------------------------------------------------- lowering


def test_lowering_is_one_typed_ffi_custom_call():
    x = torch.zeros(2, 3, device=_dev())
    y = torch.zeros(5, dtype=torch.int32, device=_dev())
    attrs = _attrs()
    out = xt.custom_call("xk_test.lower_only", [x, y],
                         [((4, 5), torch.float32), ((7,), "i32")], attrs)
    assert [tuple(t.shape) for t in out] == [(4, 5), (7,)]
    assert [t.dtype for t in out] == [torch.float32, torch.int32]
    assert all(t.device.type == "xla" for t in out)

    hlo = xt.hlo_text(out)
    calls = _custom_calls(hlo)
    assert len(calls) == 1, hlo
    call = calls[0]
    rest = call["rest"]
    assert 'custom_call_target="xk_test.lower_only"' in rest
    assert "api_version=API_VERSION_TYPED_FFI" in rest
    config = re.search(r"backend_config=(\{.*\})", rest)[1]
    assert config == mlir_dict(attrs) == (
        '{alpha = 5.000000e-01 : f32, dims = array<i64: 1, 2>, flag = true, n = 3 : i64, '
        'name = "x"}')
    # Operands in the order given, with their shapes; a tuple result for two outputs.
    operand_shapes = re.findall(r"(\w+\[[\d,]*\])\{", call["operands"])
    assert operand_shapes == ["f32[2,3]", "s32[5]"], call["operands"]
    assert call["result"].startswith("(f32[4,5]{1,0}, s32[7]{0})"), call["result"]
    # The graph calls the computation that holds the custom call.
    assert len(re.findall(r"\bcall\(.*to_apply=%xk_xk_test_lower_only\.", hlo)) == 1, hlo


def test_graph_hash_covers_attributes_and_output_shapes():
    """torch_xla 2.9 hashes a bare CustomCall node by target and operands only."""
    x = torch.ones(3, device=_dev())
    hash_of = torch_xla._XLAC._get_graph_hash

    def lowered(attrs, shape=(3,)):
        return xt.custom_call("xk_test.hash", [x], [(shape, torch.float32)], attrs)

    base = hash_of(lowered({"n": np.int64(1)}))
    assert hash_of(lowered({"n": np.int64(1)})) == base
    assert hash_of(lowered({"n": np.int64(2)})) != base
    assert hash_of(lowered({"n": np.int64(1)}, shape=(4,))) != base
    # The bare torch_xla op, for the record: only the target and operands are hashed.
    bare = [torch_xla._XLAC._xla_custom_call([x], "xk_test.hash", [[3]], [torch.float32],
                                             False, cfg, 4, {}) for cfg in ("{}", "{n = 1}")]
    assert hash_of(bare[0]) == hash_of(bare[1])


def test_lowering_single_output_without_attrs():
    x = torch.ones(3, device=_dev())
    (out,) = xt.custom_call("xk_test.no_attrs", [x], [((3,), torch.float32)], {})
    (call,) = _custom_calls(xt.hlo_text([out]))
    assert call["result"].startswith("f32[3]{0}")
    assert "backend_config={}" in call["rest"]
    assert "api_version=API_VERSION_TYPED_FFI" in call["rest"]


def test_custom_call_rejects_cpu_tensors_and_bad_outputs():
    with pytest.raises(OpInputError, match="not an XLA device"):
        xt.custom_call("xk_test.bad", [torch.ones(3)], [((3,), torch.float32)], {})
    x = torch.ones(3, device=_dev())
    with pytest.raises(OpInputError, match="at least one output"):
        xt.custom_call("xk_test.bad", [x], [], {})
    with pytest.raises(TypeError, match=r"outputs\[0\]"):
        xt.custom_call("xk_test.bad", [x], [(3, torch.float32)], {})


# --------------------------------------------------------------------------- execution


def _ffi_include_dir() -> Path:
    jax = pytest.importorskip("jax")
    return Path(jax.ffi.include_dir())


def _build(tmp_path_factory, source: str) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("torch_xla_fixtures") / (Path(source).stem + ".so")
    cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", f"-I{_ffi_include_dir()}",
           str(FIXTURES / source), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(out))


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    lib = _build(tmp_path_factory, "add_kernels.cc")
    for name in ("xk_test_add", "xk_test_scale_add"):
        torch_xla_registry.register_handler(name, _address(lib, name), "cpu")
    return lib


def test_ffi_api_version_matches_build_headers():
    version = torch_xla_registry.ffi_api_version()
    assert version[0] == 0
    if torch_xla.__version__.startswith("2.9."):
        assert version == (0, 1)
    header = (_ffi_include_dir() / "xla/ffi/api/c_api.h").read_text()
    minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", header)[1])
    if minor != version[1]:
        wanted = torch_xla_registry.HEADERS_FOR_FFI_VERSION[version]
        pytest.fail(f"jax.ffi.include_dir() has FFI 0.{minor} headers but torch_xla runs "
                    f"0.{version[1]}: install {wanted}")


def test_execute_add(kernels):
    x = torch.tensor([1.0, 2.0, 3.0], device=_dev())
    y = torch.tensor([4.0, 5.0, 6.0], device=_dev())
    (out,) = xt.custom_call("xk_test_add", [x, y], [((3,), torch.float32)], {})
    np.testing.assert_array_equal(out.cpu().numpy(), [5.0, 7.0, 9.0])
    # Mixed with ordinary lazy ops, inside one graph.
    (out2,) = xt.custom_call("xk_test_add", [x * 2, y], [((3,), torch.float32)], {})
    np.testing.assert_array_equal((out2 + 1).cpu().numpy(), [7.0, 10.0, 13.0])


def test_execute_attributes_reach_the_kernel(kernels):
    x = torch.tensor([1.0, 2.0, 3.0], device=_dev())
    y = torch.tensor([4.0, 5.0, 6.0], device=_dev())
    (out,) = xt.custom_call("xk_test_scale_add", [x, y], [((3,), torch.float32)], _attrs())
    # alpha*x + y + n + 1000*flag + 10*dims[0] + 100*dims[1] + 10000*len(name)
    extra = 3 + 1000 + 10 + 200 + 10000
    np.testing.assert_allclose(out.cpu().numpy(), 0.5 * np.array([1, 2, 3]) + [4, 5, 6] + extra)
    # Same target and shapes, other attributes: a different executable, other numbers.
    (out2,) = xt.custom_call("xk_test_scale_add", [x, y], [((3,), torch.float32)],
                             _attrs() | {"n": np.int64(4), "flag": np.bool_(False)})
    np.testing.assert_allclose(out2.cpu().numpy(),
                               0.5 * np.array([1, 2, 3]) + [4, 5, 6] + extra + 1 - 1000)


def test_kernel_error_surfaces(kernels):
    import torch_xla.core.xla_model as xm

    # torch_xla poisons the inputs of a failed execution: use tensors of this test only.
    x = torch.ones(3, device=_dev())
    bad = _attrs() | {"dims": np.array([1, 2, 3])}
    (out,) = xt.custom_call("xk_test_scale_add", [x, x], [((3,), torch.float32)], bad)
    with pytest.raises(RuntimeError, match="dims must have 2 items"):
        out.cpu()
    # torch_xla 2.9 raises an execution's error once more at the next device sync point;
    # take it here so that it does not fail the next test.
    try:
        xm.wait_device_ops()
    except RuntimeError as e:
        assert "dims must have 2 items" in str(e)
    xm.wait_device_ops()


def test_register_is_idempotent_and_refuses_a_second_handler(kernels):
    add = _address(kernels, "xk_test_add")
    first = torch_xla_registry.register_handler("xk_test_add", add, "cpu")
    assert torch_xla_registry.register_handler("xk_test_add", add, "cpu") == first
    assert first.ffi_version == torch_xla_registry.ffi_api_version()
    with pytest.raises(RegistrationError, match="another handler"):
        torch_xla_registry.register_handler("xk_test_add", _address(kernels, "xk_test_scale_add"),
                                     "cpu")
    assert "xk_test_add" in [r.target for r in torch_xla_registry.registered_handlers()]


def test_register_refuses_a_handler_of_another_ffi_version(tmp_path_factory):
    lib = _build(tmp_path_factory, "wrong_ffi_version.cc")
    with pytest.raises(RegistrationError, match=r"API version \(0\.99\).*Fix: rebuild"):
        torch_xla_registry.register_handler("xk_test_wrong_version",
                                     _address(lib, "xk_test_wrong_version"), "cpu")


@pytest.mark.parametrize("platform", ["cuda", "CUDA", "GPU"])
def test_cuda_cannot_execute(platform):
    with pytest.raises(RegistrationError, match="cannot execute on CUDA"):
        torch_xla_registry.register_handler("xk_test_add", 1234, platform)


def test_other_pjrt_device_is_refused(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    with pytest.raises(RegistrationError, match="PJRT_DEVICE=TPU"):
        torch_xla_registry.register_handler("xk_test_other_device", 1234, "cpu")


def test_op_call_builds_registers_and_runs():
    pytest.importorskip("jax")
    from xla_kernels.kernels.simple_add import simple_add

    x = torch.tensor([1.0, 2.0, 3.0], device=_dev())
    y = torch.tensor([4.0, 5.0, 6.0], device=_dev())
    out = xt.call(simple_add, x, y)
    (call,) = _custom_calls(xt.hlo_text([out]))
    assert 'custom_call_target="xla_kernels.simple_add"' in call["rest"]
    np.testing.assert_array_equal(out.cpu().numpy(), [5.0, 7.0, 9.0])
    with pytest.raises(RegistrationError, match="cannot execute on CUDA"):
        xt.register_op(simple_add, "cuda")


def test_torch_library_op_on_xla_tensors_emits_the_custom_call():
    from xla_kernels.kernels.simple_add import simple_add

    add = xt.register_torch_xla(simple_add)
    device = torch_xla.device()
    a = torch.tensor([1.0, 2.0, 3.0], device=device)
    b = torch.tensor([4.0, 5.0, 6.0], device=device)
    out = add(a, b)
    text = xt.hlo_text([out])
    assert 'custom_call_target="xla_kernels.simple_add"' in text
    assert "api_version=API_VERSION_TYPED_FFI" in text
    assert out.cpu().tolist() == [5.0, 7.0, 9.0]


def _times(target: str, handler: str):
    import xla_kernels as xk

    return xk.Op(target, inputs=[xk.Tensor("x", ("f32",))], outputs=lambda x: xk.like(x),
                 kernels={"cpu": xk.Kernel(["../fixtures/redeclare/times.cc"], handler)})


def test_a_redeclaration_with_other_kernels_is_refused_once_torch_xla_ran_the_op():
    from xla_kernels.errors import OpDeclarationError

    op = _times("xk_tests.torch_xla_redeclared", "XkTestTimesTwo")
    x = torch.tensor([1.0, 2.0], device=_dev())
    assert xt.register_torch_xla(op)(x).cpu().tolist() == [2.0, 4.0]
    with pytest.raises(OpDeclarationError, match=r"its cpu kernel \(XkTestTimesTwo from .*\) "
                                                 "is already loaded"):
        _times("xk_tests.torch_xla_redeclared", "XkTestTimesThree")
    assert xt.register_torch_xla(op)(x).cpu().tolist() == [2.0, 4.0]


def test_a_redeclaration_before_torch_xla_ran_the_op_runs_its_own_kernel():
    first = _times("xk_tests.torch_xla_replaced", "XkTestTimesTwo")
    packet = xt.register_torch_xla(first)
    _times("xk_tests.torch_xla_replaced", "XkTestTimesThree")
    x = torch.tensor([1.0, 2.0], device=_dev())
    assert packet(x).cpu().tolist() == [3.0, 6.0]


# --------------------------------------------------------------------------- in place

def _cache_inputs():
    from xla_kernels.kernels.kv_cache import reshape_and_cache_numpy

    rng = np.random.default_rng(7)
    key = rng.standard_normal((6, 2, 8)).astype(np.float32)
    cache = np.full((3, 16, 2, 8), np.nan, np.float32)     # untouched slots stay NaN
    slots = np.array([0, 17, -1, 47, 48, 5], np.int32)     # padding and out of range
    return key, cache, slots, reshape_and_cache_numpy(key, 2 * key, cache, cache, slots)


def _same(tensor, expected) -> bool:
    return tensor.cpu().numpy().tobytes() == np.asarray(expected).tobytes()


def test_an_in_place_op_updates_the_xla_tensors_through_an_aliased_custom_call():
    from xla_kernels.kernels.kv_cache import reshape_and_cache

    key, cache, slots, want = _cache_inputs()
    k, v, kc, vc, s = (torch.from_numpy(a.copy()).to(_dev())
                       for a in (key, 2 * key, cache, cache, slots))
    assert xt.call(reshape_and_cache, k, v, kc, vc, s) is None
    (call,) = _custom_calls(xt.hlo_text([kc, vc]))
    assert "output_to_operand_aliasing={{0}: (2, {}), {1}: (3, {})}" in call["rest"]
    assert _same(kc, want[0]) and _same(vc, want[1])


def test_the_torch_operator_of_an_in_place_op_mutates_xla_tensors():
    from xla_kernels.kernels.kv_cache import reshape_and_cache

    op = xt.register_torch_xla(reshape_and_cache)
    key, cache, slots, want = _cache_inputs()
    k, v, kc, vc, s = (torch.from_numpy(a.copy()).to(_dev())
                       for a in (key, 2 * key, cache, cache, slots))
    assert op(k, v, kc, vc, s) is None
    torch_xla.sync()
    assert _same(kc, want[0]) and _same(vc, want[1])


DONATION_SCRIPT = """
import numpy as np, torch, torch_xla
from xla_kernels.frontends import torch_xla as xt
from xla_kernels.kernels.kv_cache import reshape_and_cache
dev = torch_xla.device()
key = torch.ones(4, 2, 8, device=dev)
caches = [torch.zeros(3, 16, 2, 8, device=dev) for _ in range(2)]
slots = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=dev)
torch_xla.sync()
xt.register_torch_xla(reshape_and_cache)(key, key, *caches, slots)
torch_xla.sync()
assert float(caches[0].cpu().sum()) == 64.0
"""


def test_at_sync_the_updated_caches_are_donated_and_not_copied(tmp_path):
    import os
    import sys

    import xla_kernels

    src = str(Path(xla_kernels.__file__).parents[1])
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={tmp_path}", "PJRT_DEVICE": "CPU",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", DONATION_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (optimized,) = [p for p in tmp_path.glob("*after_optimizations.txt")
                    if "reshape_and_cache" in p.read_text()]
    header, text = optimized.read_text().split("\n", 1)
    aliases = re.search(r"input_output_alias=\{ (.*?) \}", header)
    assert aliases and aliases[1].count("may-alias") == 2       # both caches, donated
    assert " copy(" not in text


def test_an_alias_must_pair_an_input_with_an_output_of_its_shape_and_dtype():
    x = torch.zeros(3, device=_dev())
    for aliases in ({0: 1}, {1: 0}, {0: 0}):
        outputs = [((3,), torch.float32)] if aliases != {0: 0} else [((4,), torch.float32)]
        with pytest.raises(OpInputError, match=r"xk_test.alias: argument 'aliases': input "
                                               r"\d cannot be output \d: an updated input "
                                               r"must be an output of its shape and dtype"):
            xt.custom_call("xk_test.alias", [x], outputs, {}, aliases=aliases)
