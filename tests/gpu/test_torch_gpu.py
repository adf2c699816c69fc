"""The torch frontend and torchax on the GPU: eager CUDA tensors, streams, timing.

Eager CUDA calls run the op's handler on PyTorch's current stream without synchronizing,
so they must see the results of work queued before them on that stream (and never of
work on other streams they were not ordered after). The timing test writes the per-call
time of one small simple_add through each frontend to
``$XK_RESULTS_DIR/frontend_overhead.json``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels import dtypes
from xla_kernels.frontends.torch import torch_op
from xla_kernels.frontends.torchax import import_torchax, register_torchax
from xla_kernels.hlo import assert_single_custom_call, hlo_text
from xla_kernels.kernels.simple_add import simple_add

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

SIZES = [1, 2, 3, 7, 31, 1021, 4099, 65537, 1 << 20]
TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


@pytest.fixture(scope="module")
def add():
    return torch_op(simple_add)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def cuda_tensor(a: np.ndarray) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(a).cuda()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("size", SIZES)
def test_eager_cuda_matches_numpy(add, rng, dtype, size):
    np_dtype = dtypes.to_numpy(dtype)
    a = rng.standard_normal(size).astype(np_dtype)
    b = rng.standard_normal(size).astype(np_dtype)
    out = add(cuda_tensor(a), cuda_tensor(b))
    assert out.is_cuda and out.dtype == TORCH[dtype] and out.shape == (size,)
    want = (a.astype(np.float64) + b.astype(np.float64)).astype(np_dtype)
    np.testing.assert_array_equal(to_numpy(out).astype(np.float64), want.astype(np.float64))


def test_eager_cuda_non_contiguous_and_multi_dim(add, rng):
    base = torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32)).cuda()
    pairs = [(base.t(), base.t()), (base[:, ::3], base[:, 1::3]), (base[3:, 5:], base[:-3, :-5])]
    for a, b in pairs:
        torch.testing.assert_close(add(a, b), a + b, rtol=0, atol=0)


def test_f64_is_rejected_on_cuda_with_the_library_error(add):
    a = torch.ones(3, dtype=torch.float64, device="cuda")
    with pytest.raises(xk.OpTypeError, match="dtype f64 is not supported on cuda"):
        add(a, a)


def test_ordered_after_work_queued_on_the_current_stream(add):
    m = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096 * 4096, device="cuda")
    for _ in range(3):
        product = m @ m  # queued; the add below must wait for it on the same stream
        out = add(product.view(-1), b)
        doubled = out * 2  # queued after the add: must see the add's results
    torch.cuda.synchronize()
    torch.testing.assert_close(out, product.view(-1) + b, rtol=0, atol=0)
    torch.testing.assert_close(doubled, (product.view(-1) + b) * 2, rtol=0, atol=0)


def test_runs_on_a_non_default_stream(add):
    side = torch.cuda.Stream()
    m = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048 * 2048, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        product = m @ m
        out = add(product.view(-1), b)
        after = out + 1
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(after, product.view(-1) + b + 1, rtol=0, atol=0)
    side.synchronize()


def compile_on_cuda_checks() -> None:
    """torch.compile(fullgraph=True) over the op on CUDA tensors, aot_eager and inductor."""
    add = torch_op(simple_add)
    a = torch.randn(1000, device="cuda")
    for backend in ("aot_eager", "inductor"):
        compiled = torch.compile(lambda x, y: add(x * 2, y) + 1, fullgraph=True, backend=backend)
        torch.testing.assert_close(compiled(a, a), a * 3 + 1)


def test_torch_compile_on_cuda_tensors():
    # A fresh process: once torchax is imported (other tests here do), it makes "jax"
    # torch's accelerator and torch.compile refuses to trace.
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import test_torch_gpu as t\nt.compile_on_cuda_checks()\nprint('CHECKS PASSED')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))
    assert proc.returncode == 0 and "CHECKS PASSED" in proc.stdout, proc.stdout + proc.stderr


def test_opcheck_on_cuda_tensors(add):
    a = torch.randn(8, 5, device="cuda")
    torch.library.opcheck(add.default, (a, a))


@pytest.fixture(scope="module")
def torchax_env():
    torchax = import_torchax()
    register_torchax(simple_add)
    return torchax


def test_torchax_on_the_gpu(torchax_env, rng):
    torchax = torchax_env
    a = rng.standard_normal(4099).astype(np.float32)
    b = rng.standard_normal(4099).astype(np.float32)
    with torchax.default_env():
        ta, tb = torch.from_numpy(a).to("jax"), torch.from_numpy(b).to("jax")
        eager = torch.ops.xla_kernels.simple_add(ta, tb)
        assert eager.jax().devices().pop().platform == "gpu"
        jitted = torchax.interop.jax_jit(lambda x, y: torch.ops.xla_kernels.simple_add(x, y))
        for out in (eager, jitted(ta, tb)):
            np.testing.assert_array_equal(np.asarray(out.jax()), a + b)
    text = hlo_text(torchax.interop.jax_view(lambda x, y: torch.ops.xla_kernels.simple_add(x, y)),
                    jnp.asarray(a), jnp.asarray(b))
    assert_single_custom_call(text, simple_add.target)


def _median_us(fn, *, calls: int, sync) -> tuple[float, float]:
    """Median host time of one call (no sync) and of one call plus a sync, in µs."""
    dispatch, roundtrip = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        dispatch.append(time.perf_counter() - t0)
        sync()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync()
        roundtrip.append(time.perf_counter() - t0)
    return statistics.median(dispatch) * 1e6, statistics.median(roundtrip) * 1e6


def test_per_call_time_of_each_frontend(add, torchax_env):
    torchax = torchax_env
    n, calls, warmup = 1024, 2000, 200
    ta = torch.randn(n, device="cuda")
    tb = torch.randn(n, device="cuda")
    na, nb = ta.cpu().numpy(), tb.cpu().numpy()
    ja, jb = jnp.asarray(na), jnp.asarray(nb)
    jax_add = jax.jit(simple_add)
    with torchax.default_env():  # (inside it, torchax treats CUDA tensors as its own)
        xa, xb = torch.from_numpy(na).to("jax"), torch.from_numpy(nb).to("jax")
    assert xa.jax().devices().pop().platform == "gpu"
    torchax_add = torchax.interop.jax_jit(lambda x, y: torch.ops.xla_kernels.simple_add(x, y))

    last = {}
    frontends = {
        "torch_eager_cuda": (lambda: add(ta, tb), torch.cuda.synchronize),
        "torch_add_reference": (lambda: torch.add(ta, tb), torch.cuda.synchronize),
        "torchax_jax_jit": (lambda: last.__setitem__("x", torchax_add(xa, xb)),
                            lambda: last["x"].jax().block_until_ready()),
        "jax_jit": (lambda: last.__setitem__("j", jax_add(ja, jb)),
                    lambda: last["j"].block_until_ready()),
    }
    results = {}
    for name, (fn, sync) in frontends.items():
        for _ in range(warmup):
            fn()
        sync()
        dispatch, roundtrip = _median_us(fn, calls=calls, sync=sync)
        results[name] = {"dispatch_us_median": round(dispatch, 2),
                         "call_and_sync_us_median": round(roundtrip, 2)}
    torch.testing.assert_close(add(ta, tb), ta + tb, rtol=0, atol=0)

    report = {
        "what": "one simple_add of two f32[1024] on the GPU, per call: host time of the call "
                "(dispatch) and of the call plus waiting for its result; median after warm-up",
        "calls": calls, "warmup": warmup, "elements": n, "dtype": "f32",
        "device": torch.cuda.get_device_name(), "host": platform.node(),
        "versions": {"torch": torch.__version__, "jax": jax.__version__,
                     "torchax": getattr(torchax, "__version__", "?")},
        "results": results,
    }
    print(json.dumps(report, indent=2))
    out_dir = os.environ.get("XK_RESULTS_DIR")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "frontend_overhead.json").write_text(json.dumps(report, indent=2) + "\n")
    for name, r in results.items():
        assert r["dispatch_us_median"] > 0, name


# ------------------------------------------------------------------------ native kernels

NATIVE = os.environ.get("XLA_KERNELS_TORCH_NATIVE", "1") != "0"

# A CUDA handler that takes scratch memory and reports the stream and device ordinal it
# was given: info = [stream handle, ordinal], out = a * x + y.
native_axpy = xk.Op(
    "xk_tests.native_axpy",
    inputs=[xk.Tensor("x", dtypes=("f32",)), xk.Tensor("y", dtypes=("f32",))],
    attrs=[xk.Attr("a", np.float32)],
    outputs=lambda x, y, a: (xk.like(x), xk.Spec((2,), "i64")),
    kernels={"cuda": xk.Kernel(
        [str(Path(__file__).resolve().parents[1] / "fixtures" / "eager" / "cuda_handlers.cu")],
        handler="xk_test_cuda_axpy")},
)


@pytest.mark.skipif(not NATIVE, reason="XLA_KERNELS_TORCH_NATIVE=0 forces the Python kernels")
def test_native_cuda_kernel_is_active(add):
    from xla_kernels.frontends.torch import native as torch_native

    assert torch_native.native_status().startswith("active: "), torch_native.native_status()
    table = torch._C._dispatch_dump_table("xla_kernels::simple_add")
    cuda_line = next(line for line in table.splitlines() if line.startswith("CUDA:"))
    assert "frontends/torch/native.cc" in cuda_line, table


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(0,), (1,), (1021,), (3, 0, 2), (65, 33)])
def test_native_matches_the_python_path_on_cuda(add, dtype, shape):
    from xla_kernels.frontends.torch import eager as torch_eager

    a = torch.randn(shape, device="cuda").to(dtype)
    b = torch.randn(shape, device="cuda").to(dtype)
    python = torch_eager._run(simple_add.record, "cuda", (a, b), {})
    native = add(a, b)
    assert native.device == a.device and native.dtype == dtype and native.shape == shape
    torch.testing.assert_close(native, python, rtol=0, atol=0)
    torch.testing.assert_close(native, a + b, rtol=0, atol=0)


def test_runs_on_the_current_stream_with_torch_scratch():
    axpy = torch_op(native_axpy)
    x = torch.randn(100_003, device="cuda")
    y = torch.randn(100_003, device="cuda")
    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            big = x.repeat(64).view(64, -1).sum(0)  # queued first on this stream
            out, info = axpy(big, y, a=3.0)
            after = out - y  # queued after: must see the handler's results
        stream.synchronize()
        assert info.tolist() == [stream.cuda_stream, x.device.index or 0]
        torch.testing.assert_close(out, 3.0 * big + y)
        torch.testing.assert_close(after, 3.0 * big, rtol=1e-5, atol=1e-4)


def test_side_stream_is_not_the_current_one(add):
    side = torch.cuda.Stream()
    a = torch.randn(1 << 20, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = add(a, a)
        assert torch.cuda.current_stream() == side
    assert torch.cuda.current_stream() != side
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, a * 2, rtol=0, atol=0)


def test_device_mismatch_is_the_library_error(add):
    with pytest.raises(xk.OpInputError, match="argument 'b': is on cpu, while 'a' is on cuda"):
        add(torch.ones(3, device="cuda"), torch.ones(3))


def test_a_cached_plan_does_not_skip_the_device_check(add):
    a, b = torch.ones(3, device="cuda"), torch.ones(3, device="cuda")
    assert add(a, b).tolist() == [2.0] * 3  # the CUDA kernel keeps a plan for this shape
    with pytest.raises(xk.OpInputError, match="argument 'b': is on cpu, while 'a' is on cuda"):
        add(a, b.cpu())
    with pytest.raises(xk.OpInputError, match="argument 'b': is on meta, while 'a' is on cuda"):
        add(a, b.to("meta"))
    assert add(a, b).tolist() == [2.0] * 3


def test_the_autograd_path_refuses_a_cpu_tensor_beside_a_cuda_one():
    from xla_kernels.kernels.rms_norm import rms_norm

    x = torch.ones(2, 8, device="cuda", requires_grad=True)
    with pytest.raises(xk.OpInputError, match="argument 'weight': is on cpu, while 'x'"):
        torch_op(rms_norm)(x, torch.ones(8))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_are_refused(add):
    a, b = torch.ones(3, device="cuda:0"), torch.ones(3, device="cuda:1")
    assert add(a, a).tolist() == [2.0] * 3 and add(b, b).device == b.device
    with pytest.raises(xk.OpInputError,
                       match="argument 'b': is on cuda:1, while 'a' is on cuda:0"):
        add(a, b)
    with pytest.raises(xk.OpInputError,
                       match="argument 'b': is on cuda:0, while 'a' is on cuda:1"):
        add(b, a)


def test_native_calls_from_threads_on_their_own_streams(add):
    import threading

    errors = []

    def work() -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                a = torch.randn(4099, device="cuda")
                for _ in range(200):
                    out = add(a, a)
                torch.testing.assert_close(out, a * 2, rtol=0, atol=0)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
