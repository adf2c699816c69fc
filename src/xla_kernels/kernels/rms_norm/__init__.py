"""``rms_norm``: RMS normalization with a declared backward, differentiable in JAX and torch.

::

    y = rms_norm(x, weight, *, eps=1e-6)     # x [..., hidden], weight [hidden]
    y = x / sqrt(mean(x ** 2, axis=-1) + eps) * weight

f32, bf16 and f16 (and f64 on the CPU), accumulating in f32 (f64 for f64). The backward is
its own op, ``rms_norm_bwd(x, weight, dy, *, eps) -> (dx, dweight)``, declared as the
forward's :class:`~xla_kernels.Vjp`: ``jax.grad``, ``jax.vjp`` (and ``jax.vmap`` of them)
and ``torch.autograd`` (eager and ``torch.compile``) all run it. CPU and CUDA kernels for
both; :func:`rms_norm_numpy_f64` and :func:`rms_norm_bwd_numpy_f64` are the references.

Example:
    >>> import jax, jax.numpy as jnp
    >>> x, w = jnp.ones((2, 8)), jnp.full((8,), 2.0)
    >>> rms_norm(x, w, eps=0.0)                                # doctest: +SKIP
    Array([[2., 2., ...]], dtype=float32)
    >>> jax.grad(lambda w: rms_norm(x, w).sum())(w).shape     # doctest: +SKIP
    (8,)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xla_kernels.attrs import Attr
from xla_kernels.op import Invalid, Kernel, Op, Spec, Tensor, Vjp, like

DTYPES = ("f32", "bf16", "f16", "f64")
_CUDA_DTYPES = ("f32", "bf16", "f16")


def _check(x: Spec, weight: Spec, eps: float) -> None:
    if weight.dtype != x.dtype:
        raise Invalid("weight", f"dtype {weight.dtype} differs from x's {x.dtype}",
                      "cast weight to x's dtype")
    if x.ndim < 1 or weight.shape != (x.shape[-1],):
        raise Invalid("weight", f"expected shape ({x.shape[-1] if x.ndim else '?'},) for x of "
                      f"shape {x.shape}, got {weight.shape}",
                      "pass one weight per element of x's last dimension")
    if not float(eps) >= 0:
        raise Invalid("eps", f"must be >= 0, got {float(eps)}", "pass e.g. eps=1e-6")


def _backward_rule(x: Spec, weight: Spec, dy: Spec, *, eps: float) -> list[Spec]:
    _check(x, weight, eps)
    if (dy.shape, dy.dtype) != (x.shape, x.dtype):
        raise Invalid("dy", f"expected x's shape {x.shape} and dtype {x.dtype}, got "
                      f"{dy.shape} {dy.dtype}", "pass the cotangent of y")
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    return [like(x), like(weight), Spec((max(rows, 1),), "f32", workspace=True)]


rms_norm_bwd = Op(
    "xla_kernels.rms_norm_bwd",
    inputs=[Tensor("x", DTYPES), Tensor("weight", DTYPES, rank=1), Tensor("dy", DTYPES)],
    attrs=[Attr("eps", float, default=1e-6)],
    outputs=_backward_rule,
    output_names=("dx", "dweight"),
    kernels={"cpu": Kernel(["rms_norm_cpu.cc"], handler="XkRmsNormBwdCpu"),
             "cuda": Kernel(["rms_norm.cu"], handler="XkRmsNormBwdCuda", dtypes=_CUDA_DTYPES)},
    doc="The gradients of rms_norm: (dx, dweight) from x, weight and dy.",
)


def _forward_rule(x: Spec, weight: Spec, *, eps: float) -> Spec:
    _check(x, weight, eps)
    return like(x)


rms_norm = Op(
    "xla_kernels.rms_norm",
    inputs=[Tensor("x", DTYPES, doc="[..., hidden]"),
            Tensor("weight", DTYPES, rank=1, doc="[hidden]")],
    attrs=[Attr("eps", float, default=1e-6, doc="added to mean(x^2)")],
    outputs=_forward_rule,
    output_names=("y",),
    # Rows split freely; a row's hidden dimension must be whole on one device.
    sharding_rule=("... h, h -> ... h", {"need_replication_factors": ("h",)}),
    vjp=Vjp(rms_norm_bwd, args=("x", "weight", "dy"), grads=("x", "weight")),
    kernels={"cpu": Kernel(["rms_norm_cpu.cc"], handler="XkRmsNormCpu"),
             "cuda": Kernel(["rms_norm.cu"], handler="XkRmsNormCuda", dtypes=_CUDA_DTYPES)},
    doc=__doc__ or "",
)


def _fused_add_rule(x: Spec, residual: Spec, weight: Spec, *, eps: float) -> list[Spec]:
    if (residual.shape, residual.dtype) != (x.shape, x.dtype):
        raise Invalid("residual", f"expected x's shape {x.shape} and dtype {x.dtype}, got "
                      f"{residual.shape} {residual.dtype}",
                      "pass the residual stream x is added to, of x's shape and dtype")
    _check(x, weight, eps)
    return [like(x), like(x)]


fused_add_rms_norm = Op(
    "xla_kernels.fused_add_rms_norm",
    inputs=[Tensor("x", DTYPES, doc="[..., hidden], e.g. a layer's output"),
            Tensor("residual", DTYPES, doc="[..., hidden], the residual stream x is added to"),
            Tensor("weight", DTYPES, rank=1, doc="[hidden]")],
    attrs=[Attr("eps", float, default=1e-6, doc="added to mean(s^2)")],
    outputs=_fused_add_rule,
    output_names=("out", "residual_out"),
    # Rows split freely; a row's hidden dimension must be whole on one device.
    sharding_rule=("... h, ... h, h -> ... h, ... h", {"need_replication_factors": ("h",)}),
    kernels={"cpu": Kernel(["rms_norm_cpu.cc"], handler="XkFusedAddRmsNormCpu"),
             "cuda": Kernel(["rms_norm.cu"], handler="XkFusedAddRmsNormCuda",
                            dtypes=_CUDA_DTYPES)},
    doc="""The residual add and the rms_norm after it, in one kernel (vLLM's
``fused_add_rms_norm``, functional)::

    out, residual_out = fused_add_rms_norm(x, residual, weight, *, eps=1e-6)
    residual_out = x + residual                     # rounded to the dtype
    out = rms_norm(residual_out, weight, eps=eps)

Both are bit for bit what the two steps give: the sum is computed in the accumulation
type and rounded once to the dtype (as XLA's add), then normalized with rms_norm's own
arithmetic (on CUDA its reduction order too). Rows are read once. No backward is declared.
:func:`fused_add_rms_norm_numpy_f64` is the reference.""",
)


def rms_norm_numpy_f64(x: Any, weight: Any, *, eps: float = 1e-6) -> np.ndarray:
    """The forward in float64 NumPy."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(weight,
                                                                                  np.float64)


def rms_norm_bwd_numpy_f64(x: Any, weight: Any, dy: Any, *, eps: float = 1e-6
                           ) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dweight) in float64 NumPy, derived by hand from the forward."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, weight, dy))
    n = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    dot = np.sum(w * dy * x, axis=-1, keepdims=True)
    dx = r * w * dy - x * r ** 3 * dot / n
    dw = np.sum((dy * x * r).reshape(-1, n), axis=0)
    return dx, dw


def fused_add_rms_norm_numpy_f64(x: Any, residual: Any, weight: Any, *, eps: float = 1e-6
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """(out, residual_out) in float64 NumPy, the sum rounded to x's dtype first (as the op
    and the unfused model do): rounding the sum is part of the op's definition."""
    x = np.asarray(x)
    total = (x.astype(np.float64) + np.asarray(residual, np.float64)).astype(x.dtype)
    return rms_norm_numpy_f64(total, weight, eps=eps), total.astype(np.float64)


__all__ = ["DTYPES", "fused_add_rms_norm", "fused_add_rms_norm_numpy_f64", "rms_norm",
           "rms_norm_bwd", "rms_norm_bwd_numpy_f64", "rms_norm_numpy_f64"]
