"""Torch namespaces of user ops: never the shipped ops' ``xla_kernels``, and a backward
lives beside its forward. (torchax's use of them is in test_torchax.py.)"""

from __future__ import annotations

from pathlib import Path

import torch

import xla_kernels as xk
from xla_kernels.frontends.torch import qualified_name, torch_op
from xla_kernels.kernels import rms_norm as shipped
from xla_kernels.kernels.rms_norm import _backward_rule, _forward_rule

SOURCE = str(Path(shipped.__file__).with_name("rms_norm_cpu.cc"))


def _rms_norm_pair(name: str, backward_name: str) -> tuple[xk.Op, xk.Op]:
    """A user's rms_norm and its backward, on the shipped CPU kernels."""
    backward = xk.Op(backward_name,
                     inputs=[xk.Tensor("x", ("f32",)), xk.Tensor("weight", ("f32",), rank=1),
                             xk.Tensor("dy", ("f32",))],
                     attrs=[xk.Attr("eps", float, default=1e-6)], outputs=_backward_rule,
                     output_names=("dx", "dweight"),
                     kernels={"cpu": xk.Kernel([SOURCE], "XkRmsNormBwdCpu")})
    forward = xk.Op(name, inputs=[xk.Tensor("x", ("f32",)), xk.Tensor("weight", ("f32",), rank=1)],
                    attrs=[xk.Attr("eps", float, default=1e-6)], outputs=_forward_rule,
                    output_names=("y",),
                    vjp=xk.Vjp(backward, args=("x", "weight", "dy"), grads=("x", "weight")),
                    kernels={"cpu": xk.Kernel([SOURCE], "XkRmsNormCpu")})
    return forward, backward


# JAX-style targets without a '.', named like the shipped ops.
user_rms_norm, user_rms_norm_bwd = _rms_norm_pair("rms_norm", "rms_norm_bwd")
# Dotted, for torch_op(..., namespace=...).
spaced_rms_norm, spaced_rms_norm_bwd = _rms_norm_pair("xk_tests.spaced_rms_norm",
                                                      "xk_tests.spaced_rms_norm_bwd")


def _gradients(fn, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(x, w)
    (y * torch.arange(float(y.numel())).reshape(y.shape)).sum().backward()
    return y.detach(), x.grad, w.grad


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def test_a_dotless_user_op_never_takes_the_shipped_namespace():
    assert qualified_name(user_rms_norm) == "xk_user::rms_norm"
    shipped_op = torch_op(shipped.rms_norm)
    user_op = torch_op(user_rms_norm)
    assert user_op is not shipped_op and user_op is torch.ops.xk_user.rms_norm
    x, w = torch.randn(3, 8), torch.randn(8)
    torch.testing.assert_close(user_op(x, w), shipped_op(x, w))


def test_a_user_backward_leaves_the_shipped_ops_autograd_intact():
    x, w = torch.randn(3, 8), torch.randn(8)
    shipped_op = torch_op(shipped.rms_norm)
    user = _gradients(torch_op(user_rms_norm), x, w)
    ours = _gradients(shipped_op, x, w)
    expected = _gradients(_reference, x, w)
    for got in (user, ours):
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_the_backward_op_lives_in_the_forward_namespace():
    op = torch_op(spaced_rms_norm, namespace="xk_tests_spaced")
    x, w = torch.randn(2, 4), torch.randn(4)
    got = _gradients(op, x, w)
    for a, b in zip(got, _gradients(_reference, x, w), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert set(spaced_rms_norm_bwd.record.torch_operators) == {
        "xk_tests_spaced::spaced_rms_norm_bwd"}
