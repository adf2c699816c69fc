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

Tensor parallel (GMM_TP, the default backend, on the runner's mesh axis ``model``): as
upstream does, each device holds every expert's slice of the intermediate dimension (w13's
gate and up rows of its slice, w2's matching columns) and the partial outputs are summed
over that axis. :func:`keep_vllm_layout` lays w13's rows out for that split once
(``interleave_w13``), the patched ``shard_moe_weights`` places the slices
(:func:`shard_vllm_layout`), and :func:`apply` runs
:func:`xla_kernels.kernels.moe.parallel.fused_moe_sharded` (shard_map, one psum).

Supported: softmax routing, top-k with or without renormalization, gated SiLU, no biases,
bf16/f16/f32 weights, one device or tensor parallel (no expert or data parallel MoE).
Everything else is refused at load or first trace with :class:`UnsupportedMoE`, naming the
feature and the fix.

``TRACES["fused_moe"]`` counts how often :func:`apply` was traced (once per MoE layer and
compiled batch shape), so a check can prove the compiled model runs our op;
``TRACES["fused_moe_sharded"]`` counts those of them that ran split over the tensor axis.
"""

from __future__ import annotations

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


def _check_backend(moe_backend) -> None:
    name = _backend_name(moe_backend)
    if name == "gmm_tp":
        return
    if name in ("gmm_ep", "fused_moe"):
        raise _refuse(f"expert parallel MoE (backend {name})", "no enable_expert_parallel / "
                      "USE_MOE_EP_KERNEL (tensor parallel, the default GMM backend, is "
                      "served)")
    raise _refuse(f"MoE backend {name!r}", "unset USE_UNFUSED_MEGABLOCKS (the default GMM "
                  "backend is the one served)")


def _split_axis(mesh, axes, what: str, fix: str) -> str | None:
    """The one axis among ``axes`` (a mesh axis name or a tuple of them, as tpu-inference's
    ``ShardingAxisName`` gives) that splits ``mesh`` (size > 1), or None when none does."""
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    split = [a for a in names if a in mesh.axis_names and int(mesh.shape[a]) > 1]
    if len(split) > 1:
        raise _refuse(f"{what} split over several mesh axes {split}", fix)
    return split[0] if split else None


def tensor_axis(mesh) -> str | None:
    """The mesh axis that upstream's GMM_TP backend splits the experts' intermediate
    dimension over (``ShardingAxisName.MLP_TENSOR``: ``model`` on the runner's 2D mesh), or
    None when nothing is split. Devices on any other axis are refused (data parallel MoE)."""
    if mesh is None:
        return None
    from tpu_inference.layers.common.sharding import ShardingAxisName

    axis = _split_axis(mesh, ShardingAxisName.MLP_TENSOR, "the MoE intermediate dimension",
                       "a mesh with one tensor-parallel axis (tensor_parallel_size only)")
    others = {a: int(n) for a, n in dict(mesh.shape).items() if a != axis and int(n) > 1}
    if others:
        raise _refuse(f"data or expert parallel MoE (mesh axes {others})",
                      "data_parallel_size=1 (tensor_parallel_size is served)")
    return axis


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
    checkpoint interleaves them (``w13_interleave``, as upstream does). Under tensor
    parallel (``w13_reorder_size`` = the tensor-parallel degree, as upstream passes it for
    GMM_TP) w13's rows are laid out once here by ``interleave_w13``: a contiguous split of
    axis 1 over the devices then gives each its gate rows and up rows, as upstream's
    reorder does for its kernels."""
    import jax.numpy as jnp

    from xla_kernels.kernels.moe.parallel import interleave_w13

    _check_backend(moe_backend)
    _check_unquantized(weights)
    w13 = weights.w13_weight
    if w13_interleave:
        w13 = jnp.concatenate([w13[:, ::2, :], w13[:, 1::2, :]], axis=1)
    tp = int(w13_reorder_size or 1)
    if tp > 1:
        w13 = interleave_w13(w13, tp)
    return type(weights)(w13_weight=jnp.asarray(w13), w13_weight_scale=None, w13_bias=None,
                         w2_weight=jnp.asarray(weights.w2_weight), w2_weight_scale=None,
                         w2_bias=None)


def shard_vllm_layout(weights, mesh):
    """What ``shard_moe_weights`` does off TPU for GMM_TP: places the weights on ``mesh``,
    w13 [E, 2I, H] split along its rows and w2 [E, H, I] along its columns over
    :func:`tensor_axis` (upstream's specs are for its transposed layout and would split the
    hidden dimension of ours), so each step runs with the weights where they stay."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    axis = tensor_axis(mesh)
    weights.w13_weight = jax.device_put(weights.w13_weight,
                                        NamedSharding(mesh, P(None, axis, None)))
    weights.w2_weight = jax.device_put(weights.w2_weight,
                                       NamedSharding(mesh, P(None, None, axis)))
    return weights


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
    Under tensor parallel (:func:`tensor_axis` of ``mesh``) the weights are those of
    :func:`keep_vllm_layout` and :func:`shard_vllm_layout` and the layer runs through
    ``fused_moe_sharded``, whose output is already summed over the devices.
    Of the backend options in ``extra_backend_kwargs``, these are ignored:
    ``moe_chunk_size`` (upstream's GMM splits the tokens into chunks of it),
    ``activation_dtype`` (all-gather dtype) and ``num_valid_tokens`` (routes padding rows
    to expert 0; their outputs are discarded); ``defer_all_reduce`` needs nothing on one
    device and is refused under tensor parallel (the sum is not deferred)."""
    from xla_kernels.kernels.moe import fused_moe
    from xla_kernels.kernels.moe.parallel import fused_moe_sharded

    if _backend_name(moe_backend) == "dense_mat":
        return upstream(layer, x, gating_output, weights, moe_backend, mesh,
                        extra_backend_kwargs)
    extra = dict(extra_backend_kwargs or {})
    _check_backend(moe_backend)
    _check_unquantized(weights)
    _check_layer(layer, extra)
    _check_layout(weights.w13_weight, weights.w2_weight)
    axis = tensor_axis(mesh)
    if axis is not None and extra.get("defer_all_reduce"):
        raise _refuse("defer_all_reduce (per-shard partial sums)", "a caller that takes the "
                      "reduced output (fused_moe_sharded sums over the tensor-parallel axis)")
    TRACES["fused_moe"] += 1
    w13, w2 = weights.w13_weight, weights.w2_weight
    options = dict(top_k=int(layer.top_k), renormalize=bool(layer.renormalize),
                   activation="silu")
    if axis is None:
        out = fused_moe(x.astype(w13.dtype), gating_output, w13, w2, **options)
    else:
        TRACES["fused_moe_sharded"] += 1
        out = fused_moe_sharded(x.astype(w13.dtype), gating_output, w13, w2, mesh=mesh,
                                tensor_axis=axis, w13_interleaved=True, **options)
    return out.astype(x.dtype)
