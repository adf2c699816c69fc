"""The native (C++) eager torch kernels: same results and errors as the Python kernels.

Each eager result through ``torch.ops`` (the native kernel on this machine, where torch's
headers are installed) is compared with the Python kernel (``torch_eager._run``) on
the same inputs, and errors must be the library's own exceptions and messages.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import xla_kernels as xk
from ops import attrs_echo
from xla_kernels.frontends.torch import attrs_for_torch, call, torch_op
from xla_kernels.frontends.torch import eager as torch_eager
from xla_kernels.frontends.torch import native as torch_native
from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
from xla_kernels.kernels.paged_attention.testing import TOLERANCES, make_inputs, rel_error
from xla_kernels.kernels.simple_add import simple_add
from xla_kernels.runtime.eager import KernelError

pytestmark = pytest.mark.skipif(os.environ.get("XLA_KERNELS_TORCH_NATIVE", "1") == "0",
                                reason="XLA_KERNELS_TORCH_NATIVE=0 forces the Python kernels")

PA_ARGS = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")

# paged_attention's CPU handler behind a shape rule that accepts any layout string, so
# the handler itself rejects a bad one: a kernel failure through the native path.
loose_attention = xk.Op(
    "xk_tests.native_loose_attention",
    inputs=[xk.Tensor(n, dtypes=("f32", "i32")) for n in PA_ARGS],
    attrs=[xk.Attr("scale", float), xk.Attr("softcap", float, default=0.0),
           xk.Attr("sliding_window", int, default=0), xk.Attr("layout", str, default="vllm"),
           xk.Attr("k_scale", float, default=1.0), xk.Attr("v_scale", float, default=1.0)],
    outputs=lambda query, *_, **__: (xk.like(query), xk.Spec((1,), "f32", workspace=True)),
    kernels={"cpu": paged_attention.kernels["cpu"]},
)


def python_path(op: xk.Op, *tensors: torch.Tensor, **kwargs):
    """The same call through the Python eager kernel."""
    torch_op(op)
    return torch_eager._run(op.record, "cpu", tensors, kwargs)


def assert_same(native, python) -> None:
    if isinstance(native, torch.Tensor):
        native, python = (native,), (python,)
    assert len(native) == len(python)
    for n, p in zip(native, python, strict=True):
        assert n.dtype == p.dtype and n.shape == p.shape and n.device == p.device
        torch.testing.assert_close(n, p, rtol=0, atol=0, equal_nan=True)


def test_native_path_is_active():
    assert torch_native.available(), torch_native.native_status()
    assert torch_native.native_status().startswith("active: ")
    torch_op(simple_add)
    # The CPU kernel is C++: torch names no Python kernel for it.
    table = torch._C._dispatch_dump_table("xla_kernels::simple_add")
    assert "CPU: registered at" in table and "frontends/torch/native.cc" in table, table


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (1021,), (3, 0, 2), (5, 33), ()])
def test_simple_add_matches_the_python_path(rng, dtype, shape):
    a = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    b = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    out = torch_op(simple_add)(a, b)
    assert_same(out, python_path(simple_add, a, b))
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)


def test_non_contiguous_inputs_and_fresh_outputs(rng):
    base = torch.from_numpy(rng.standard_normal((40, 60)).astype(np.float32))
    add = torch_op(simple_add)
    pairs = ((base.t(), base.t()), (base[:, ::3], base[:, 1::3]), (base[3:, 5:], base[:-3, :-5]))
    for a, b in pairs:
        first, second = add(a, b), add(a, b)
        assert first.data_ptr() != second.data_ptr()
        torch.testing.assert_close(first, a + b, rtol=0, atol=0)
        assert_same(first, python_path(simple_add, a, b))


def test_every_attribute_type_round_trips():
    x = torch.arange(5, dtype=torch.float32)
    values = dict(i=-(2**62) - 3, i32=-7, f=0.1, d=1e-300, b=True, s="héllo",
                  ints=[2**40, -1, 0], floats=[0.25, -3.5, 1e-3], raw=b"\x00\x01\xfe\xff")
    out = call(attrs_echo, x, **values)
    assert_same(out, python_path(attrs_echo, x, **attrs_for_torch(
        attrs_echo, values)))
    got = out.tolist()
    assert got[:5] == [float(-(2**62) - 3), -7.0, float(np.float32(0.1)), 1e-300, 1.0]
    assert got[5] == len("héllo".encode()) and got[6:10] == list("héllo".encode()[:4])
    assert got[10:14] == [3, 2**40, -1, 0]
    assert got[14:18] == [3, *np.float32([0.25, -3.5, 1e-3]).astype(np.float64)]
    assert got[18:23] == [4, 0, 1, 254, 255] and got[23] == 10.0
    # Other values of the same call shape: each set of attribute values is its own plan.
    again = call(attrs_echo, x, **dict(values, i=5, s="", ints=[], raw=b""))
    assert again.tolist()[0] == 5.0 and again.tolist()[5] == 0 and again.tolist()[10] == 0


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_paged_attention_cpu_matches_float64(rng, dtype):
    x = make_inputs(rng, num_seqs=3, num_q_heads=4, num_kv_heads=2, head_dim=64,
                    block_size=16, dtype=dtype, seq_lens=[1, 17, 40])
    tensors = [torch.from_numpy(x[k].view(np.int16)).view(torch.bfloat16)
               if x[k].dtype.name == "bfloat16" else torch.from_numpy(x[k]) for k in PA_ARGS]
    out = torch_op(paged_attention, num_outputs=1)(*tensors, scale=0.125)
    assert isinstance(out, torch.Tensor)  # the workspace output stays hidden
    ref = paged_attention_numpy_f64(*(x[k] for k in PA_ARGS), scale=0.125)
    assert rel_error(out.float().numpy(), ref) <= TOLERANCES[dtype]
    assert_same(out, python_path(paged_attention, *tensors, scale=0.125))


def test_workspace_outputs_are_hidden():
    ints, reals, y = call(torch_frontend_tests().torch_attrs, torch.ones(3), i32=1)
    assert ints.dtype == torch.int64 and reals.dtype == torch.float64 and y.shape == (3,)


def torch_frontend_tests():
    """tests/test_torch_frontend.py, for its test ops (a multi-output op with a workspace)."""
    import test_torch_frontend

    return test_torch_frontend


def test_errors_are_the_library_errors():
    add = torch_op(simple_add)
    ints = torch.ones(3, dtype=torch.int32)
    with pytest.raises(xk.OpTypeError, match=r"xla_kernels\.simple_add: argument 'a'"):
        add(ints, ints)
    with pytest.raises(xk.OpInputError, match=r"shape \(4,\) differs"):
        add(torch.ones(3), torch.ones(4))
    with pytest.raises(xk.OpInputError, match="argument 'nope': unknown attribute"):
        call(attrs_echo, torch.ones(2), nope=1)
    with pytest.raises(xk.OpInputError, match="argument 'i32': missing required"):
        torch.ops.xk_tests.attrs_echo(torch.ones(2), i=1, f=0.5, d=0.5, b=True, s="",
                                      ints=[], floats=[])
    # (Device mismatches reach the kernel only with a GPU: tests/gpu/test_torch_gpu.py.)
    # The same call shape works afterwards: a failed plan is not cached.
    torch.testing.assert_close(add(torch.ones(3), torch.ones(3)), torch.full((3,), 2.0))


def test_a_kernel_failure_is_a_kernel_error(rng):
    x = make_inputs(rng, num_seqs=2, num_q_heads=4, num_kv_heads=2, head_dim=64,
                    block_size=16, dtype="f32", max_context=32)
    tensors = [torch.from_numpy(x[k]) for k in PA_ARGS]
    with pytest.raises(KernelError, match=r"^xk_tests.native_loose_attention: kernel failed: "
                                          r".*layout") as e:
        torch_op(loose_attention)(*tensors, scale=0.1, layout="bogus")
    assert e.value.code_name == "INVALID_ARGUMENT"
    with pytest.raises(KernelError) as py:
        python_path(loose_attention, *tensors, scale=0.1, layout="bogus")
    assert str(py.value) == str(e.value)


def test_poisoned_outputs(monkeypatch):
    monkeypatch.setattr(torch_eager, "POISON_OUTPUTS", True)
    torch_native.clear_plans()  # plans made before carry the old setting
    out = call(torch_frontend_tests().writes_nothing, torch.ones(4))
    assert torch.isnan(out).all()
    a = torch.ones(6)
    torch.testing.assert_close(call(simple_add, a, a), a + a, rtol=0, atol=0)
    monkeypatch.setattr(torch_eager, "POISON_OUTPUTS", False)
    torch_native.clear_plans()


def test_threads_call_concurrently(rng):
    add = torch_op(simple_add)
    inputs = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in (3, 64, 1000)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(k: int) -> None:
        try:
            barrier.wait()
            for i in range(400):
                a = inputs[(i + k) % len(inputs)]
                torch.testing.assert_close(add(a, a), a + a, rtol=0, atol=0)
                if i % 50 == k:  # plan misses and clears while others hit
                    torch_native.clear_plans("xla_kernels::simple_add")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_opcheck_passes(rng):
    a = torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32))
    torch.library.opcheck(torch_op(simple_add).default, (a, a))
    torch.library.opcheck(torch_op(attrs_echo).default, (a.flatten(),),
                          {"i": 1, "i32": 2, "f": 0.5, "d": 0.25, "b": False, "s": "x",
                           "ints": [1], "floats": [2.0], "raw": [3]})


def run_python(code: str, **env: str) -> str:
    src = str(Path(__file__).resolve().parents[1] / "src")
    full = dict(os.environ, **env, PYTHONPATH=os.pathsep.join(
        p for p in (src, str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_torch_compile_fullgraph_in_a_fresh_process():
    # A fresh interpreter: see test_torch_frontend.py (torchax and torch.compile).
    out = run_python(
        "import torch\nfrom test_torch_frontend import compile_aot_eager_checks\n"
        "from xla_kernels.frontends.torch import native as torch_native\n"
        "compile_aot_eager_checks()\nprint(torch_native.native_status())\n")
    assert "active: " in out


def test_python_fallback_when_disabled():
    out = run_python(
        "import torch\nfrom xla_kernels.frontends.torch import native as torch_native\n"
        "from xla_kernels.frontends.torch import torch_op\n"
        "from xla_kernels.kernels.simple_add import simple_add\n"
        "add = torch_op(simple_add)\n"
        "a = torch.arange(4.0)\nassert torch.equal(add(a, a), a + a)\n"
        "print(torch_native.native_status())\n"
        "print(torch._C._dispatch_dump_table('xla_kernels::simple_add'))\n",
        XLA_KERNELS_TORCH_NATIVE="0")
    assert "disabled: XLA_KERNELS_TORCH_NATIVE=0" in out
    assert "frontends/torch/native.cc" not in out


def test_the_autograd_kernel_is_the_native_gate():
    add = torch_op(simple_add)
    table = torch._C._dispatch_dump_table("xla_kernels::simple_add")
    line = next(line for line in table.splitlines() if line.startswith("AutogradCPU:"))
    assert "frontends/torch/native.cc" in line, table
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():  # no gradient needed: straight to the CPU kernel
        assert not add(x, x).requires_grad
    y = add(x, x)  # a gradient may be needed: recorded, and backward says why it cannot
    assert y.requires_grad and y.grad_fn is not None
    with pytest.raises(RuntimeError, match=r"xla_kernels.simple_add: cannot be differentiated"):
        y.sum().backward()


def test_python_autograd_gate_when_disabled():
    out = run_python(
        "import torch\nfrom xla_kernels.frontends.torch import torch_op\n"
        "from xla_kernels.kernels.simple_add import simple_add\n"
        "from xla_kernels.kernels.rms_norm import rms_norm\n"
        "norm = torch_op(rms_norm)\n"
        "x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)\n"
        "w = torch.randn(5, dtype=torch.float64, requires_grad=True)\n"
        "assert torch.autograd.gradcheck(lambda x, w: norm(x, w, eps=1e-6), (x, w))\n"
        "y = torch_op(simple_add)(x, x)\n"
        "try:\n    y.sum().backward()\nexcept RuntimeError as e:\n    print(e)\n"
        "print(torch._C._dispatch_dump_table('xla_kernels::simple_add'))\n",
        XLA_KERNELS_TORCH_NATIVE="0")
    assert "xla_kernels.simple_add: cannot be differentiated" in out
    assert "frontends/torch/native.cc" not in out


def test_install_reports_unknown_platforms():
    with pytest.raises(ValueError, match="platform"):
        torch_native.install("xla_kernels::simple_add", "tpu", lambda t, k: None)


def test_python_fallback_when_the_native_build_fails():
    # As on a machine without torch's headers: the build options cannot be found.
    out = run_python(
        "import torch\nfrom xla_kernels.frontends.torch import native as torch_native\n"
        "def missing():\n    raise FileNotFoundError('torch headers not found (test)')\n"
        "torch_native._torch_build_options = missing\n"
        "from xla_kernels.frontends.torch import torch_op\n"
        "from xla_kernels.kernels.simple_add import simple_add\n"
        "add = torch_op(simple_add)\n"
        "a = torch.arange(4.0)\nassert torch.equal(add(a, a), a + a)\n"
        "assert not torch_native.available()\n"
        "print(torch_native.native_status())\n")
    assert "unavailable: FileNotFoundError: torch headers not found (test)" in out
