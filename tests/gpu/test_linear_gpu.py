"""linear's CUDA kernels against the float64 reference: the Hopper path (bf16 on compute
capability 9.0: each of its three tiles, and calls it declines), the skinny GEMM at each tile
of its token table (16, 32, 64) and past it (several token tiles), Llama-3-8B decode shapes
split over a cluster, partial chunks and rows; the CUDA-core kernel (f32, rows that are not
whole 16 bytes); agreement with the CPU kernel; torch eager on CUDA; the sanitizer cases."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from xla_kernels.kernels.linear import linear, linear_numpy_f64
from xla_kernels.kernels.linear.testing import sanitize_cases

pytestmark = pytest.mark.gpu

TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}
NP = {"f32": np.float32, "bf16": jax.numpy.bfloat16, "f16": np.float16}

# (tokens, in, out)
SHAPES = {
    "llama o decode": (1, 4096, 4096),
    "llama qkv 16 tokens": (16, 4096, 6144),
    "llama down decode": (4, 14336, 4096),
    "partial chunk, rows past out": (7, 1040, 72),
    "32-token tile": (29, 512, 200),
    "64-token tile": (64, 1024, 384),
    "three token tiles": (150, 256, 136),
    "Hopper path's large tile": (1024, 4096, 1024),
    "out not a multiple of 8": (9, 256, 100),
    "rows not whole 16 bytes": (5, 29, 13),
}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def inputs(rng, tokens, k, out, dtype):
    x = rng.standard_normal((tokens, k)) * rng.uniform(0.1, 10, (tokens, 1))
    w = rng.standard_normal((out, k)) / np.sqrt(k)
    return x.astype(NP[dtype]), w.astype(NP[dtype])


def gpu(*arrays):
    return [jax.device_put(a, jax.devices("gpu")[0]) for a in arrays]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_cuda_matches_float64(rng, name, dtype):
    tokens, k, out = SHAPES[name]
    x, w = inputs(rng, tokens, k, out, dtype)
    y = jax.jit(linear)(*gpu(x, w))
    assert y.devices().pop().platform == "gpu"
    assert y.shape == (tokens, out) and y.dtype == x.dtype
    got = np.asarray(y, np.float32)
    assert np.isfinite(got).all()
    assert rel(got, linear_numpy_f64(x, w)) < TOL[dtype]


def test_cuda_agrees_with_the_cpu_kernel(rng):
    x, w = inputs(rng, 5, 4096, 1024, "f32")
    cpu = jax.devices("cpu")[0]
    want = linear(*(jax.device_put(a, cpu) for a in (x, w)))
    assert rel(linear(*gpu(x, w)), want) < 1e-5


def test_no_tokens(rng):
    x, w = inputs(rng, 0, 64, 32, "bf16")
    assert linear(*gpu(x, w)).shape == (0, 32)


def test_torch_eager_on_cuda_writes_every_output(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from xla_kernels.frontends.torch import torch_op

    op = torch_op(linear)
    x, w = inputs(rng, 3, 1024, 200, "f32")
    xt = torch.from_numpy(x).to(torch.bfloat16).cuda()
    wt = torch.from_numpy(w).to(torch.bfloat16).cuda()
    torch.empty(3 * 200 * 4, device="cuda").fill_(float("nan"))  # NaN where y may land
    y = op(xt, wt)
    torch.cuda.synchronize()
    assert torch.isfinite(y).all()
    want = linear_numpy_f64(xt.float().cpu().numpy(), wt.float().cpu().numpy())
    assert rel(y.float().cpu().numpy(), want) < TOL["bf16"]


def test_torch_eager_x_two_bytes_off_takes_another_path(rng):
    """The Hopper path needs 16-byte aligned operands (TMA); a view 2 bytes into its storage
    must take another path, not read the wrong bytes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from xla_kernels.frontends.torch import torch_op

    x, w = inputs(rng, 24, 1024, 256, "f32")
    flat = torch.empty(24 * 1024 + 8, dtype=torch.bfloat16, device="cuda")
    xt = flat[1:1 + 24 * 1024].view(24, 1024)
    xt.copy_(torch.from_numpy(x).to(torch.bfloat16))
    wt = torch.from_numpy(w).to(torch.bfloat16).cuda()
    y = torch_op(linear)(xt, wt)
    torch.cuda.synchronize()
    want = linear_numpy_f64(xt.float().cpu().numpy(), wt.float().cpu().numpy())
    assert rel(y.float().cpu().numpy(), want) < TOL["bf16"]


def test_sanitizer_cases_run():
    sanitize_cases()


def test_the_hopper_path_is_built_where_cutlass_is_found():
    from xla_kernels.builder import cutlass
    from xla_kernels.kernels.linear import hopper_path_built

    if not cutlass.include_dirs():
        pytest.skip("CUTLASS's headers not found (XLA_KERNELS_CUTLASS_DIR, nvidia-cutlass)")
    assert hopper_path_built()
