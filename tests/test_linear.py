"""linear on the CPU: the kernel and the plain-XLA path against the float64 reference for
every dtype, decode and odd shapes; every bad input's message; torch eager and torchax;
sharding on a 2-device CPU mesh."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import xla_kernels as xk
from toolchain import requires_nvcc
from xla_kernels import builder, dtypes
from xla_kernels.kernels.linear import linear, linear_numpy_f64, linear_xla

TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make_inputs(rng, tokens: int, k: int, out: int, dtype: str):
    """x with per-row magnitudes, weights of order 1 / sqrt(in): entries of y of order one."""
    x = rng.standard_normal((tokens, k)) * rng.uniform(0.1, 10, (tokens, 1))
    w = rng.standard_normal((out, k)) / np.sqrt(k)
    np_dtype = dtypes.to_numpy(dtype)
    return x.astype(np_dtype), w.astype(np_dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(1, 256, 64), (3, 29, 13), (17, 72, 40), (64, 128, 96)])
def test_cpu_kernel_matches_float64(rng, shape, dtype):
    tokens, k, out = shape
    x, w = make_inputs(rng, tokens, k, out, dtype)
    y = linear(x, w)
    assert y.shape == (tokens, out) and y.dtype == x.dtype
    assert rel(y, linear_numpy_f64(x, w)) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_plain_xla_path_matches_float64(rng, dtype):
    x, w = make_inputs(rng, 5, 96, 33, dtype)
    y = jax.jit(linear_xla)(x, w)
    assert y.dtype == x.dtype
    assert rel(y, linear_numpy_f64(x, w)) < TOL[dtype]


def test_is_one_custom_call(rng):
    x, w = make_inputs(rng, 2, 32, 8, "bf16")
    line = xk.assert_single_custom_call(xk.hlo_text(linear, x, w), "xla_kernels.linear").line
    assert "api_version=API_VERSION_TYPED_FFI" in line


def test_no_tokens(rng):
    x, w = make_inputs(rng, 0, 32, 8, "f32")
    assert linear(x, w).shape == (0, 8)


@pytest.mark.parametrize("args, arg, words", [
    (((2, 8), "f32", (4, 8), "bf16"), "weight", "dtype bf16 differs from x's f32"),
    (((2, 8), "f32", (4, 6), "f32"), "weight", "expected shape (out, 8)"),
    (((2, 8), "i32", (4, 8), "i32"), "x", "dtype i32 is not supported"),
    (((2, 2, 8), "f32", (4, 8), "f32"), "x", "rank"),
])
def test_bad_inputs_are_named(args, arg, words):
    xs, xd, ws, wd = args
    x = np.ones(xs, dtypes.to_numpy(xd))
    w = np.ones(ws, dtypes.to_numpy(wd))
    with pytest.raises(xk.OpInputError) as info:
        linear(x, w)
    message = str(info.value)
    assert message.startswith("xla_kernels.linear:")
    assert f"argument '{arg}'" in message and words in message and "Fix:" in message


def test_torch_eager_matches_float64(rng):
    torch = pytest.importorskip("torch")
    from xla_kernels.frontends.torch import torch_op

    op = torch_op(linear)
    x, w = make_inputs(rng, 3, 40, 24, "f32")
    y = op(torch.from_numpy(x), torch.from_numpy(w))
    assert tuple(y.shape) == (3, 24)
    assert rel(y.numpy(), linear_numpy_f64(x, w)) < TOL["f32"]


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from xla_kernels.kernels.linear import linear, linear_numpy_f64
    from xla_kernels.hlo import assert_single_custom_call, hlo_text

    COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
                   "reduce-scatter")
    mesh = Mesh(np.array(jax.devices()), ("x",))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    w = rng.standard_normal((12, 32)).astype(np.float32)

    def run(specs):
        args = [jax.device_put(a, NamedSharding(mesh, p)) for a, p in zip((x, w), specs)]
        f = jax.jit(linear)
        y = f(*args)
        want = linear_numpy_f64(x, w)
        err = np.linalg.norm(np.asarray(y, np.float64) - want) / np.linalg.norm(want)
        assert err < 1e-5, (specs, err)
        text = hlo_text(f, *args)
        call = assert_single_custom_call(text, "xla_kernels.linear")
        return y, call, [c for c in COLLECTIVES if c in text]

    # Tokens split: each device runs its rows.
    y, call, comm = run([P("x"), P()])
    assert y.sharding.spec[0] == "x" and call.result_shape.startswith("f32[4,12]"), call.line
    assert comm == [], comm
    # Column parallel: weight rows split, no communication.
    y, call, comm = run([P(), P("x")])
    assert tuple(y.sharding.spec)[1:] == ("x",), y.sharding
    assert call.result_shape.startswith("f32[8,6]") and comm == [], (call.line, comm)
    # Row parallel (in split): the kernel sees whole rows; XLA gathers them.
    y, call, comm = run([P(None, "x"), P(None, "x")])
    assert call.result_shape.startswith("f32[8,12]") and "all-gather" in comm, (call.line, comm)
    print("ok")
""")


def test_sharding_on_a_two_device_cpu_mesh():
    result = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.slow
@requires_nvcc
@pytest.mark.parametrize("arch", ["80", "90"], ids=["sm_80", "sm_90"])
def test_cuda_kernel_compiles(arch, tmp_path):
    kernel = linear.kernels["cuda"]
    path = builder.build_library(linear.name, kernel.resolved_sources(), platform="cuda",
                                 cuda_archs=[arch], cache_dir=tmp_path)
    assert path.exists()
