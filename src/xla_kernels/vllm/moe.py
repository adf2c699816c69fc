"""tpu-inference's MoE layers through xla-kernels' ``fused_moe``, where JAX has no TPU.

tpu-inference runs every MoE layer of both model paths through one function,
``tpu_inference.layers.common.moe.moe_apply(layer, x, gating_output, weights, backend, mesh,
extra)``, whose backends (GMM on its Pallas grouped matmul, the fused EP kernel, megablox)
are Pallas TPU kernels. Off TPU the patches route it to :func:`apply`, which calls
:func:`xla_kernels.kernels.moe.fused_moe` once per layer.

Weights: upstream's ``process_moe_weights`` turns vLLM's layout (``w13`` [experts,
2 * intermediate, hidden], gate rows then up rows; ``w2`` [experts, hidden, intermediate])
into the GMM kernels' (transposed, the intermediate axis padded to 128 and reordered per
tensor-parallel shard). vLLM's layout is ``fused_moe``'s, so off TPU
:func:`keep_vllm_layout` returns the weights as they are: the layout is settled once at load
time, nothing is transposed per step.

Supported: softmax routing, top-k with or without renormalization, gated SiLU, no biases,
bf16/f16/f32 weights, one device. Everything else is refused at load or first trace with
:class:`UnsupportedMoE`, naming the feature and the fix.

``TRACES["fused_moe"]`` counts how often :func:`apply` was traced (once per MoE layer and
compiled batch shape), so a check can prove the compiled model runs our op.
"""

from __future__ import annotations

import math
from collections import Counter

TRACES: Counter[str] = Counter()

ACTIVATIONS = ("silu",)
"""tpu-inference's activation names that :func:`apply` serves (``fused_moe``'s ``silu``)."""


class UnsupportedMoE(NotImplementedError):
    """An MoE feature that xla-kernels' ``fused_moe`` does not serve in vLLM (yet)."""


def _refuse(what: str, fix: str) -> UnsupportedMoE:
    return UnsupportedMoE(f"xla_kernels.vllm MoE (fused_moe): {what} is not supported off "
                          f"TPU. Fix: {fix}")


def _backend_name(moe_backend) -> str:
    return getattr(moe_backend, "value", str(moe_backend))


def _check_backend(moe_backend, tensor_parallel: int) -> None:
    name = _backend_name(moe_backend)
    if name == "gmm_tp" and tensor_parallel <= 1:
        return
    if name in ("gmm_ep", "fused_moe") or tensor_parallel > 1:
        raise _refuse(f"expert or tensor parallel MoE (backend {name}, {tensor_parallel} "
                      f"shards)", "tensor_parallel_size=1 and no enable_expert_parallel / "
                      "USE_MOE_EP_KERNEL")
    raise _refuse(f"MoE backend {name!r}", "unset USE_UNFUSED_MEGABLOCKS (the default GMM "
                  "backend is the one served)")


def _check_unquantized(weights) -> None:
    scales = [n for n in ("w13_weight_scale", "w2_weight_scale")
              if getattr(weights, n, None) is not None]
    if scales:
        raise _refuse(f"quantized expert weights ({', '.join(scales)} set)",
                      "an unquantized (bf16/f32) checkpoint, with MOE_REQUANTIZE_WEIGHT_DTYPE "
                      "unset")
    biases = [n for n in ("w13_bias", "w2_bias") if getattr(weights, n, None) is not None]
    if biases:
        raise _refuse(f"expert biases ({', '.join(biases)})", "a model without MoE biases "
                      "(fused_moe has none)")


def keep_vllm_layout(weights, moe_backend, w13_reorder_size=None, w13_interleave=False):
    """What :func:`tpu_inference...moe_weights.process_moe_weights` returns off TPU: the
    weights in vLLM's layout (``fused_moe``'s), gate/up rows de-interleaved when the
    checkpoint interleaves them (``w13_interleave``, as upstream does)."""
    import jax.numpy as jnp

    _check_backend(moe_backend, int(w13_reorder_size or 1))
    _check_unquantized(weights)
    w13 = weights.w13_weight
    if w13_interleave:
        w13 = jnp.concatenate([w13[:, ::2, :], w13[:, 1::2, :]], axis=1)
    return type(weights)(w13_weight=jnp.asarray(w13), w13_weight_scale=None, w13_bias=None,
                         w2_weight=jnp.asarray(weights.w2_weight), w2_weight_scale=None,
                         w2_bias=None)


def _activation(layer) -> str:
    activation = getattr(layer, "activation", "silu")
    return str(getattr(activation, "value", activation))


def _check_layer(layer, extra: dict) -> None:
    scoring = getattr(layer, "scoring_func", "softmax")
    if scoring != "softmax":
        raise _refuse(f"{scoring!r} expert scoring", "a model with softmax routing "
                      "(fused_moe routes by softmax(router_logits))")
    if getattr(layer, "use_grouped_topk", False):
        raise _refuse("grouped top-k routing (num_expert_group/topk_group)",
                      "a model with plain top-k routing")
    if getattr(layer, "custom_routing_function", None) is not None:
        raise _refuse("a custom routing function", "a model with softmax top-k routing")
    if extra.get("e_score_correction_bias") is not None:
        raise _refuse("an expert score correction bias", "a model without "
                      "e_score_correction_bias")
    if extra.get("hash_based_topk_indices") is not None:
        raise _refuse("hash-based expert routing", "a model with softmax top-k routing")
    if extra.get("scatter_results"):
        raise _refuse("attention data parallel (scattered MoE results)",
                      "data_parallel_size=1")
    if (getattr(layer, "apply_router_weight_on_input", False)
            or getattr(layer, "apply_expert_weight_before_computation", False)):
        raise _refuse("router weights applied to the input", "a model that weights the "
                      "experts' outputs")
    activation = _activation(layer)
    if activation not in ACTIVATIONS:
        raise _refuse(f"activation {activation!r}", f"a model whose experts use one of "
                      f"{ACTIVATIONS}")
    limit = getattr(layer, "swiglu_limit", None)
    if limit is not None and limit > 0:
        raise _refuse(f"a clamped SwiGLU (swiglu_limit={limit})", "a model without "
                      "swiglu_limit")


def _check_layout(w13, w2) -> tuple[int, int]:
    """(hidden, intermediate) of weights in vLLM's layout. Upstream's GMM layout ([experts,
    hidden, 2 * padded_intermediate] and [experts, padded_intermediate, hidden]) can never
    pass this test (it would need an intermediate size of 0)."""
    experts, two_inter, hidden = w13.shape
    if w2.shape != (experts, hidden, two_inter // 2) or two_inter % 2:
        raise _refuse(f"expert weights w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)} not in "
                      "vLLM's layout ([E, 2I, H], [E, H, I]); they were processed for a TPU "
                      "kernel", "let xla_kernels.vllm's patches apply at start-up (vLLM's "
                      "general plugins; XLA_KERNELS_VLLM unset)")
    return hidden, two_inter // 2


def apply(upstream, layer, x, gating_output, weights, moe_backend, mesh,
          extra_backend_kwargs):
    """``moe_apply``'s contract through ``fused_moe``: ``x`` [tokens, hidden],
    ``gating_output`` the router logits [tokens, experts]; returns [tokens, hidden] in
    ``x``'s dtype. The dense backend (plain XLA, ``USE_DENSE_MOE``) goes to ``upstream``.
    Of the backend options in ``extra_backend_kwargs``, these need nothing on one device and
    are ignored: ``moe_chunk_size`` (upstream's GMM splits the tokens into chunks of it),
    ``defer_all_reduce`` (nothing to reduce), ``activation_dtype`` (all-gather dtype) and
    ``num_valid_tokens`` (routes padding rows to expert 0; their outputs are discarded)."""
    from xla_kernels.kernels.moe import fused_moe

    if _backend_name(moe_backend) == "dense_mat":
        return upstream(layer, x, gating_output, weights, moe_backend, mesh,
                        extra_backend_kwargs)
    devices = math.prod(dict(mesh.shape).values()) if mesh is not None else 1
    _check_backend(moe_backend, devices)
    _check_unquantized(weights)
    _check_layer(layer, dict(extra_backend_kwargs or {}))
    _check_layout(weights.w13_weight, weights.w2_weight)
    TRACES["fused_moe"] += 1
    w13, w2 = weights.w13_weight, weights.w2_weight
    return fused_moe(x.astype(w13.dtype), gating_output, w13, w2, top_k=int(layer.top_k),
                     renormalize=bool(layer.renormalize), activation="silu").astype(x.dtype)
