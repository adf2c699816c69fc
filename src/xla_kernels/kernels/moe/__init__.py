"""``fused_moe``: a mixture-of-experts layer in one custom-call, with vLLM's semantics and
weight layout::

    out = fused_moe(hidden, router_logits, w13, w2, *, top_k, renormalize=True,
                    activation="silu")
    out = fused_moe_fp8(hidden, router_logits, w13, w2, w13_scale, w2_scale, *, top_k,
                        renormalize=True, activation="silu", block_shape=(0, 0))

* ``hidden`` [tokens, hidden]; ``router_logits`` [tokens, experts] (f32, bf16 or f16,
  whatever hidden's dtype); ``out`` has hidden's shape and dtype.
* ``w13`` [experts, 2 * intermediate, hidden]: rows ``0 .. intermediate - 1`` are the gate
  projection, the rest the up projection; ``w2`` [experts, hidden, intermediate] (vLLM's
  ``w1``/``w2`` of ``fused_moe``).
* Routing (vLLM's ``fused_topk``): ``p = softmax(router_logits)`` in f32 over the experts;
  the ``top_k`` largest probabilities of each token, equal ones taken lower expert index
  first; with ``renormalize`` they are divided by their sum.
* Per token ``t`` and chosen expert ``e`` with weight ``w``:
  ``g = W13[e] x_t`` (f32 accumulation), ``a = act(g[:I]) * g[I:]`` rounded to hidden's
  dtype (``act``: ``"silu"`` = x sigmoid(x), ``"gelu"`` = exact erf GELU), and
  ``out_t = sum over the token's experts of w * (W2[e] a)``, rounded once to hidden's dtype.
  vLLM also rounds the gate/up rows to the dtype before the activation and each expert's
  weighted output before the sum; here they stay f32 (the CUDA kernel rounds the weighted
  outputs to the dtype, as vLLM does, and sums in f32).
* dtypes: bf16, f16, f32; w13/w2 in hidden's dtype. On CUDA, f32 runs on CUDA cores
  without tiling (for float32 checks, not for speed).
* ``fused_moe_fp8``: weight-only fp8. ``w13``/``w2`` are ``f8e4m3fn`` with f32 scales, the
  weights being the stored values times their scale (vLLM's dequantization):
  ``block_shape=(0, 0)``: one scale per output channel, ``w13_scale`` [experts,
  2 * intermediate, 1], ``w2_scale`` [experts, hidden, 1]; ``block_shape=(bn, bk)``
  (DeepSeek's 128x128): one scale per block of bn output rows x bk input columns,
  ``w13_scale`` [experts, ceil(2 * intermediate / bn), ceil(hidden / bk)], ``w2_scale``
  [experts, ceil(hidden / bn), ceil(intermediate / bk)]. Activations stay in hidden's dtype
  the CUDA kernel rounds each dequantized bf16/f16 weight to that dtype.
* Limits (``moe_limits.h``): experts <= 1024, top_k <= min(32, experts).

Kernels: CPU (``moe_cpu.cc``: the experts one after the other, each over its routed tokens)
and CUDA (``moe.cu``; routing, a counting sort of the pairs by expert, a grouped GEMM with
the activation in its epilogue, a second grouped GEMM weighting its rows, and a per-token
sum; design in docs/design/moe.md). :func:`fused_moe_xla` is the plain-XLA fallback (a loop
over experts), :func:`fused_moe_ragged_dot` the ``jax.lax.ragged_dot`` peer.

Expert parallel: ``fused_moe_ep(hidden, router_logits, w13, w2, expert_offset, ...)`` and
``fused_moe_fp8_ep(..., w13_scale, w2_scale, expert_offset, ...)`` take a block of the
experts (w13/w2 [local experts, ...]) and router_logits with every expert's column [tokens,
global experts]; the int32 scalar ``expert_offset`` is the global id of the first local
expert. Routing runs over all the logits; only the pairs routed to a local expert add to
the output (an offset outside ``0 .. global - local`` just leaves some local experts
without tokens). The sum over the shards is the unsharded call.

Sharding: under plain ``jit`` the tokens split freely across devices and the experts and
the weights' other axes stay whole. Expert and tensor parallel run under ``shard_map``:
:func:`xla_kernels.kernels.moe.parallel.fused_moe_sharded` (docs/kernels/moe.md).

Example:
    >>> import jax.numpy as jnp
    >>> from xla_kernels.kernels.moe import fused_moe
    >>> x = jnp.ones((4, 64), jnp.bfloat16)
    >>> logits = jnp.zeros((4, 8), jnp.float32)
    >>> w13 = jnp.ones((8, 2 * 32, 64), jnp.bfloat16) / 64
    >>> w2 = jnp.ones((8, 64, 32), jnp.bfloat16) / 32
    >>> fused_moe(x, logits, w13, w2, top_k=2).shape               # doctest: +SKIP
    (4, 64)
"""

from __future__ import annotations

from typing import Any

from xla_kernels.attrs import Attr
from xla_kernels.op import CallPlan, Invalid, Kernel, Op, Spec, Tensor, is_symbolic

from .reference import ACTIVATIONS, dequantize, fp8_quantize, fused_moe_ragged_dot, fused_moe_xla
from .reference import route as route_xla
from .workspace import MAX_EXPERTS, MAX_PAIRS, MAX_TOP_K, workspace_sizes

DTYPES = ("bf16", "f16", "f32")
LOGIT_DTYPES = ("f32", "bf16", "f16")
FP8 = "f8e4m3fn"


def _check_routed(router_logits: Spec, tokens: int, experts: int, ep: bool) -> int:
    """The number of experts routing chooses among: router_logits' width."""
    if not ep:
        if router_logits.shape != (tokens, experts):
            raise Invalid("router_logits", f"expected shape ({tokens}, {experts}) (tokens, "
                          f"experts), got {router_logits.shape}",
                          "pass one logit per token and expert (w13's first dimension)")
        return experts
    routed = router_logits.shape[1]
    if router_logits.shape[0] != tokens or not experts <= routed <= MAX_EXPERTS:
        raise Invalid("router_logits", f"expected shape ({tokens}, global experts) with "
                      f"{experts} (w13's local experts) <= global experts <= {MAX_EXPERTS}, "
                      f"got {router_logits.shape}",
                      "pass every expert's logit, not only the local block's")
    return routed


def _check_common(hidden: Spec, router_logits: Spec, w13: Spec, w2: Spec, top_k: int,
                  activation: str, ep: bool = False) -> tuple[int, int, int, int]:
    """(tokens, hidden, experts, intermediate) of a valid call (experts: w13's)."""
    tokens, h = hidden.shape
    experts = w13.shape[0]
    routed = _check_routed(router_logits, tokens, experts, ep)
    if not 1 <= experts <= MAX_EXPERTS:
        raise Invalid("w13", f"{experts} experts: expected 1 to {MAX_EXPERTS}",
                      f"split the experts into groups of at most {MAX_EXPERTS}")
    if w13.shape[1] % 2 or w13.shape[1] == 0 or w13.shape[2] != h:
        raise Invalid("w13", f"expected shape ({experts}, 2 * intermediate, {h}) with "
                      f"intermediate >= 1, got {w13.shape}",
                      "stack each expert's gate and up projections [2 * intermediate, hidden]")
    inter = w13.shape[1] // 2
    if w2.shape != (experts, h, inter):
        raise Invalid("w2", f"expected shape ({experts}, {h}, {inter}) (experts, hidden, "
                      f"intermediate), got {w2.shape}",
                      "pass each expert's down projection [hidden, intermediate]")
    if h < 1:
        raise Invalid("hidden", f"hidden size must be >= 1, got shape {hidden.shape}",
                      "pass rows of at least one element")
    if not 1 <= int(top_k) <= min(routed, MAX_TOP_K):
        raise Invalid("top_k", f"must be in 1 .. {min(routed, MAX_TOP_K)} for {routed} "
                      f"experts, got {int(top_k)}",
                      f"route each token to between 1 and min(experts, {MAX_TOP_K}) experts")
    if not is_symbolic(tokens) and tokens * int(top_k) > MAX_PAIRS:
        raise Invalid("hidden", f"tokens * top_k = {tokens * int(top_k)} is above {MAX_PAIRS}",
                      "split the tokens into several calls")
    if activation not in ACTIVATIONS:
        raise Invalid("activation", f"unknown activation {activation!r}",
                      f"pass one of {', '.join(repr(a) for a in ACTIVATIONS)}")
    return tokens, h, experts, inter


def _outputs(hidden: Spec, top_k: int, experts: int, inter: int) -> list[Spec]:
    tokens, h = hidden.shape
    i32, f32, act = workspace_sizes(tokens, experts, int(top_k), inter, h)
    return [Spec(hidden.shape, hidden.dtype), Spec((i32,), "i32", workspace=True),
            Spec((f32,), "f32", workspace=True), Spec((act,), hidden.dtype, workspace=True)]


def _output_rule(hidden: Spec, router_logits: Spec, w13: Spec, w2: Spec, *, top_k: int,
                 renormalize: bool, activation: str, ep: bool = False) -> list[Spec]:
    """Validate a call; returns [out, i32 workspace, f32 workspace, activation workspace]."""
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype != hidden.dtype:
            raise Invalid(name, f"dtype {w.dtype} differs from hidden's {hidden.dtype}",
                          f"cast {name} to hidden's dtype (fp8 weights: use fused_moe_fp8)")
    _, _, experts, inter = _check_common(hidden, router_logits, w13, w2, top_k, activation, ep)
    return _outputs(hidden, top_k, experts, inter)


def _ep_output_rule(hidden: Spec, router_logits: Spec, w13: Spec, w2: Spec,
                    expert_offset: Spec, *, top_k: int, renormalize: bool,
                    activation: str) -> list[Spec]:
    """Validate an expert-parallel call (the offset's rank and dtype are the declaration's);
    returns the outputs of :func:`_output_rule`."""
    return _output_rule(hidden, router_logits, w13, w2, top_k=top_k, renormalize=renormalize,
                        activation=activation, ep=True)


def scale_shape(experts: int, rows: int, cols: int, block_shape: tuple[int, int]
                ) -> tuple[int, int, int]:
    """The scale array's shape for weights [experts, rows, cols].

    Example:
        >>> scale_shape(8, 1536, 2048, (128, 128)), scale_shape(8, 1536, 2048, (0, 0))
        ((8, 12, 16), (8, 1536, 1))
    """
    bn, bk = block_shape
    if bn == 0:
        return (experts, rows, 1)
    return (experts, -(-rows // bn), -(-cols // bk))


def _fp8_output_rule(hidden: Spec, router_logits: Spec, w13: Spec, w2: Spec, w13_scale: Spec,
                     w2_scale: Spec, *, top_k: int, renormalize: bool, activation: str,
                     block_shape: tuple[int, int], ep: bool = False) -> list[Spec]:
    """Validate an fp8 call; returns the outputs of :func:`_output_rule`."""
    bn, bk = (int(b) for b in block_shape)
    if not ((bn == 0 and bk == 0) or (bn >= 1 and bk >= 1)):
        raise Invalid("block_shape", f"expected (0, 0) (per-channel scales) or two sizes >= 1, "
                      f"got ({bn}, {bk})", "pass block_shape=(128, 128) for DeepSeek-style "
                      "block scales or (0, 0) for one scale per output channel")
    _, h, experts, inter = _check_common(hidden, router_logits, w13, w2, top_k, activation,
                                         ep)
    for name, s, rows, cols in (("w13_scale", w13_scale, 2 * inter, h),
                                ("w2_scale", w2_scale, h, inter)):
        want = scale_shape(experts, rows, cols, (bn, bk))
        if s.shape != want:
            kind = "one per output channel" if bn == 0 else f"one per {bn}x{bk} block"
            raise Invalid(name, f"expected shape {want} ({kind}), got {s.shape}",
                          "pass the scales the weights were quantized with, in vLLM's layout")
    return _outputs(hidden, top_k, experts, inter)


def _fp8_ep_output_rule(hidden: Spec, router_logits: Spec, w13: Spec, w2: Spec,
                        w13_scale: Spec, w2_scale: Spec, expert_offset: Spec, *, top_k: int,
                        renormalize: bool, activation: str,
                        block_shape: tuple[int, int]) -> list[Spec]:
    """Validate an expert-parallel fp8 call; returns the outputs of :func:`_output_rule`."""
    return _fp8_output_rule(hidden, router_logits, w13, w2, w13_scale, w2_scale, top_k=top_k,
                            renormalize=renormalize, activation=activation,
                            block_shape=block_shape, ep=True)


def _sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """Tokens split freely; experts, hidden and intermediate stay whole."""
    scales = ", e a b, e c d" if len(plan.inputs) == 6 else ""
    whole = ("h", "e", "f", "n") + (("a", "b", "c", "d") if scales else ())
    return (f"t h, t e, e f h, e h n{scales} -> t h", {"need_replication_factors": whole})


def _ep_sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """As :func:`_sharding_rule`; router_logits' width (g) is its own factor, the offset a
    scalar."""
    scales = ", e a b, e c d" if len(plan.inputs) == 7 else ""
    whole = ("h", "g", "e", "f", "n") + (("a", "b", "c", "d") if scales else ())
    return (f"t h, t g, e f h, e h n{scales}, -> t h", {"need_replication_factors": whole})


_ATTRS = (
    Attr("top_k", int, doc="experts per token"),
    Attr("renormalize", bool, default=True, doc="divide the top_k weights by their sum"),
    Attr("activation", str, default="silu", doc='"silu" or "gelu" of the gate, times up'),
)
_INPUTS = (
    Tensor("hidden", DTYPES, rank=2, doc="[tokens, hidden]"),
    Tensor("router_logits", LOGIT_DTYPES, rank=2, doc="[tokens, experts]"),
)
_OUTPUT_NAMES = ("out",)

_SCALES = [Tensor("w13_scale", ("f32",), rank=3, doc="per channel or per block"),
           Tensor("w2_scale", ("f32",), rank=3, doc="per channel or per block")]
_FP8_ATTRS = [*_ATTRS, Attr("block_shape", tuple[int, int], default=(0, 0),
                            doc="(0, 0): per output channel scales; (bn, bk): per bn x bk block")]
_GLOBAL_LOGITS = Tensor("router_logits", LOGIT_DTYPES, rank=2, doc="[tokens, global experts]")
_OFFSET = Tensor("expert_offset", ("i32",), rank=0,
                 doc="global id of w13's first expert (int32 scalar)")


def _moe_op(variant: str, inputs: list[Tensor], attrs: list[Attr], outputs: Any,
            sharding_rule: Any, doc: str) -> Op:
    """One of the four variants (fused_moe{,_fp8}{,_ep}): the kernels are the handlers
    XkFusedMoe<Variant>{Cpu,Cuda} of moe_cpu.cc and moe.cu, one binding template each."""
    suffix = "".join(part.capitalize() for part in variant.split("_"))
    return Op(f"xla_kernels.fused_moe{'_' + variant if variant else ''}", inputs=inputs,
              attrs=attrs, outputs=outputs, output_names=_OUTPUT_NAMES,
              sharding_rule=sharding_rule,
              kernels={"cpu": Kernel(["moe_cpu.cc"], handler=f"XkFusedMoe{suffix}Cpu"),
                       "cuda": Kernel(["moe.cu"], handler=f"XkFusedMoe{suffix}Cuda")},
              doc=doc)


fused_moe = _moe_op(
    "",
    [*_INPUTS, Tensor("w13", DTYPES, rank=3, doc="[experts, 2 * intermediate, hidden]: gate, up"),
     Tensor("w2", DTYPES, rank=3, doc="[experts, hidden, intermediate]")],
    list(_ATTRS), _output_rule, _sharding_rule, __doc__ or "")

fused_moe_fp8 = _moe_op(
    "fp8",
    [*_INPUTS, Tensor("w13", (FP8,), rank=3, doc="[experts, 2 * intermediate, hidden] e4m3"),
     Tensor("w2", (FP8,), rank=3, doc="[experts, hidden, intermediate] e4m3"), *_SCALES],
    _FP8_ATTRS, _fp8_output_rule, _sharding_rule,
    "fused_moe with fp8 e4m3 weights and their f32 scales (see fused_moe).")

fused_moe_ep = _moe_op(
    "ep",
    [_INPUTS[0], _GLOBAL_LOGITS,
     Tensor("w13", DTYPES, rank=3, doc="[local experts, 2 * intermediate, hidden]"),
     Tensor("w2", DTYPES, rank=3, doc="[local experts, hidden, intermediate]"), _OFFSET],
    list(_ATTRS), _ep_output_rule, _ep_sharding_rule,
    "fused_moe over a block of the experts (expert parallel; see fused_moe).")

fused_moe_fp8_ep = _moe_op(
    "fp8_ep",
    [_INPUTS[0], _GLOBAL_LOGITS,
     Tensor("w13", (FP8,), rank=3, doc="[local experts, 2 * intermediate, hidden]"),
     Tensor("w2", (FP8,), rank=3, doc="[local experts, hidden, intermediate] e4m3"),
     *_SCALES, _OFFSET],
    _FP8_ATTRS, _fp8_ep_output_rule, _ep_sharding_rule,
    "fused_moe_fp8 over a block of the experts (expert parallel; see fused_moe).")

__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "FP8",
    "dequantize",
    "fp8_quantize",
    "fused_moe",
    "fused_moe_ep",
    "fused_moe_fp8",
    "fused_moe_fp8_ep",
    "fused_moe_ragged_dot",
    "fused_moe_xla",
    "route_xla",
    "scale_shape",
]
