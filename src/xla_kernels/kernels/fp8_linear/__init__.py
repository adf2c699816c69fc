"""``fp8_linear``: a linear layer with fp8 e4m3 weights (vLLM's fp8 checkpoints)::

    y = fp8_linear(x, weight, weight_scale, *, block_shape=(0, 0), activation_scheme="none")

* ``x`` [tokens, in] (bf16, f16 or f32); ``weight`` [out, in] ``f8e4m3fn``; ``y`` [tokens,
  out] in x's dtype, ``y = x @ W.T`` with ``W = weight * scale`` (the weight times its
  scale, :mod:`xla_kernels.kernels.fp8_weights`).
* ``weight_scale`` f32: ``block_shape=(0, 0)``: one per output channel, [out, 1];
  ``block_shape=(bn, bk)``: one per bn x bk block (DeepSeek's 128 x 128),
  [ceil(out / bn), ceil(in / bk)]; the last blocks may be partial.
* ``activation_scheme="none"`` (W8A16): ``y[t, o] = sum_i x[t, i] * W[o, i]``, products and
  sum in f32, rounded once to x's dtype.
* ``activation_scheme="dynamic"`` (W8A8, per-token dynamic scales): each row of x is
  quantized to e4m3 first, in f32: ``a_t = max_i |x[t, i]|``, ``s_t = max(a_t, 1e-12) *
  r`` with ``r`` the f32 nearest to 1 / 448, ``q[t, i] = e4m3(x[t, i] / s_t)`` (f32
  division, rounded to nearest even, saturated to +-448); then ``y[t, o] = s_t * sum_i
  q[t, i] * W[o, i]``, in f32, rounded once to x's dtype. (vLLM's per-token quantization,
  with a division of x by s_t where vLLM multiplies by its reciprocal.)

Kernels: CPU (``fp8_linear_cpu.cc``) and CUDA (``fp8_linear.cu``): on compute capability 9.0,
bf16 x with per-channel scales and no activation scheme runs CUTLASS's mixed-input Hopper GEMM
(``fp8_linear_sm90.cu``; built where CUTLASS's headers are found, :func:`hopper_path_built`;
stream-K, its partial sums in the workspace output, where ``in`` >= 8192);
elsewhere tensor cores for bf16 /
f16 x with ``in`` a multiple of 128 (``fp8_linear_mma.cuh``: mma.sync, W8A8 on sm_89+, K
split over CTAs into the f32 workspace output), CUDA cores for the rest; design and
measurements in docs/kernels/fp8_linear.md. The workspace (:func:`workspace_elements`) is
an output the callers never see. :func:`fp8_linear_numpy_f64` is the float64
reference; :func:`fp8_linear_xla` is the plain-XLA path
(dequantize then dot for ``"none"``; for ``"dynamic"`` ``jax.lax.dot_general`` on the
float8 operands with f32 results, then the scales: what XLA:GPU hands to cuBLASLt's fp8
GEMM).

Sharding: tokens split freely. The out axis (column parallel) splits with the weight's rows
and their scales, without communication: per-channel scales always, block scales when out
is a multiple of bn (whole blocks per device). The in axis (row parallel) would need a sum
across devices (and "dynamic" the row's amax): it stays whole, XLA gathers a weight split
along it.

Example:
    >>> import numpy as np
    >>> from xla_kernels.kernels.fp8_weights import fp8_quantize
    >>> w, s = fp8_quantize(np.ones((6, 32), np.float32), (0, 0))
    >>> fp8_linear(np.ones((3, 32), np.float32), w, s).shape          # doctest: +SKIP
    (3, 6)
"""

from __future__ import annotations

import functools

from xla_kernels.attrs import Attr
from xla_kernels.builder import cutlass
from xla_kernels.kernels.fp8_weights import block_scale_shape, dequantize, fp8_quantize
from xla_kernels.kernels.linear import check_weight_shape, library_answers
from xla_kernels.op import CallPlan, Invalid, Kernel, Op, Spec, Tensor

from .reference import SCHEMES, fp8_linear_numpy_f64, fp8_linear_xla, quantize_activations

DTYPES = ("bf16", "f16", "f32")
FP8 = "f8e4m3fn"


def workspace_elements(tokens: int, k: int, out: int, dtype: str, activation_scheme: str) -> int:
    """f32 elements of the CUDA kernel's workspace (the twin of ``WorkspaceElements`` in
    fp8_linear_ffi.h). It serves one path per call: the tensor-core path's f32 sums
    [tokens, out], the token scales and x in the GEMM's stage order (e4m3 for "dynamic", else 2
    bytes per element); W8A8 on the Hopper path, the token scales and e4m3 x row-major (fewer
    bytes); or the Hopper stream-K schedule's partial sums, one f32 tile per split
    output tile (tokens rounded up to the 64-token tile, out to the 128-row tile) and its
    barriers (8 bytes per tile of 128 x 16), each area rounded to a 128-byte line. f32 x runs on
    CUDA cores: 1. No comparisons of sizes, so a symbolic token count (``xk.export``) goes
    through.

    Example:
        >>> workspace_elements(2, 256, 8, "bf16", "dynamic")
        8397
        >>> workspace_elements(2, 256, 8, "bf16", "none")
        8525
    """
    if dtype == "f32":
        return 1
    padded_tiles = (tokens + 63) // 64 * 64 * ((out + 127) // 128 * 128)
    x_bytes = tokens * k * (1 if activation_scheme == "dynamic" else 2)
    return (padded_tiles + tokens + 3) // 4 * 4 + (x_bytes + 3) // 4 + 1 + padded_tiles // 1024 + 64


def _output_rule(x: Spec, weight: Spec, weight_scale: Spec, *, block_shape: tuple[int, int],
                 activation_scheme: str) -> list[Spec]:
    """Validate a call; returns [y [tokens, out] in x's dtype, the f32 workspace]."""
    check_weight_shape(x, weight)
    tokens, k = x.shape
    out = weight.shape[0]
    bn, bk = (int(b) for b in block_shape)
    if not ((bn == 0 and bk == 0) or (bn >= 1 and bk >= 1)):
        raise Invalid("block_shape", f"expected (0, 0) (per-channel scales) or two sizes >= 1, "
                      f"got ({bn}, {bk})", "pass block_shape=(128, 128) for DeepSeek-style "
                      "block scales or (0, 0) for one scale per output channel")
    want = block_scale_shape(out, k, (bn, bk))
    if weight_scale.shape != want:
        kind = "one per output channel" if bn == 0 else f"one per {bn}x{bk} block"
        raise Invalid("weight_scale", f"expected shape {want} ({kind}) for a weight of shape "
                      f"{weight.shape} and block_shape ({bn}, {bk}), got {weight_scale.shape}",
                      "pass the scales the weight was quantized with, in vLLM's layout, and "
                      "their block_shape")
    if activation_scheme not in SCHEMES:
        raise Invalid("activation_scheme", f"unknown scheme {activation_scheme!r}",
                      f"pass one of {', '.join(repr(s) for s in SCHEMES)}")
    workspace = workspace_elements(tokens, k, out, x.dtype, activation_scheme)
    return [Spec((tokens, out), x.dtype), Spec((workspace,), "f32", workspace=True)]


def _sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """Tokens split freely; out splits with the weight's rows and their scales (whole
    blocks); in stays whole."""
    out = plan.inputs[1].shape[0]
    bn = int(plan.attrs["block_shape"][0])
    if bn == 0:
        return "t k, n k, n o -> t n", {"need_replication_factors": ("k", "o")}
    if out % bn == 0:
        # out = (blocks, rows per block): a device holds whole blocks and their scales.
        return ("t k, (a r) k, a b -> t (a r)",
                {"r": bn, "need_replication_factors": ("k", "r", "b")})
    return "t k, n k, a b -> t n", {"need_replication_factors": ("k", "n", "a", "b")}


fp8_linear = Op(
    "xla_kernels.fp8_linear",
    inputs=[Tensor("x", DTYPES, rank=2, doc="[tokens, in]"),
            Tensor("weight", (FP8,), rank=2, doc="[out, in] e4m3"),
            Tensor("weight_scale", ("f32",), rank=2,
                   doc="[out, 1] per channel, or [ceil(out / bn), ceil(in / bk)] per block")],
    attrs=[Attr("block_shape", tuple[int, int], default=(0, 0),
                doc="(0, 0): per output channel scales; (bn, bk): per bn x bk block"),
           Attr("activation_scheme", str, default="none",
                doc='"none": weight-only (W8A16); "dynamic": x quantized per token (W8A8)')],
    outputs=_output_rule,
    output_names=("y",),
    sharding_rule=_sharding_rule,
    kernels={"cpu": Kernel(["fp8_linear_cpu.cc"], handler="XkFp8LinearCpu"),
             "cuda": Kernel(["fp8_linear.cu", "fp8_linear_sm90.cu"], handler="XkFp8LinearCuda",
                            include_dirs=cutlass.include_dirs(), arch_specific=True,
                            flags=("-DNDEBUG",))},
    doc=__doc__ or "",
)


@functools.cache
def hopper_path_built() -> bool:
    """Whether this process's CUDA ``fp8_linear`` library was built with its Hopper path (with
    CUTLASS's headers)."""
    return library_answers(fp8_linear, "XkFp8LinearHasSm90")


__all__ = [
    "DTYPES",
    "FP8",
    "SCHEMES",
    "block_scale_shape",
    "dequantize",
    "fp8_linear",
    "fp8_linear_numpy_f64",
    "fp8_linear_xla",
    "fp8_quantize",
    "hopper_path_built",
    "quantize_activations",
    "workspace_elements",
]
