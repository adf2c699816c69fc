"""Seeded random weights, one set for both frontends.

The names are the torch modules' parameter names (``model_torch``), the layout is torch's
(a linear layer's weight is [out_features, in_features]); the JAX model reads the same
dictionary. Values come from ``jax.random`` (threefry: the same bits on every platform)
on the default device, so a 1B model is made on the GPU in a second, with no download and no
host copy; each tensor has its own key (``fold_in`` of its index), so adding a layer does not
change the others.

Example:
    >>> from xla_kernels.serving.config import preset
    >>> w = init_weights(preset("tiny"), seed=0)
    >>> w["layers.0.self_attn.q_proj.weight"].shape, str(w["norm.weight"].dtype)
    ((256, 128), 'float32')
    >>> sorted(weight_shapes(preset("tiny")))[:2]
    ['embed_tokens.weight', 'layers.0.input_layernorm.weight']
"""

from __future__ import annotations

from typing import Any

from xla_kernels.serving.config import ModelConfig
from xla_kernels.serving.quantize import is_projection, quantize_e4m3


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a fixed order."""
    h, q = config.hidden_size, config.num_q_heads * config.head_dim
    kv, inter = config.num_kv_heads * config.head_dim, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
        })
        if config.num_experts:  # vLLM's fused_moe layout: w13 = [gate; up] per expert
            e, n = config.num_experts, config.moe_intermediate_size
            shapes.update({
                p + "mlp.gate.weight": (e, h),
                p + "mlp.experts.w13_weight": (e, 2 * n, h),
                p + "mlp.experts.w2_weight": (e, h, n),
            })
        else:
            shapes.update({
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
            })
    shapes["norm.weight"] = (h,)
    shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def init_weights(config: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Random weights in ``config.dtype``: linear layers (and each expert's) N(0, 1/fan_in)
    (so activations keep their scale through the layers), embeddings N(0, 1), norm weights
    1 + N(0, 0.1). With ``config.weights`` fp8, each projection is then quantized as it is
    made (:func:`~xla_kernels.serving.quantize.quantize_e4m3` of its ``config.dtype``
    value: the same model as with ``"model"`` weights, rounded to e4m3), so the
    full-precision copy of the whole model never exists."""
    import jax
    import jax.numpy as jnp

    root = jax.random.key(seed)
    weights = {}
    for index, (name, shape) in enumerate(weight_shapes(config).items()):
        key = jax.random.fold_in(root, index)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * jax.random.normal(key, shape, jnp.float32)
        elif name == "embed_tokens.weight":
            value = jax.random.normal(key, shape, jnp.float32)
        else:
            value = jax.random.normal(key, shape, jnp.float32) * shape[-1] ** -0.5
        value = value.astype(config.dtype)
        if config.weights != "model" and is_projection(name):
            weights[name], weights[name + "_scale"] = quantize_e4m3(value)
        else:
            weights[name] = value
    return weights


def cast_weights(weights: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The same weights in another dtype (e.g. bf16 weights, upcast exactly, for an f32
    check); fp8 projections and their f32 scales stay as they are (the fp8 model is the
    same in any activation dtype)."""
    return {name: value if _fp8_part(name, value) else value.astype(dtype)
            for name, value in weights.items()}


def _fp8_part(name: str, value: Any) -> bool:
    return name.endswith(".weight_scale") or str(value.dtype) == "float8_e4m3fn"


__all__ = ["cast_weights", "init_weights", "weight_shapes"]
