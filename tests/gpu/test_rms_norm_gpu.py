"""rms_norm's CUDA kernels, forward and backward, against float64 and the CPU kernels;
fused_add_rms_norm's against float64, the CPU kernel and (bit for bit) XLA's add followed by
the rms_norm kernel, in JAX and torch eager on CUDA tensors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_rms_norm import TOL, rel
from xla_kernels import dtypes
from xla_kernels.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_numpy_f64,
    rms_norm,
    rms_norm_bwd_numpy_f64,
    rms_norm_numpy_f64,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(1, 8), (3, 5, 129), (4096, 4096), (2, 0, 4), (7, 1)])
def test_cuda_forward_and_gradients_match_float64_and_the_cpu(rng, dtype, shape):
    np_dtype = dtypes.to_numpy(dtype)
    x = rng.standard_normal(shape).astype(np_dtype)
    w = rng.standard_normal(shape[-1]).astype(np_dtype)
    dy = rng.standard_normal(shape).astype(np_dtype)
    fn = lambda x, w: rms_norm(x, w, eps=1e-5)  # noqa: E731
    y, pull = jax.vjp(fn, jax.device_put(x), jax.device_put(w))
    assert y.devices().pop().platform == "gpu"
    dx, dw = pull(jnp.asarray(dy))
    if x.size == 0:
        assert not np.asarray(dw, np.float64).any()
        return
    want_dx, want_dw = rms_norm_bwd_numpy_f64(x, w, dy, eps=1e-5)
    assert rel(y, rms_norm_numpy_f64(x, w, eps=1e-5)) < TOL[dtype]
    # dx = (w dy - y <y, w dy> / n) / rms: the two terms cancel when hidden is small (at
    # hidden 1, to eps / (x^2 + eps)), so its error is measured against their size.
    scale = dx_scale(x, w, dy)
    assert rel(dx, want_dx, scale) < 5 * TOL[dtype] and rel(dw, want_dw) < 5 * TOL[dtype]
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        _, pull_cpu = jax.vjp(fn, jax.device_put(x, cpu), jax.device_put(w, cpu))
        cdx, cdw = pull_cpu(jax.device_put(dy, cpu))
    assert rel(dx, cdx, scale) < 5 * TOL[dtype] and rel(dw, cdw) < 5 * TOL[dtype]


def dx_scale(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> float:
    """The norm of w * dy / rms (f64), the size of the terms dx is the difference of."""
    x64, w64, dy64 = (np.asarray(a, np.float64) for a in (x, w, dy))
    rms = np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-5)
    return float(np.linalg.norm(w64 * dy64 / rms))


def test_sharded_programs_compile_and_run_on_a_one_gpu_mesh(rng):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
    from xla_kernels.kernels.paged_attention.testing import make_inputs

    mesh = Mesh(np.array(jax.devices("gpu")[:1]), ("tp",))
    x = make_inputs(rng, num_seqs=2, num_q_heads=8, num_kv_heads=2, head_dim=128,
                    block_size=16, dtype="bf16", poison=False)
    specs = [P(None, "tp"), P(None, None, "tp"), P(None, None, "tp"), P(), P()]
    args = [jax.device_put(a, NamedSharding(mesh, s))
            for a, s in zip(x.values(), specs, strict=True)]
    f = jax.jit(lambda *a: paged_attention(*a, scale=128 ** -0.5))
    out = f(*args)
    ref = paged_attention_numpy_f64(*x.values(), scale=128 ** -0.5)
    assert rel(out, ref) < 1e-2
    w = jax.device_put(np.ones(64, np.float32), NamedSharding(mesh, P()))
    h = jax.device_put(rng.standard_normal((4, 64)).astype(np.float32),
                       NamedSharding(mesh, P("tp")))
    g = jax.jit(jax.grad(lambda h, w: rms_norm(h, w).sum()))(h, w)
    assert g.shape == (4, 64)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(1, 8), (3, 5, 129), (64, 4096), (2, 0, 4), (7, 1),
                                   (5, 8193)])
def test_cuda_fused_add_rms_norm_is_add_then_rms_norm_bit_for_bit(rng, dtype, shape):
    np_dtype = dtypes.to_numpy(dtype)
    x = rng.standard_normal(shape).astype(np_dtype)
    residual = (3 * rng.standard_normal(shape)).astype(np_dtype)
    w = rng.standard_normal(shape[-1]).astype(np_dtype)
    fused = jax.jit(lambda *a: fused_add_rms_norm(*a, eps=1e-5))
    out, residual_out = fused(*(jax.device_put(a) for a in (x, residual, w)))
    assert out.devices().pop().platform == "gpu"
    assert out.dtype == residual_out.dtype == x.dtype and out.shape == x.shape
    # The unfused model on the GPU: XLA's add in the dtype, then the rms_norm kernel, whose
    # reduction order the fused kernel shares.
    total = jax.jit(lambda a, b: a + b)(jax.device_put(x), jax.device_put(residual))
    y = jax.jit(lambda s, w: rms_norm(s, w, eps=1e-5))(total, jax.device_put(w))
    np.testing.assert_array_equal(np.asarray(residual_out).view(np.uint8),
                                  np.asarray(total).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(out).view(np.uint8), np.asarray(y).view(np.uint8))
    if x.size == 0:
        return
    want_out, want_residual = fused_add_rms_norm_numpy_f64(x, residual, w, eps=1e-5)
    np.testing.assert_array_equal(np.asarray(residual_out, np.float64), want_residual)
    assert rel(out, want_out) < TOL[dtype]
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        cpu_out, cpu_residual = fused(*(jax.device_put(a, cpu) for a in (x, residual, w)))
    np.testing.assert_array_equal(np.asarray(cpu_residual), np.asarray(residual_out))
    assert rel(out, cpu_out) < TOL[dtype]


def test_torch_eager_fused_add_rms_norm_on_cuda_tensors(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from xla_kernels.frontends.torch import torch_op

    x, residual = (rng.standard_normal((64, 4096)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(4096).astype(np.float32)
    args = [torch.from_numpy(a).cuda().to(torch.bfloat16) for a in (x, residual, w)]
    out, residual_out = torch_op(fused_add_rms_norm)(*args, eps=1e-5)
    assert out.is_cuda and residual_out.is_cuda and out.dtype == torch.bfloat16
    assert torch.equal(residual_out, args[0] + args[1])
    host = [a.float().cpu().numpy().astype(dtypes.to_numpy("bf16")) for a in args]
    want_out, _ = fused_add_rms_norm_numpy_f64(*host, eps=1e-5)
    assert rel(out.float().cpu().numpy(), want_out) < TOL["bf16"]
