"""rms_norm and its declared backward: forward and gradients against float64 references, in
JAX (grad, vjp, vmap of grad) and torch (autograd, gradcheck in f64, torch.compile)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels import dtypes
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.rms_norm import (
    rms_norm,
    rms_norm_bwd,
    rms_norm_bwd_numpy_f64,
    rms_norm_numpy_f64,
)

TOL = {"f32": 2e-6, "bf16": 2e-2, "f16": 3e-3}


def rel(a, b, scale: float | None = None) -> float:
    """||a - b|| relative to ||b||, or to ``scale`` when given."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ref = np.linalg.norm(b) if scale is None else scale
    return float(np.linalg.norm(a - b) / max(ref, 1e-30))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(1, 8), (3, 5, 129), (7, 1024), (2, 0, 4)])
def test_forward_matches_float64(rng, dtype, shape):
    x = rng.standard_normal(shape).astype(dtypes.to_numpy(dtype))
    w = rng.standard_normal(shape[-1]).astype(dtypes.to_numpy(dtype))
    y = jax.jit(lambda x, w: rms_norm(x, w, eps=1e-5))(x, w)
    assert y.dtype == x.dtype and y.shape == x.shape
    if x.size:
        assert rel(y, rms_norm_numpy_f64(x, w, eps=1e-5)) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_jax_gradients_match_the_float64_backward(rng, dtype):
    np_dtype = dtypes.to_numpy(dtype)
    x = rng.standard_normal((4, 3, 96)).astype(np_dtype)
    w = rng.standard_normal(96).astype(np_dtype)
    dy = rng.standard_normal(x.shape).astype(np_dtype)
    _, pullback = jax.vjp(lambda x, w: rms_norm(x, w, eps=1e-5), x, w)
    dx, dw = pullback(jnp.asarray(dy))
    want_dx, want_dw = rms_norm_bwd_numpy_f64(x, w, dy, eps=1e-5)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype
    assert rel(dx, want_dx) < 5 * TOL[dtype] and rel(dw, want_dw) < 5 * TOL[dtype]


def test_hand_derived_backward_matches_finite_differences(rng):
    x = rng.standard_normal((2, 6))
    w = rng.standard_normal(6)
    dy = rng.standard_normal(x.shape)
    dx, dw = rms_norm_bwd_numpy_f64(x, w, dy, eps=1e-3)
    loss = lambda x, w: float(np.sum(rms_norm_numpy_f64(x, w, eps=1e-3) * dy))  # noqa: E731
    h = 1e-6
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        assert abs((loss(x + e, w) - loss(x - e, w)) / (2 * h) - dx[i]) < 1e-6
    for j in range(6):
        e = np.zeros_like(w)
        e[j] = h
        assert abs((loss(x, w + e) - loss(x, w - e)) / (2 * h) - dw[j]) < 1e-6


def test_gradient_of_a_jitted_program_is_the_backward_op(rng):
    x = rng.standard_normal((3, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32)
    grad = jax.jit(jax.grad(lambda x, w: rms_norm(x, w).sum(), argnums=(0, 1)))
    text = jax.jit(jax.grad(lambda x, w: rms_norm(x, w).sum(), argnums=(0, 1))).lower(
        x, w).as_text("hlo")
    assert 'custom_call_target="xla_kernels.rms_norm_bwd"' in text
    dx, dw = grad(x, w)
    want_dx, want_dw = rms_norm_bwd_numpy_f64(x, w, np.ones_like(x))
    assert rel(dx, want_dx) < 1e-5 and rel(dw, want_dw) < 1e-5


def test_vmap_of_the_gradient(rng):
    x = rng.standard_normal((5, 3, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    got = jax.vmap(jax.grad(lambda x: (rms_norm(x, w) ** 2).sum()))(x)
    for b in range(5):
        y = rms_norm_numpy_f64(x[b], w)
        want, _ = rms_norm_bwd_numpy_f64(x[b], w, 2 * y)
        assert rel(got[b], want) < 1e-5


def test_torch_gradcheck_in_float64():
    op = torch_op(rms_norm)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: op(x, w, eps=1e-5), (x, w))


def test_torch_backward_matches_the_float64_reference(rng):
    x = torch.from_numpy(rng.standard_normal((4, 64)).astype(np.float32)).requires_grad_()
    w = torch.from_numpy(rng.standard_normal(64).astype(np.float32)).requires_grad_()
    dy = rng.standard_normal((4, 64)).astype(np.float32)
    torch_op(rms_norm)(x, w).backward(torch.from_numpy(dy))
    want_dx, want_dw = rms_norm_bwd_numpy_f64(x.detach(), w.detach(), dy)
    assert rel(x.grad, want_dx) < 1e-5 and rel(w.grad, want_dw) < 1e-5


def compile_backward_checks() -> None:
    op = torch_op(rms_norm)
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    compiled = torch.compile(lambda x, w: op(x, w).sin().sum(), fullgraph=True,
                             backend="aot_eager")
    compiled(x, w).backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    op(x2, w2).sin().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    torch.library.opcheck(op, (torch.randn(2, 8, requires_grad=True),
                               torch.randn(8, requires_grad=True)))


def test_torch_compile_backward_and_opcheck():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("compile_backward_checks", module="test_rms_norm")


def test_bad_weight_names_the_argument_and_the_fix():
    with pytest.raises(xk.OpInputError, match=r"xla_kernels.rms_norm: argument 'weight': "
                                              r"expected shape \(8,\) for x of shape \(2, 8\), "
                                              r"got \(4,\). Fix: pass one weight per element"):
        rms_norm(np.ones((2, 8), np.float32), np.ones(4, np.float32))


def test_backward_op_runs_on_its_own(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    dx, dw = rms_norm_bwd(x, w, np.ones_like(x))
    want_dx, want_dw = rms_norm_bwd_numpy_f64(x, w, np.ones_like(x))
    assert rel(dx, want_dx) < 1e-5 and rel(dw, want_dw) < 1e-5


def test_a_vjp_naming_something_the_op_lacks_is_refused():
    with pytest.raises(xk.OpDeclarationError, match=r"the vjp takes 'dz', which is neither an "
                                                    r"input, an output nor an output's "
                                                    r"cotangent"):
        xk.Op("xk_tests.bad_vjp", inputs=[xk.Tensor("x", ("f32",))],
              outputs=lambda x: xk.like(x), output_names=("y",),
              vjp=xk.Vjp(rms_norm_bwd, args=("x", "dz"), grads=("x",)),
              kernels={"cpu": xk.Kernel(["a.cc"], "A")})
