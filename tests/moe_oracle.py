"""fused_moe's float64 oracle, shared by tests/test_moe.py and tests/gpu/test_moe_gpu.py.
tests/gpu/test_moe_gpu.py. Written from the op's documented semantics, apart from the
kernels and from kernels/moe/reference.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TOL = {"f32": 1e-5, "bf16": 2e-2, "f16": 4e-3}


def rel(a: Any, b: Any) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def routing_f64(logits: Any, top_k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(experts [tokens, top_k], weights [tokens, top_k]): softmax in float64, the largest
    first, equal probabilities by lower expert index."""
    logits = np.asarray(logits, np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.empty((logits.shape[0], top_k), np.int64)
    for t in range(logits.shape[0]):
        ids[t] = sorted(range(logits.shape[1]), key=lambda e: (-p[t, e], e))[:top_k]
    w = np.take_along_axis(p, ids, axis=1)
    if renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, w


def _act(g: np.ndarray, activation: str) -> np.ndarray:
    if activation == "silu":
        return g / (1.0 + np.exp(-g))
    erf = np.vectorize(math.erf)
    return 0.5 * g * (1.0 + erf(g / math.sqrt(2.0)))


def moe_f64(hidden: Any, logits: Any, w13: Any, w2: Any, *, top_k: int, renormalize: bool = True,
            activation: str = "silu", expert_offset: int = 0) -> np.ndarray:
    """The MoE layer in float64, token by token. ``expert_offset``: w13/w2 hold the experts
    from that global id on (expert parallel); routing still runs over every column of
    ``logits`` and only the experts held add to the output."""
    x, a, b = (np.asarray(v, np.float64) for v in (hidden, w13, w2))
    n = a.shape[1] // 2
    ids, w = routing_f64(logits, top_k, renormalize)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, we in zip(ids[t], w[t], strict=True):
            local = e - expert_offset
            if not 0 <= local < a.shape[0]:
                continue
            g = a[local] @ x[t]
            out[t] += we * (b[local] @ (_act(g[:n], activation) * g[n:]))
    return out


def dequantize_f64(q: Any, scale: Any, block_shape: tuple[int, int]) -> np.ndarray:
    """fp8 weights [experts, rows, cols] times their scales, element by element."""
    q = np.asarray(q).astype(np.float64)
    scale = np.asarray(scale, np.float64)
    bn, bk = block_shape
    rows, cols = q.shape[1:]
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    if bn == 0:
        return q * scale[:, r, 0]
    return q * scale[:, r // bn, c // bk]
