"""fused_moe in plain JAX: the routing, the dequantized weights, the per-expert loop (the
fallback where no kernel runs) and a ``jax.lax.ragged_dot`` MoE (the peer the benchmark
times). Both follow the op's semantics (see the package docstring); the float64 oracle lives
in the tests, written apart from this file.

Example:
    >>> import jax.numpy as jnp
    >>> x, logits = jnp.ones((3, 8)), jnp.zeros((3, 4))
    >>> w13, w2 = jnp.ones((4, 6, 8)) / 8, jnp.ones((4, 8, 3)) / 3
    >>> fused_moe_xla(x, logits, w13, w2, top_k=2).shape
    (3, 8)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xla_kernels.kernels.fp8_weights import dequantize, fp8_quantize

ACTIVATIONS = ("silu", "gelu")
__all__ = ["ACTIVATIONS", "activate", "dequantize", "fp8_quantize", "fused_moe_ragged_dot",
           "fused_moe_xla", "local_routes", "route"]


def route(router_logits: Any, top_k: int, renormalize: bool = True) -> tuple[Any, Any]:
    """(topk_ids int32 [tokens, top_k], topk_weights f32 [tokens, top_k]): softmax over the
    experts in f32, the top_k largest probabilities (equal ones: the lower expert first),
    divided by their sum when ``renormalize``."""
    probs = jax.nn.softmax(jnp.asarray(router_logits).astype(jnp.float32), axis=-1)
    weights, ids = jax.lax.top_k(probs, top_k)  # stable: ties keep the lower index first
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return ids.astype(jnp.int32), weights


def activate(gate_up: Any, activation: str) -> Any:
    """act(gate) * up of f32 rows [..., 2 * intermediate] (gate first, as vLLM's w13)."""
    n = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :n], gate_up[..., n:]
    if activation == "silu":
        return jax.nn.silu(gate) * up
    if activation == "gelu":
        return jax.nn.gelu(gate, approximate=False) * up
    raise ValueError(f"unknown activation {activation!r}; use one of {ACTIVATIONS}")


def _weights(w13: Any, w2: Any, scales: tuple[Any, Any] | None,
             block_shape: tuple[int, int]) -> tuple[Any, Any]:
    if scales is None:
        return jnp.asarray(w13), jnp.asarray(w2)
    return dequantize(w13, scales[0], block_shape), dequantize(w2, scales[1], block_shape)


def local_routes(router_logits: Any, top_k: int, renormalize: bool, experts: int,
                 expert_offset: Any = None) -> tuple[Any, Any]:
    """(local ids, weights) [tokens, top_k] of the routing over every column of
    ``router_logits``, for the block of ``experts`` experts starting at global id
    ``expert_offset`` (None: 0): a pair routed outside the block gets id ``experts`` and
    weight 0."""
    ids, weights = route(router_logits, top_k, renormalize)
    if expert_offset is not None:
        ids = ids - jnp.asarray(expert_offset, jnp.int32)
    inside = (ids >= 0) & (ids < experts)
    return jnp.where(inside, ids, experts), jnp.where(inside, weights, 0.0)


def fused_moe_xla(hidden: Any, router_logits: Any, w13: Any, w2: Any, *, top_k: int,
                  renormalize: bool = True, activation: str = "silu",
                  w13_scale: Any = None, w2_scale: Any = None,
                  block_shape: tuple[int, int] = (0, 0), expert_offset: Any = None) -> Any:
    """The op in plain XLA: every expert's two GEMMs over all tokens (a loop over experts),
    weighted by the routing (zero for tokens not routed there). E times the FLOPs of the
    routed computation; memory stays one expert's weights at a time. fp8 weights (pass the
    scales) are dequantized to f32. ``expert_offset``: w13/w2 hold the experts from that
    global id on and router_logits every expert's column (fused_moe_ep's semantics)."""
    hidden = jnp.asarray(hidden)
    dtype = hidden.dtype
    tokens, experts = hidden.shape[0], w13.shape[0]
    ids, weights = local_routes(router_logits, top_k, renormalize, experts, expert_offset)
    combine = jnp.zeros((tokens, experts + 1), jnp.float32).at[
        jnp.arange(tokens)[:, None], ids].add(weights)
    scales = None if w13_scale is None else (jnp.asarray(w13_scale), jnp.asarray(w2_scale))
    w13, w2 = jnp.asarray(w13), jnp.asarray(w2)
    compute = jnp.float32 if scales is not None else dtype

    def expert(e: Any, acc: Any) -> Any:
        s = None if scales is None else (scales[0][e], scales[1][e])
        a, b = _weights(w13[e], w2[e], s, block_shape)
        gate_up = jnp.dot(hidden.astype(compute), a.T.astype(compute),
                          preferred_element_type=jnp.float32)
        act = activate(gate_up, activation).astype(dtype).astype(compute)
        y = jnp.dot(act, b.T.astype(compute), preferred_element_type=jnp.float32)
        return acc + y * jax.lax.dynamic_slice_in_dim(combine, e, 1, axis=1)

    acc = jax.lax.fori_loop(0, experts, expert,
                            jnp.zeros((tokens, hidden.shape[1]), jnp.float32))
    return acc.astype(dtype)


def fused_moe_ragged_dot(hidden: Any, router_logits: Any, w13: Any, w2: Any, *, top_k: int,
                         renormalize: bool = True, activation: str = "silu",
                         w13_scale: Any = None, w2_scale: Any = None,
                         block_shape: tuple[int, int] = (0, 0),
                         expert_offset: Any = None,
                         ragged_dot_general: Callable[..., Any] = jax.lax.ragged_dot_general,
                         weights_in_out: bool = False) -> Any:
    """The op with ``jax.lax.ragged_dot``: the (token, expert) pairs sorted by expert, the
    tokens' rows gathered, two grouped GEMMs over the experts' groups, the rows weighted and
    added back per token. fp8 weights are dequantized to hidden's dtype first (all of them,
    every call). ``expert_offset`` as in :func:`fused_moe_xla` (pairs routed outside the
    local block sort last, in no group, with weight 0).

    ``ragged_dot_general``: the grouped GEMM, ``jax.lax.ragged_dot_general`` or one with its
    signature (the benchmark passes tokamax's). ``weights_in_out``: w13 and w2 (and their
    scales, and ``block_shape``) are transposed, [experts, in, out], the layout
    ``jax.lax.ragged_dot``'s default dimension numbers take (a kernel that only takes that
    layout then does not transpose the weights on every call)."""
    hidden = jnp.asarray(hidden)
    dtype = hidden.dtype
    tokens, experts = hidden.shape[0], w13.shape[0]
    ids, weights = local_routes(router_logits, top_k, renormalize, experts, expert_offset)
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token_of_row = order // top_k
    group_sizes = jnp.sum(flat[:, None] == jnp.arange(experts), axis=0, dtype=jnp.int32)
    scales = None if w13_scale is None else (w13_scale, w2_scale)
    a, b = _weights(w13, w2, scales, block_shape)
    a, b = a.astype(dtype), b.astype(dtype)
    # Weights [experts, out, in]: contract lhs dim 1 with rhs dim 2 ([experts, in, out]: with
    # rhs dim 1); the group dim is rhs 0.
    dims = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [1 if weights_in_out else 2]), ([], [])),
        lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
    rows = hidden[token_of_row]
    gate_up = ragged_dot_general(rows, a, group_sizes, dims, preferred_element_type=jnp.float32)
    act = activate(gate_up, activation).astype(dtype)
    y = ragged_dot_general(act, b, group_sizes, dims, preferred_element_type=jnp.float32)
    w_rows = weights.reshape(-1)[order][:, None]
    y = jnp.where(w_rows != 0, y * w_rows, 0.0)  # rows in no group hold no product
    out = jnp.zeros((tokens, hidden.shape[1]), jnp.float32).at[token_of_row].add(y)
    return out.astype(dtype)
