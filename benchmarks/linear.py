"""linear and fp8_linear against XLA's dots at Llama-3-8B's linears, in one process on one
GPU: the fraction of the weight-read floor each reaches, and each one's time over the bf16
XLA dot's.

For each weight (out x in: qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096 (gate and up
fused), down 4096 x 14336) and token count (1, 16, 64, 128; bf16 activations):

* ``linear``: :func:`~xla_kernels.kernels.linear.linear` on the bf16 weight;
* ``xla_dot``: :func:`~xla_kernels.kernels.linear.linear_xla`, XLA's bf16 dot (cuBLAS;
  f32 accumulation, bf16 out);
* ``fp8_linear``: :func:`~xla_kernels.kernels.fp8_linear.fp8_linear` on the weight in e4m3
  with per-channel scales, weight-only (W8A16);
* ``fp8_w8a8``: the same with ``activation_scheme="dynamic"`` (x quantized per token, W8A8);
* ``xla_fp8``: :func:`~xla_kernels.kernels.fp8_linear.fp8_linear_xla` with
  ``"dynamic"``: x quantized per token, then XLA's fp8 dot (cuBLASLt).

Floor = the weight's bytes (bf16: 2 per element, e4m3: 1 plus its f32 scales) over the
measured copy bandwidth (a 1 GiB device copy, read + write); roof % = floor / time. Calls
rotate over copies of the weight that together exceed 150 MB (no call finds its weight in
L2) and are timed in jitted chains of 16 (benchmarks/fp8_linear.py's method: each call's
operands behind an optimization barrier; median of 5 windows, divided by 16).

Writes ``linear.json`` and ``linear.md`` to ``--out``, again after every row.

Example:
    $ python benchmarks/linear.py --out benchmarks/results/latest/h200
    $ python benchmarks/linear.py --out /tmp/r --shapes tiny --tokens 1 16 --budget 0.02
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import (
    barrier_chain,
    budgeted_seconds,
    copy_bandwidth_gbs,
    device_description,
)
from xla_kernels.kernels.fp8_linear import fp8_linear, fp8_linear_xla
from xla_kernels.kernels.linear import linear, linear_xla

SHAPES = {  # name: (out, in)
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "tiny": (256, 384),  # a smoke test of the script (runs on the CPU)
}
TOKENS = (1, 16, 64, 128)
PEERS = {  # name: (weight format, call)
    "linear": ("bf16", lambda x, w, s: linear(x, w)),
    "xla_dot": ("bf16", lambda x, w, s: linear_xla(x, w)),
    "fp8_linear": ("e4m3", lambda x, w, s: fp8_linear(x, w, s)),
    "fp8_w8a8": ("e4m3", lambda x, w, s: fp8_linear(x, w, s, activation_scheme="dynamic")),
    "xla_fp8": ("e4m3", lambda x, w, s: fp8_linear_xla(x, w, s, activation_scheme="dynamic")),
}
FOOTPRINT = 150_000_000
MAX_COPIES = 16
CHAIN = 16


def weight_sets(out: int, k: int, fmt: str) -> list[tuple[Any, Any]]:
    """Copies of one random weight (bf16, or e4m3 with per-channel scales) that together
    hold FOOTPRINT bytes; consecutive calls of a chain read different copies."""
    w = jax.random.normal(jax.random.PRNGKey(0), (out, k), jnp.bfloat16) / k ** 0.5
    if fmt == "bf16":
        s = jnp.ones((out, 1), jnp.float32)
        nbytes = 2 * out * k
    else:
        w32 = w.astype(jnp.float32)
        s = jnp.maximum(jnp.abs(w32).max(axis=1, keepdims=True), 1e-12) / 448.0
        w = (w32 / s).astype(jnp.float8_e4m3fn)
        nbytes = out * k
    copies = min(MAX_COPIES, max(1, -(-FOOTPRINT // nbytes)))
    return [(jnp.copy(w), jnp.copy(s)) if i else (w, s) for i in range(copies)]


def measure(shape: str, tokens: int, sets: dict[str, list], peers: tuple[str, ...],
            budget: float, copy_gbs: float) -> dict[str, Any]:
    """One row: every peer at one shape and token count."""
    out, k = SHAPES[shape]
    keys = jax.random.split(jax.random.PRNGKey(tokens), CHAIN)
    xs = [jax.random.normal(key, (tokens, k), jnp.bfloat16) for key in keys]
    row: dict[str, Any] = {"shape": shape, "out": out, "in": k, "tokens": tokens}
    outs = {}
    for peer in peers:
        fmt, fn = PEERS[peer]
        weight_bytes = out * k * (2 if fmt == "bf16" else 1) + (0 if fmt == "bf16" else 4 * out)
        floor = weight_bytes / (copy_gbs * 1e9)
        program = barrier_chain(fn, len(sets[fmt]), CHAIN)
        outs[peer] = np.asarray(program(xs, sets[fmt])[0], np.float32)
        seconds = budgeted_seconds(program, (xs, sets[fmt]), budget, calls=CHAIN)
        row[f"{peer}_us"] = 1e6 * seconds
        row[f"{peer}_floor_us"] = 1e6 * floor
        row[f"{peer}_roof_pct"] = 100 * floor / seconds
    if "xla_dot" in outs:
        ref = outs["xla_dot"]
        for peer in outs:
            row[f"{peer}_err"] = float(np.linalg.norm(outs[peer] - ref)
                                       / max(np.linalg.norm(ref), 1e-30))
            row[f"{peer}_speedup"] = row["xla_dot_us"] / row[f"{peer}_us"]
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict[str, Any]], head: dict[str, Any], peers: tuple[str, ...]) -> str:
    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    cols = " | ".join(f"{p} us | roof % | x xla_dot" for p in peers)
    lines = [f"# linear and fp8_linear vs XLA's dots ({head['device'].get('device', '?')})", "",
             f"Copy bandwidth {head['copy_gbs']:.0f} GB/s measured. roof % = the weight's bytes "
             "/ copy bandwidth / time (bf16: 2 bytes a weight; e4m3: 1, plus f32 scales). "
             "x xla_dot = xla_dot's time / this peer's (> 1: faster than XLA's bf16 dot). "
             "err: relative to xla_dot's output.", "",
             f"| shape | tokens | {cols} | linear err | fp8 err |",
             "|" + "---|" * (4 + 3 * len(peers))]
    for r in rows:
        vals = " | ".join(f"{fmt(r.get(f'{p}_us'), '.1f')} | {fmt(r.get(f'{p}_roof_pct'), '.0f')}"
                          f" | {fmt(r.get(f'{p}_speedup'), '.2f')}" for p in peers)
        lines.append(f"| {r['shape']} {r['out']}x{r['in']} | {r['tokens']} | {vals} | "
                     f"{fmt(r.get('linear_err'), '.1e')} | {fmt(r.get('fp8_linear_err'), '.1e')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", nargs="+", default=["qkv", "o", "gate_up", "down"],
                        choices=list(SHAPES))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per timing")
    args = parser.parse_args()
    peers = tuple(p for p in PEERS if p in args.peers)
    start = time.perf_counter()
    on_gpu = jax.default_backend() == "gpu"
    head = {"device": device_description(),
            "copy_gbs": copy_bandwidth_gbs(1 << 30 if on_gpu else 1 << 24),
            "chain": CHAIN, "footprint_bytes": FOOTPRINT}
    print(json.dumps(head), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def write() -> None:  # after every row: a run cut short keeps what it measured
        result = {**head, "rows": rows, "seconds": time.perf_counter() - start}
        (args.out / "linear.json").write_text(json.dumps(result, indent=1))
        (args.out / "linear.md").write_text(markdown(rows, head, peers))

    for shape in args.shapes:
        out, k = SHAPES[shape]
        sets = {fmt: weight_sets(out, k, fmt) for fmt in {PEERS[p][0] for p in peers}}
        for t in args.tokens:
            rows.append(measure(shape, t, sets, peers, args.budget, head["copy_gbs"]))
            write()
        del sets
    print(markdown(rows, head, peers))


if __name__ == "__main__":
    main()
