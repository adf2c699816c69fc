"""``linear``: a linear layer's matrix product, ``y = x @ weight.T``::

    y = linear(x, weight)

* ``x`` [tokens, in] (bf16, f16 or f32); ``weight`` [out, in] in x's dtype (torch's
  ``nn.Linear`` layout); ``y`` [tokens, out] in x's dtype: products and sums in f32,
  rounded once.

Kernels: CPU (``linear_cpu.cc``, a reference) and CUDA (``linear.cu``): for bf16 on
compute capability 9.0 CUTLASS's sm90 GEMM (TMA, wgmma, ping-pong warp groups, persistent
tiles; ``linear_sm90.cu``, built where CUTLASS's headers are found:
:mod:`xla_kernels.builder.cutlass`); else for bf16 / f16 the skinny GEMM of
``xla_kernels/gemm/`` (the weight streamed once through shared memory, mma.sync, K split
over a thread-block cluster on sm_90+), for f32 or rows that are not whole 16 bytes a
CUDA-core kernel. docs/design/gemm.md has the measurements against XLA's dot
(:func:`linear_xla`, cuBLAS). :func:`linear_numpy_f64` is the float64 reference.

Sharding: tokens and out split freely (no communication); in stays whole (XLA gathers a
weight split along it).

Example:
    >>> import numpy as np
    >>> linear(np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)).shape  # doctest: +SKIP
    (2, 3)
"""

from __future__ import annotations

import functools

from xla_kernels.builder import cutlass
from xla_kernels.op import CallPlan, Invalid, Kernel, Op, Spec, Tensor

from .reference import linear_numpy_f64, linear_xla

DTYPES = ("bf16", "f16", "f32")


def check_weight_shape(x: Spec, weight: Spec) -> None:
    """The checks every linear layer's shape rule makes: ``weight`` [out, in] with ``in``
    x's last dimension (>= 1) and at least one row (fp8_linear's too)."""
    k = x.shape[-1]
    out, wk = weight.shape
    if wk != k or k < 1:
        raise Invalid("weight", f"expected shape (out, {k}) for x of shape {x.shape} (in = "
                      f"{k} >= 1), got {weight.shape}",
                      "pass the weight as [out, in], in being x's last dimension (transpose "
                      "an [in, out] weight)")
    if out < 1:
        raise Invalid("weight", f"expected at least one output row, got shape {weight.shape}",
                      "pass a weight [out, in] with out >= 1")


def _output_rule(x: Spec, weight: Spec) -> Spec:
    """Validate a call; returns y [tokens, out] in x's dtype."""
    if weight.dtype != x.dtype:
        raise Invalid("weight", f"dtype {weight.dtype} differs from x's {x.dtype}",
                      f"pass the weight in x's dtype ({x.dtype}), e.g. weight.astype(x.dtype)")
    check_weight_shape(x, weight)
    return Spec((x.shape[0], weight.shape[0]), x.dtype)


def _sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """Tokens and out split freely; in stays whole."""
    return "t k, n k -> t n", {"need_replication_factors": ("k",)}


linear = Op(
    "xla_kernels.linear",
    inputs=[Tensor("x", DTYPES, rank=2, doc="[tokens, in]"),
            Tensor("weight", DTYPES, rank=2, doc="[out, in], x's dtype")],
    outputs=_output_rule,
    output_names=("y",),
    sharding_rule=_sharding_rule,
    kernels={"cpu": Kernel(["linear_cpu.cc"], handler="XkLinearCpu"),
             "cuda": Kernel(["linear.cu", "linear_sm90.cu"], handler="XkLinearCuda",
                            include_dirs=cutlass.include_dirs(), arch_specific=True,
                            flags=("-DNDEBUG",))},
    doc=__doc__ or "",
)


def library_answers(op: Op, symbol: str) -> bool:
    """Registers ``op`` for CUDA and returns what its library's C function ``symbol`` (no
    arguments, an int) says: how ops ask whether their library was built with a path (the
    Hopper paths' ``Xk*HasSm90``)."""
    import ctypes

    from xla_kernels.runtime.registry import ensure_registered

    library = ctypes.CDLL(str(ensure_registered(op, "cuda").library))
    return bool(getattr(library, symbol)())


@functools.cache
def hopper_path_built() -> bool:
    """Whether this process's CUDA ``linear`` library was built with its Hopper path (with
    CUTLASS's headers)."""
    return library_answers(linear, "XkLinearHasSm90")


__all__ = ["DTYPES", "check_weight_shape", "hopper_path_built", "library_answers", "linear",
           "linear_numpy_f64", "linear_xla"]
