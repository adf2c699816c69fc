"""fused_moe against the plain-JAX MoE layers, at Mixtral-8x7B's and Qwen3-30B-A3B's expert
sizes, one layer, in one process on one GPU.

For each model (Mixtral: 8 experts, top 2, hidden 4096, intermediate 14336; Qwen3: 128
experts, top 8, hidden 2048, intermediate 768), weights (bf16, or fp8 e4m3 with 128x128 block
scales, DeepSeek-style) and token count (1, 16, 64, 256 decode; 4096, 16384 prefill), with
random normal router logits:

* ``ours``: :func:`~xla_kernels.kernels.moe.fused_moe` / ``fused_moe_fp8``;
* ``ragged_dot``: :func:`~xla_kernels.kernels.moe.fused_moe_ragged_dot` (sort, gather, two
  ``jax.lax.ragged_dot`` grouped GEMMs, scatter-add; fp8 dequantized first);
* ``loop``: :func:`~xla_kernels.kernels.moe.fused_moe_xla`, the plain-XLA loop over experts
  (every expert over every token, masked by the routing).

Each time is the median of windows of back-to-back jitted calls
(:func:`xla_kernels.bench.budgeted_seconds`). A call that fails (out of memory, say) is
recorded with its error and the run goes on. The roofline columns: ``routed GB`` is the bytes
of the weights of the experts the routing actually hit (each read once), ``bw %`` that over
the time as a share of the card's HBM bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s), ``tc %``
the routed FLOPs (2 * tokens * top_k * 3 * hidden * intermediate) per second as a share of
989 TF/s dense bf16. ``err`` is ours against ragged_dot (relative norm).

Writes ``moe.json`` and ``moe.md`` to ``--out``, again after every row.

Example:
    $ python benchmarks/moe.py --out benchmarks/results/latest/h100
    $ python benchmarks/moe.py --out /tmp/r --models qwen3 --tokens 1 16 --weights bf16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import budgeted_seconds, device_description
from xla_kernels.kernels.moe import (
    fused_moe,
    fused_moe_fp8,
    fused_moe_ragged_dot,
    fused_moe_xla,
    route_xla,
)

MODELS = {  # experts, top_k, hidden, intermediate
    "mixtral": (8, 2, 4096, 14336),
    "qwen3": (128, 8, 2048, 768),
    "tiny": (8, 2, 256, 128),  # a smoke test of the script (runs on the CPU)
}
TOKENS = (1, 16, 64, 256, 4096, 16384)
BLOCK = (128, 128)
PEAK_TFLOPS = 989.0
PEERS = ("ours", "ragged_dot", "loop")


def hbm_tbs(device_kind: str) -> float | None:
    """The card's HBM bandwidth (TB/s) from its name, None if unknown."""
    kind = device_kind.upper()
    if "H200" in kind:
        return 4.8
    if "H100" in kind:
        return 2.0 if "PCIE" in kind else 3.35
    return None


def quantize_blocks(w: Any, block: tuple[int, int]) -> tuple[Any, Any]:
    """(e4m3 weights, f32 scales [experts, rows / bn, cols / bk]) on the device: each block's
    largest magnitude maps to 448. Dimensions must be multiples of the block."""
    e, rows, cols = w.shape
    bn, bk = block
    blocks = w.astype(jnp.float32).reshape(e, rows // bn, bn, cols // bk, bk)
    scale = jnp.maximum(jnp.abs(blocks).max(axis=(2, 4)), 1e-12) / 448.0
    q = (blocks / scale[:, :, None, :, None]).astype(jnp.float8_e4m3fn)
    return q.reshape(e, rows, cols), scale


def weights(model: str, fp8: bool) -> dict[str, Any]:
    experts, _, hidden, inter = MODELS[model]
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    w13 = jax.random.normal(k1, (experts, 2 * inter, hidden), jnp.bfloat16) / hidden ** 0.5
    w2 = jax.random.normal(k2, (experts, hidden, inter), jnp.bfloat16) * (2 / inter ** 0.5)
    if not fp8:
        return {"w13": w13, "w2": w2}
    q13, s13 = quantize_blocks(w13, BLOCK)
    q2, s2 = quantize_blocks(w2, BLOCK)
    return {"w13": q13, "w2": q2, "w13_scale": s13, "w2_scale": s2}


def layer(peer: str, fp8: bool, top_k: int) -> Any:
    """The jitted layer of one implementation: (hidden, router_logits, *weights) -> out. The
    weights are arguments, not closed-over constants (they must not be baked into the
    program)."""
    if peer == "ours":
        if fp8:
            return jax.jit(lambda x, r, a, b, sa, sb: fused_moe_fp8(
                x, r, a, b, sa, sb, top_k=top_k, block_shape=BLOCK))
        return jax.jit(lambda x, r, a, b: fused_moe(x, r, a, b, top_k=top_k))
    fn = fused_moe_ragged_dot if peer == "ragged_dot" else fused_moe_xla
    if fp8:
        return jax.jit(lambda x, r, a, b, sa, sb: fn(x, r, a, b, top_k=top_k, w13_scale=sa,
                                                     w2_scale=sb, block_shape=BLOCK))
    return jax.jit(lambda x, r, a, b: fn(x, r, a, b, top_k=top_k))


def measure(model: str, tokens: int, w: dict[str, Any], peers: tuple[str, ...],
            budget: float, bw_tbs: float | None) -> dict[str, Any]:
    experts, top_k, hidden, inter = MODELS[model]
    fp8 = "w13_scale" in w
    kx, kr = jax.random.split(jax.random.PRNGKey(tokens))
    x = jax.random.normal(kx, (tokens, hidden), jnp.bfloat16)
    logits = jax.random.normal(kr, (tokens, experts), jnp.float32)
    hit = int(np.unique(np.asarray(route_xla(logits, top_k)[0])).size)
    per_weight = 1 + 4 / (BLOCK[0] * BLOCK[1]) if fp8 else 2
    routed_bytes = hit * 3 * hidden * inter * per_weight
    flops = 2 * tokens * top_k * 3 * hidden * inter
    row: dict[str, Any] = {"model": model, "weights": "fp8 128x128" if fp8 else "bf16",
                           "tokens": tokens, "experts_hit": hit,
                           "routed_gb": routed_bytes / 1e9, "tflop": flops / 1e12}
    outs = {}
    args = (x, logits, *(w[k] for k in ("w13", "w2", "w13_scale", "w2_scale") if k in w))
    for peer in peers:
        try:
            fn = layer(peer, fp8, top_k)
            outs[peer] = np.asarray(fn(*args), np.float32)
            row[f"{peer}_ms"] = 1e3 * budgeted_seconds(fn, args, budget)
        except Exception as e:  # recorded (out of memory, an unsupported lowering)
            row[f"{peer}_ms"] = None
            row[f"{peer}_error"] = str(e).splitlines()[0][:200]
    ours = row.get("ours_ms")
    if ours:
        seconds = ours / 1e3
        row["ours_bw_pct"] = (100 * routed_bytes / seconds / (bw_tbs * 1e12)
                              if bw_tbs else None)
        row["ours_tc_pct"] = 100 * flops / seconds / (PEAK_TFLOPS * 1e12)
        for peer in peers[1:]:
            if row.get(f"{peer}_ms"):
                row[f"speedup_vs_{peer}"] = row[f"{peer}_ms"] / ours
    if "ours" in outs and "ragged_dot" in outs:
        ref = outs["ragged_dot"]
        row["err_vs_ragged_dot"] = float(np.linalg.norm(outs["ours"] - ref)
                                         / max(np.linalg.norm(ref), 1e-30))
    print(json.dumps(row), flush=True)
    return row


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(rows: list[dict[str, Any]], device: dict[str, str], peers: tuple[str, ...]
             ) -> str:
    head = " | ".join(f"{p} ms" for p in peers)
    speed = " | ".join(f"x vs {p}" for p in peers[1:])
    lines = [f"# fused_moe vs plain-JAX MoE layers ({device.get('device', '?')})", "",
             "One layer's experts; times in ms (median of windows of back-to-back jitted "
             "calls). bw % = routed weight bytes / time / HBM bandwidth; tc % = routed FLOPs "
             f"/ time / {PEAK_TFLOPS:.0f} TF/s; x = peer time / ours; err = ours vs "
             "ragged_dot.", "",
             f"| model | weights | tokens | experts hit | routed GB | {head} | {speed} | "
             "bw % | tc % | err |",
             "|" + "---|" * (7 + 2 * len(peers))]
    for r in rows:
        times = " | ".join(fmt(r.get(f"{p}_ms"), ".4f") for p in peers)
        ratios = " | ".join(fmt(r.get(f"speedup_vs_{p}"), ".1f") for p in peers[1:])
        lines.append(f"| {r['model']} | {r['weights']} | {r['tokens']} | {r['experts_hit']} | "
                     f"{r['routed_gb']:.3f} | {times} | {ratios} | "
                     f"{fmt(r.get('ours_bw_pct'), '.1f')} | {fmt(r.get('ours_tc_pct'), '.1f')} | "
                     f"{fmt(r.get('err_vs_ragged_dot'), '.1e')} |")
    errors = [(r, p) for r in rows for p in peers if r.get(f"{p}_error")]
    if errors:
        lines += ["", "Calls that failed:", ""]
        lines += [f"- {r['model']} {r['weights']} {r['tokens']} tokens, {p}: "
                  f"{r[f'{p}_error']}" for r, p in errors]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["mixtral", "qwen3"],
                        choices=list(MODELS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--weights", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per timing")
    args = parser.parse_args()
    peers = tuple(["ours"] + [p for p in args.peers if p != "ours"])
    device = device_description()
    bw = hbm_tbs(device["device"])
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def write() -> None:  # after every row: a run cut short keeps what it measured
        result = {"device": device, "hbm_tbs": bw, "peak_tflops": PEAK_TFLOPS, "rows": rows,
                  "seconds": time.perf_counter() - start}
        (args.out / "moe.json").write_text(json.dumps(result, indent=1))
        (args.out / "moe.md").write_text(markdown(rows, device, peers))

    for model in args.models:
        for kind in args.weights:
            w = weights(model, kind == "fp8")
            for t in args.tokens:
                rows.append(measure(model, t, w, peers, args.budget, bw))
                write()
            del w
    print(markdown(rows, device, peers))

if __name__ == "__main__":
    main()
