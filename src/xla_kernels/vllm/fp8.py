"""tpu-inference's fp8 linear layers through xla-kernels' ``fp8_linear``, where JAX has no TPU.

Every (non-batched) fp8 linear layer of tpu-inference ends in one of two methods of
``tpu_inference.layers.common.quantization.fp8.Fp8LinearMethod``: ``_apply_fused(x, weight,
weight_scale, bias)`` (one weight for the layer, q/k/v or gate/up concatenated along the
output axis) and ``_apply_split(x, [(weight, weight_scale), ...], bias, mesh)`` (one weight
per output shard). vLLM's PyTorch models reach them through ``VllmFp8LinearMethod.apply``,
the JAX-native models through ``Fp8TensorwiseLinearMethod`` / ``Fp8BlockwiseLinearMethod``
``.apply_jax`` (except a batched einsum, ``batch_features``, which stays upstream's
``sharded_quantized_batched_matmul``). Upstream runs ``sharded_quantized_matmul`` there
(an XLA dot on the fp8 weight, the activations quantized per token first). Off TPU the
patches route both to :func:`apply_fused` / :func:`apply_split`, one ``fp8_linear`` call per
weight.

Layout: tpu-inference loads the checkpoint's weight [out, in] and keeps it transposed,
``weight`` [in, out] ``float8_e4m3fn``, with the scales as its processing left them:

* per-tensor checkpoint scales (``weight_scale``, one per q/k/v or gate/up shard) expanded
  to one per output column, ``weight_scale`` [out] f32: ``fp8_linear``'s per-channel
  scales ([out, 1]);
* 128 x 128 block scales kept as blocks (the block-scale patch, :func:`keep_weight_blocks`),
  ``weight_scale`` [in / bk, out / bn] f32: ``fp8_linear``'s block scales, transposed.

:func:`linear` hands ``fp8_linear`` the weight [out, in], and both model paths store it that
way once, at load: a ``weight.T`` inside the step compiles to a ``transpose_copy_fusion``
feeding each ``fp8_linear`` call, so every step would read and write each weight once more.
vLLM's PyTorch models: :func:`store_weights_out_in`, after upstream's processing of each
layer; the JAX-native models: :func:`store_model_weights_out_in`, once the whole model is
loaded (their loader may process a layer before all of its shards have arrived).
Activations stay in the model's dtype (W8A16, ``activation_scheme="none"``),
as vLLM runs fp8 checkpoints where the GPU has no fp8 tensor cores (Marlin;
tpu-inference's method sets ``use_marlin``).

Refused with :class:`UnsupportedFp8`, naming the feature and the fix: scales in the
quantized-matmul kernel's layout (``ENABLE_QUANTIZED_MATMUL_KERNEL``), weights requantized
to another dtype (``REQUANTIZE_WEIGHT_DTYPE``) or block size (``REQUANTIZE_BLOCK_SIZE``),
blocks that would straddle fused or tensor-parallel shards, and a deferred all-reduce over
a split input axis.

``TRACES["fp8_linear"]`` counts the ``fp8_linear`` calls traced (one per weight and compiled
batch shape), so a check can prove the compiled model runs our op; of those,
``TRACES[TRANSPOSED_IN_THE_STEP]`` counts the ones on a weight left [in, out], which the step
transposes (none when the load-time transposes above ran).
"""

from __future__ import annotations

from collections import Counter

TRACES: Counter[str] = Counter()
TRANSPOSED_IN_THE_STEP = "fp8_linear on a weight transposed in the step"


class UnsupportedFp8(NotImplementedError):
    """An fp8 linear layer that xla-kernels' ``fp8_linear`` does not serve in vLLM (yet)."""


def _refuse(what: str, fix: str) -> UnsupportedFp8:
    return UnsupportedFp8(f"xla_kernels.vllm fp8 linear (fp8_linear): {what} is not supported "
                          f"off TPU. Fix: {fix}")


def block_size(method) -> tuple[int, int] | None:
    """The checkpoint's ``weight_block_size`` (bn, bk) that ``method`` (vLLM's or the JAX
    path's fp8 linear method) was made with, or None (per-tensor scales)."""
    size = getattr(method, "weight_block_size", None)
    if size is None:
        size = getattr(getattr(method, "quant_config", None), "weight_block_size", None)
    return None if size is None else (int(size[0]), int(size[1]))


WEIGHT_OUT_IN = "_xla_kernels_weight_out_in"
"""Set on an fp8 linear method by :func:`store_weights_out_in`: its layer's weights are
[out, in]."""


def linear(x, weight, weight_scale, block: tuple[int, int] | None, out_in: bool = False):
    """``x [..., in] @ (weight * scale)`` with tpu-inference's processed ``weight`` (e4m3,
    [in, out] as upstream leaves it, or [out, in] with ``out_in``) and ``weight_scale``
    ([out] per output column, or [in / bk, out / bn] per block), through one ``fp8_linear``
    call; the result [..., out] in x's dtype."""
    import jax.numpy as jnp

    from xla_kernels.kernels.fp8_linear import fp8_linear

    layout = "[out, in]" if out_in else "[in, out]"
    if weight.ndim != 2 or weight.dtype != jnp.float8_e4m3fn:
        raise _refuse(f"a weight of shape {tuple(weight.shape)} and dtype {weight.dtype} (e4m3 "
                      f"{layout} expected)", "leave REQUANTIZE_WEIGHT_DTYPE unset (its default "
                      "float8_e4m3fn is what fp8_linear takes)")
    out, k = weight.shape if out_in else weight.shape[::-1]
    if weight_scale is None or weight_scale.ndim not in (1, 2):
        shape = None if weight_scale is None else tuple(weight_scale.shape)
        raise _refuse(f"weight scales of shape {shape} (the quantized matmul kernel's layout)",
                      "leave ENABLE_QUANTIZED_MATMUL_KERNEL and REQUANTIZE_BLOCK_SIZE unset")
    if weight_scale.ndim == 1:
        if weight_scale.shape != (out,):
            raise _refuse(f"{weight_scale.shape[0]} scales for a weight of {out} output columns",
                          "a checkpoint with one scale per weight or per fused shard, which "
                          "tpu-inference expands to one per output column")
        scale, block_shape = weight_scale[:, None], (0, 0)
    else:
        if block is None:
            raise _refuse(f"2-D weight scales {tuple(weight_scale.shape)} without a "
                          "weight_block_size", "a checkpoint whose quantization_config has "
                          "weight_block_size")
        bn, bk = block
        want = (-(-k // bk), -(-out // bn))
        if tuple(weight_scale.shape) != want:
            raise _refuse(f"block scales of shape {tuple(weight_scale.shape)} for a weight "
                          f"{layout} {weight.shape} and blocks {block} (expected {want})",
                          "leave REQUANTIZE_BLOCK_SIZE unset")
        scale, block_shape = weight_scale.T, (bn, bk)
    lead = x.shape[:-1]
    y = fp8_linear(x.reshape(-1, k), weight if out_in else weight.T, scale.astype(jnp.float32),
                   block_shape=block_shape, activation_scheme="none")
    TRACES["fp8_linear"] += 1
    if not out_in:
        TRACES[TRANSPOSED_IN_THE_STEP] += 1
    return y.reshape(*lead, out)


def _check_reduce(method) -> None:
    """Refuse ``defer_all_reduce`` when the weight's input axis is split: ``fp8_linear``'s
    sharding rule keeps that axis whole (XLA gathers it), so the result is already the full
    sum, and a caller that sums the partial results later would count them twice."""
    config = method.linear_config
    if not getattr(config, "defer_all_reduce", False):
        return
    from tpu_inference.utils import get_mesh_shape_product

    in_axis = config.weight_sharding[0]
    if in_axis is not None and get_mesh_shape_product(config.mesh, in_axis) > 1:
        raise _refuse("defer_all_reduce with the input axis split over the mesh",
                      "a caller that takes the reduced result (defer_all_reduce=False)")


def apply_fused(method, x, weight, weight_scale, bias):
    """``Fp8LinearMethod._apply_fused`` off TPU: one ``fp8_linear`` over the fused weight,
    the bias, then upstream's own split of the output per fused shard and tensor-parallel
    shard (``slice_sharded_tensor_for_concatenation``) and concatenation."""
    import jax.numpy as jnp
    from tpu_inference.layers.common.utils import slice_sharded_tensor_for_concatenation

    _check_reduce(method)
    out = linear(x, weight, weight_scale, block_size(method), getattr(method, WEIGHT_OUT_IN, False))
    if bias is not None:
        out += bias
    config = method.linear_config
    outs = slice_sharded_tensor_for_concatenation(out, config.output_sizes, config.n_shards)
    return jnp.concatenate(outs, axis=-1)


def apply_split(method, x, weight_and_scale, bias=None, mesh=None):
    """``Fp8LinearMethod._apply_split`` off TPU: one ``fp8_linear`` per output shard's
    weight, each plus its bias, concatenated."""
    import jax.numpy as jnp

    _check_reduce(method)
    block, out_in = block_size(method), getattr(method, WEIGHT_OUT_IN, False)
    outs = []
    for i, (weight, weight_scale) in enumerate(weight_and_scale):
        out = linear(x, weight, weight_scale, block, out_in)
        if bias is not None:
            out += bias[i]
        outs.append(out)
    return jnp.concatenate(outs, axis=-1)


def per_tensor_scales_per_channel(method, layer) -> bool:
    """Before ``VllmCompressedTensorsW8A8Fp8.process_weights_after_loading`` of a layer with
    per-tensor scales (one per fused shard, the widths ``layer.logical_widths``): each scale
    repeated over its shard's output rows ([out, 1], the per-channel layout), and True: the
    caller then runs upstream's per-channel processing, which keeps the checkpoint's e4m3
    values. (Upstream's per-tensor processing dequantizes the shards and quantizes the fused
    weight again with one scale: other numbers than the checkpoint's, which moved greedy
    tokens of the check's tiny Llama by up to 0.17 logits.) False (nothing changed) for
    other strategies."""
    import torch
    from compressed_tensors.quantization import QuantizationStrategy

    if method.strategy != QuantizationStrategy.TENSOR:
        return False
    widths = torch.tensor(list(layer.logical_widths))
    scale = layer.weight_scale.data.reshape(-1).to(torch.float32)
    if scale.numel() != len(widths):
        raise _refuse(f"{scale.numel()} per-tensor scales for {len(widths)} fused shards",
                      "a checkpoint with one weight_scale per q/k/v or gate/up shard")
    layer.weight_scale = torch.nn.Parameter(
        torch.repeat_interleave(scale, widths).unsqueeze(1), requires_grad=False)
    return True


def apply_compressed_tensors(method, layer, x, bias):
    """``VllmCompressedTensorsW8A8Fp8._apply_fused`` / ``._apply_split`` off TPU (a
    compressed-tensors fp8 checkpoint on vLLM's PyTorch models): one ``fp8_linear`` per
    weight (the fused one, or one per output shard), W8A16 as for vLLM's ``Fp8Config``: the
    activations stay in the model's dtype, so a static input scale (``input_scale``) is not
    applied (vLLM's Marlin path on GPUs without fp8 tensor cores does the same); then the
    bias and upstream's own split and concatenation of the shards."""
    from torchax.interop import jax_view, torch_view

    with_bias = bias is not None and not layer.skip_bias_add
    if method.linear_config.fuse_matmuls:
        return torch_view(apply_fused(method, jax_view(x), jax_view(layer.weight),
                                      jax_view(layer.weight_scale),
                                      jax_view(bias) if with_bias else None))
    pairs = [(jax_view(w), jax_view(s)) for w, s in zip(layer.weight, layer.weight_scale,
                                                          strict=True)]
    biases = [jax_view(b) for b in bias] if with_bias else None
    return torch_view(apply_split(method, jax_view(x), pairs, biases))


def store_weights_out_in(method, layer) -> None:
    """After ``VllmFp8LinearMethod.process_weights_after_loading``: ``layer``'s e4m3 weights
    (one, or one per output shard) stored [out, in], transposed once here with their
    sharding transposed too (upstream's ``weight_sharding`` is for [in, out]); marks
    ``method`` (:data:`WEIGHT_OUT_IN`) so that :func:`apply_fused` / :func:`apply_split` take
    them as they are. The output columns keep upstream's order (the fused shards' reorder
    for tensor parallelism is along ``out`` either way). A second call does nothing."""
    import jax
    import jax.numpy as jnp
    import torch
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchax.interop import jax_view, torch_view

    if getattr(method, WEIGHT_OUT_IN, False) or not hasattr(layer, "weight"):
        return
    config = method.linear_config
    sharding = None if config.mesh is None else NamedSharding(
        config.mesh, P(*tuple(config.weight_sharding)[::-1]))
    flip = jax.jit(jnp.transpose, out_shardings=sharding)

    def flipped(param):
        return torch.nn.Parameter(torch_view(flip(jax_view(param))), requires_grad=False)

    if isinstance(layer.weight, torch.nn.ParameterList):
        layer.weight = torch.nn.ParameterList([flipped(w) for w in layer.weight])
    else:
        layer.weight = flipped(layer.weight)
    setattr(method, WEIGHT_OUT_IN, True)


def store_model_weights_out_in(model) -> None:
    """After the JAX-native ``model`` (tpu-inference's nnx model) is loaded: every fp8 linear
    layer's e4m3 weight [in, out] (``Fp8TensorwiseLinearMethod``,
    ``Fp8BlockwiseLinearMethod`` and their merged variants; not a batched einsum's 3-D
    weight, which stays upstream's) stored [out, in], its sharding transposed with it, and
    its method marked (:data:`WEIGHT_OUT_IN`) so that :func:`apply_fused` takes it as it is.
    A second call transposes none."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from tpu_inference.layers.jax.quantization.fp8 import (
        Fp8BlockwiseLinearMethod,
        Fp8TensorwiseLinearMethod,
    )

    # nnx.iter_modules walks any nnx model (tpu-inference's JaxModule has named_modules too,
    # its Llama, a plain nnx.Module, does not).
    modules = [module for _, module in nnx.iter_modules(model)]
    for module in modules:
        method = getattr(module, "quant_method", None)
        if (not isinstance(method, (Fp8TensorwiseLinearMethod, Fp8BlockwiseLinearMethod))
                or method.batch_features or getattr(method, WEIGHT_OUT_IN, False)):
            continue
        weight = module.weight[...]
        if weight.ndim != 2 or weight.dtype != jnp.float8_e4m3fn:
            continue  # linear() refuses it by name at the first trace
        sharding = weight.sharding
        if isinstance(sharding, NamedSharding):
            spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
            sharding = NamedSharding(sharding.mesh, P(*spec[::-1]))
        else:
            sharding = None
        module.weight = nnx.Param(jax.jit(jnp.transpose, out_shardings=sharding)(weight))
        setattr(method, WEIGHT_OUT_IN, True)


def keep_weight_blocks(weight, weight_scale, *, bias, weight_block_size, requant_block_size,
                       output_sizes, requant_weight_dtype, fuse_matmuls, n_shards,
                       enable_kernel=False):
    """``process_blockwise_fp8_linear_weights`` off TPU: the checkpoint's e4m3 weight
    [in, out] and its block scales [in / bk, out / bn] (both transposed by the caller) are
    kept as they are, laid out per output shard as upstream lays out the weight (fused:
    reordered for the tensor-parallel split; split: one weight and its scale columns per
    shard), which is upstream's own path when ``DISABLE_WEIGHT_REQUANTIZATION`` is set.
    (Upstream's default dequantizes each weight to bf16 and quantizes it again with one scale
    per output column: other numbers than the checkpoint's.)"""
    import jax
    import jax.numpy as jnp
    from tpu_inference.layers.common.process_weights.linear_weights import (
        LinearWeights,
        process_linear_weights,
    )
    from tpu_inference.layers.common.utils import reorder_concatenated_tensor_for_sharding

    if enable_kernel or requant_block_size:
        raise _refuse("requantized block weights (ENABLE_QUANTIZED_MATMUL_KERNEL, "
                      f"REQUANTIZE_BLOCK_SIZE={requant_block_size})", "leave "
                      "ENABLE_QUANTIZED_MATMUL_KERNEL and REQUANTIZE_BLOCK_SIZE unset (the "
                      "checkpoint's blocks are kept)")
    if weight.dtype != jnp.float8_e4m3fn:
        raise _refuse(f"block-quantized weights of dtype {weight.dtype}", "an fp8 checkpoint "
                      "with e4m3 weights (float8_e4m3fn)")
    bn = int(weight_block_size[0])
    sizes = tuple(int(s) for s in output_sizes)
    kept = LinearWeights(weight=weight, weight_scale=None, zero_point=None, bias=bias)
    if len(sizes) == 1 and n_shards == 1:
        # One output, nothing to split or reorder (a last partial block is fine).
        kept = process_linear_weights(kept, fused=fuse_matmuls, output_sizes=sizes,
                                      reorder_size=n_shards)
        kept.weight_scale = weight_scale if fuse_matmuls else [weight_scale]
        return kept
    if any(s % (bn * n_shards) for s in sizes):
        where = "fused shards" if n_shards == 1 else f"fused shards on {n_shards} devices"
        fix = ("a checkpoint whose fused shards (q/k/v, gate/up) are whole blocks" +
               ("" if n_shards == 1 else " per device, or a smaller tensor_parallel_size"))
        raise _refuse(f"block scales of {bn} rows over output sizes {sizes} (a block would "
                      f"hold rows of two {where})", fix)
    blocks = [s // bn for s in sizes]
    kept = process_linear_weights(kept, fused=fuse_matmuls, output_sizes=sizes,
                                  reorder_size=n_shards)
    if fuse_matmuls:
        kept.weight_scale = reorder_concatenated_tensor_for_sharding(weight_scale, blocks,
                                                                     n_shards, dim=1)
    else:
        starts = [sum(blocks[:i]) for i in range(len(blocks))]
        kept.weight_scale = [jax.lax.slice_in_dim(weight_scale, s, s + b, axis=1)
                             for s, b in zip(starts, blocks, strict=True)]
    return kept
