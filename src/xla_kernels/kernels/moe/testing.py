"""Inputs for fused_moe's tests, benchmarks and compute-sanitizer runs.

Example:
    >>> import numpy as np
    >>> x = make_inputs(np.random.default_rng(0), tokens=3, hidden=16, experts=4,
    ...                 intermediate=8, dtype="bf16")
    >>> [x[k].shape for k in ARGS]
    [(3, 16), (3, 4), (4, 16, 16), (4, 16, 8)]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from xla_kernels import dtypes

ARGS = ("hidden", "router_logits", "w13", "w2")


def make_inputs(rng: np.random.Generator, *, tokens: int, hidden: int, experts: int,
                intermediate: int, dtype: str, logits_dtype: str = "f32",
                poison_experts: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Random inputs whose output entries are of order one. ``poison_experts``: experts no
    token routes to (their logits are -1e4) whose weights are NaN, so that a kernel reading
    them into any output shows it."""
    np_dtype = dtypes.to_numpy(dtype)
    x = {
        "hidden": rng.standard_normal((tokens, hidden)),
        "router_logits": 2 * rng.standard_normal((tokens, experts)),
        "w13": rng.standard_normal((experts, 2 * intermediate, hidden)) / math.sqrt(hidden),
        "w2": rng.standard_normal((experts, hidden, intermediate)) * 2 / math.sqrt(intermediate),
    }
    for e in poison_experts:
        x["router_logits"][:, e] = -1e4
        x["w13"][e] = np.nan
        x["w2"][e] = np.nan
    return {k: v.astype(dtypes.to_numpy(logits_dtype) if k == "router_logits" else np_dtype)
            for k, v in x.items()}


def sanitize_cases(platform: str = "gpu") -> None:
    """Small calls covering every CUDA tile configuration, odd sizes (element-wise loads),
    fp8 per-channel and block scales, expert-parallel blocks (offsets inside and outside the
    experts); run under compute-sanitizer by scripts/sanitize_kernels.py."""
    import jax

    from . import fp8_quantize, fused_moe, fused_moe_ep, fused_moe_fp8

    rng = np.random.default_rng(0)
    device = jax.devices(platform)[0]
    # (tokens, hidden, experts, intermediate, top_k) and the tiles on a 132-SM card: bm 16 /
    # bn 32, bm 16 / bn 64, bm 16 / bn 128, bm 64, bm 128, odd hidden and intermediate, one
    # expert, per-pair outputs at an odd offset (pairs * intermediate odd: unpaired stores).
    shapes = [(1, 256, 8, 128, 2), (33, 128, 128, 128, 2), (16, 256, 128, 256, 8),
              (128, 128, 8, 64, 2),
              (300, 64, 8, 32, 2), (5, 13, 4, 20, 2), (3, 24, 1, 8, 1), (3, 64, 4, 5, 1)]
    for tokens, hidden, experts, inter, top_k in shapes:
        for dtype in ("bf16", "f16", "f32"):
            x = make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts,
                            intermediate=inter, dtype=dtype)
            args = [jax.device_put(x[k], device) for k in ARGS]
            jax.block_until_ready(fused_moe(*args, top_k=top_k))
        for block_shape in ((0, 0), (128, 128)):
            q13, s13 = fp8_quantize(x["w13"].astype(np.float32), block_shape)
            q2, s2 = fp8_quantize(x["w2"].astype(np.float32), block_shape)
            args = [jax.device_put(a, device)
                    for a in (x["hidden"], x["router_logits"], q13, q2, s13, s2)]
            jax.block_until_ready(fused_moe_fp8(*args, top_k=top_k, block_shape=block_shape))
        # Expert parallel: the first half of the experts, then offsets past either end.
        local = max(experts // 2, 1)
        for offset in (0, local, -local, experts):
            args = [jax.device_put(a, device) for a in
                    (x["hidden"], x["router_logits"], x["w13"][:local], x["w2"][:local],
                     np.int32(offset))]
            jax.block_until_ready(fused_moe_ep(*args, top_k=top_k))


def as_arrays(x: dict[str, Any]) -> list[Any]:
    """The op's array arguments of ``x``, in order."""
    return [x[k] for k in ARGS]
