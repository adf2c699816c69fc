"""fp8_linear against XLA's and torch's fp8 linear layers at Llama-3-8B's shapes, in one
process on one GPU: the fraction of the weight-read roofline each reaches.

For each weight (out x in: qkv 6144 x 4096, o 4096 x 4096, gate/up 14336 x 4096, down
4096 x 14336; e4m3 with 128x128 block scales, DeepSeek-style, or per-channel scales), token
count (1, 16, 64, 256; bf16 activations):

* ``ours``: :func:`~xla_kernels.kernels.fp8_linear.fp8_linear`, weight-only (``"none"``);
* ``ours_w8a8``: the same op with ``activation_scheme="dynamic"`` (x quantized per token);
* ``xla_fp8``: :func:`~xla_kernels.kernels.fp8_linear.fp8_linear_xla` with ``"dynamic"``:
  ``jax.lax.dot_general`` on float8 operands with f32 results, then the scales (XLA:GPU's
  cuBLASLt fp8 GEMM; with block scales one dot per 128-column block, then scaled and added);
* ``dequant_bf16``: ``fp8_linear_xla`` with ``"none"``: the weight dequantized to bf16 every
  call, then a bf16 dot;
* ``scaled_mm``: ``torch._scaled_mm`` on x quantized per token and the weight: row-wise
  scales (per-channel weights) or 1x128 / 128x128 block scales (block weights), bf16 out.
  A failure (a layout this torch or card refuses) is recorded, not fatal.

Roofline: a call must read the weight once, ``out * in`` bytes plus its f32 scales (x and
y are left out: at most 2 % of those bytes up to 16 tokens, up to 25 % at 256 tokens, the
4096 x 4096 weight). ``floor us`` is those bytes over the
measured copy bandwidth (:func:`xla_kernels.bench.copy_bandwidth_gbs`, a 1 GiB device copy,
read + write), ``roof %`` = floor / time; the nominal HBM bandwidth (H100 SXM 3.35 TB/s,
H200 4.8 TB/s) is recorded beside it. Every peer's calls rotate over copies of the weight
that together exceed 150 MB, so no call finds its weight in L2 from the call before (one
4096 x 4096 fp8 weight, 16.8 MB, would fit in an H100's 50 MB L2). A decode call takes a
few microseconds, less than one host dispatch, so calls are timed in chains of 16 (each on
its own copy of x and the next weight copy, every result kept): one jitted program per
chain for the JAX peers (XLA's command buffers launch them), one CUDA graph for
``torch._scaled_mm`` (x quantized outside it: the GEMM alone). Times: median of 5 windows
of back-to-back chains, divided by 16.

Writes ``fp8_linear.json`` and ``fp8_linear.md`` to ``--out``, again after every row.

Example:
    $ python benchmarks/fp8_linear.py --out benchmarks/results/latest/h100
    $ python benchmarks/fp8_linear.py --out /tmp/r --shapes o --tokens 1 16 --scales block
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU

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

SHAPES = {  # name: (out, in)
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (14336, 4096),
    "down": (4096, 14336),
    "tiny": (256, 384),  # a smoke test of the script (runs on the CPU)
}
TOKENS = (1, 16, 64, 256)
SCALES = {"block": (128, 128), "channel": (0, 0)}
PEERS = ("ours", "ours_w8a8", "xla_fp8", "dequant_bf16", "scaled_mm")
FOOTPRINT = 150_000_000
MAX_COPIES = 16
CHAIN = 16  # op calls per timed program (JAX) or CUDA graph (torch)
WINDOWS = 5


def hbm_tbs(device_kind: str) -> float | None:
    """The card's nominal HBM bandwidth (TB/s) from its name, None if unknown."""
    kind = device_kind.upper()
    if "H200" in kind:
        return 4.8
    if "H100" in kind:
        return 2.0 if "PCIE" in kind else 3.35
    return None


def quantize(w: Any, block: tuple[int, int]) -> tuple[Any, Any]:
    """(e4m3 weight, f32 scales) on the device; dimensions are multiples of the block."""
    out, k = w.shape
    bn, bk = block
    w = w.astype(jnp.float32)
    if bn == 0:
        scale = jnp.maximum(jnp.abs(w).max(axis=1, keepdims=True), 1e-12) / 448.0
        return (w / scale).astype(jnp.float8_e4m3fn), scale
    blocks = w.reshape(out // bn, bn, k // bk, bk)
    scale = jnp.maximum(jnp.abs(blocks).max(axis=(1, 3)), 1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).astype(jnp.float8_e4m3fn)
    return q.reshape(out, k), scale


def weight_sets(out: int, k: int, block: tuple[int, int]) -> list[tuple[Any, Any]]:
    """Copies of one random weight (different buffers) that together hold FOOTPRINT bytes
    (at most MAX_COPIES: only the tiny shape reaches it); consecutive calls of a chain read
    different copies."""
    w = jax.random.normal(jax.random.PRNGKey(0), (out, k), jnp.bfloat16) / k ** 0.5
    q, s = quantize(w, block)
    copies = min(MAX_COPIES, max(1, -(-FOOTPRINT // (out * k))))
    return [(jnp.copy(q), jnp.copy(s)) if i else (q, s) for i in range(copies)]


def jax_seconds(program: Any, xs: list[Any], sets: list[tuple[Any, Any]], budget: float
                ) -> float:
    """Median seconds per op call of a :func:`~xla_kernels.bench.barrier_chain` program."""
    return budgeted_seconds(program, (xs, sets), budget, calls=CHAIN)


def torch_weights(sets: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The weight sets as CUDA torch tensors (copied through the host once per shape)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA GPU")
    return [(torch.from_numpy(np.asarray(q).view(np.uint8)).cuda().view(torch.float8_e4m3fn),
             torch.from_numpy(np.asarray(s)).cuda()) for q, s in sets]


def scaled_mm_peer(xs: list[Any], weights: list[tuple[Any, Any]], block: tuple[int, int]
                   ) -> tuple:
    """(call(i) -> y of x copy i and weight set i % len(weights), torch module):
    torch._scaled_mm on the same data, x quantized per token beforehand (not timed: the
    cuBLASLt GEMM alone)."""
    import torch

    quantized = []
    for x in xs:
        xt = torch.from_numpy(np.asarray(x, np.float32)).cuda()
        sx = torch.clamp(xt.abs().amax(dim=1, keepdim=True), min=1e-12) / 448.0
        xq = (xt / sx).clamp(-448, 448).to(torch.float8_e4m3fn)
        if block != (0, 0):
            # 1x128 blocks of x (each token's scale repeated along in), outer-dimension
            # major, beside the weight's 128x128 scales for mat2 = weight.T [in, out].
            kb = -(-xt.shape[1] // block[1])
            sx = sx.expand(-1, kb).t().contiguous().t()
        quantized.append((xq, sx))

    def call(i: int) -> Any:
        xq, sx = quantized[i]
        wq, ws = weights[i % len(weights)]
        return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=ws.t(),
                                out_dtype=torch.bfloat16)

    return call, torch


def torch_seconds(call: Any, torch: Any, budget: float) -> float:
    """Median seconds per call of CHAIN calls (``call(i)``) captured in one CUDA graph,
    replayed back to back between CUDA events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(CHAIN):  # warm up (cuBLASLt picks its algorithm) outside the graph
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call(i) for i in range(CHAIN)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    one = start.elapsed_time(end) / 1e3
    replays = max(1, min(200, int(budget / WINDOWS / max(one, 1e-6))))
    samples = []
    for _ in range(WINDOWS):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / replays / CHAIN)
    del outs, graph
    return statistics.median(samples)


def op_of(peer: str, block: tuple[int, int]) -> Any:
    """The JAX peer's call ``(x, q, s) -> y``."""
    if peer in ("ours", "ours_w8a8"):
        scheme = "none" if peer == "ours" else "dynamic"
        return lambda x, q, s: fp8_linear(x, q, s, block_shape=block, activation_scheme=scheme)
    scheme = "dynamic" if peer == "xla_fp8" else "none"
    return lambda x, q, s: fp8_linear_xla(x, q, s, block_shape=block, activation_scheme=scheme)


def measure(shape: str, scales: str, tokens: int, sets: list[tuple[Any, Any]],
            weights: Any, peers: tuple[str, ...], budget: float, copy_gbs: float
            ) -> dict[str, Any]:
    """One row: every peer at one shape, scale format and token count. ``weights``: the
    sets as torch tensors, or the exception that prevented them."""
    out, k = SHAPES[shape]
    block = SCALES[scales]
    keys = jax.random.split(jax.random.PRNGKey(tokens), CHAIN)
    xs = [jax.random.normal(key, (tokens, k), jnp.bfloat16) for key in keys]
    weight_bytes = out * k + 4 * int(np.prod(sets[0][1].shape))
    floor = weight_bytes / (copy_gbs * 1e9)
    row: dict[str, Any] = {"shape": shape, "out": out, "in": k, "scales": scales,
                           "tokens": tokens, "weight_mb": weight_bytes / 1e6,
                           "floor_us": 1e6 * floor, "weight_copies": len(sets)}
    outs = {}
    for peer in peers:
        try:
            if peer == "scaled_mm":
                if isinstance(weights, Exception):
                    raise weights
                call, torch = scaled_mm_peer(xs, weights, block)
                outs[peer] = call(0).float().cpu().numpy()
                seconds = torch_seconds(call, torch, budget)
            else:
                program = barrier_chain(op_of(peer, block), len(sets), CHAIN)
                outs[peer] = np.asarray(program(xs, sets)[0], np.float32)
                seconds = jax_seconds(program, xs, sets, budget)
            row[f"{peer}_us"] = 1e6 * seconds
            row[f"{peer}_roof_pct"] = 100 * floor / seconds
        except Exception as e:  # recorded (a refused layout, no CUDA torch, out of memory)
            row[f"{peer}_us"] = None
            row[f"{peer}_error"] = str(e).strip().splitlines()[0][:200] if str(e) else repr(e)
    ref = outs.get("dequant_bf16")
    for peer in ("ours", "ours_w8a8", "xla_fp8", "scaled_mm"):
        if ref is not None and peer in outs:
            row[f"{peer}_err"] = float(np.linalg.norm(outs[peer] - ref)
                                       / max(np.linalg.norm(ref), 1e-30))
    print(json.dumps(row), flush=True)
    return row


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(rows: list[dict[str, Any]], head: dict[str, Any], peers: tuple[str, ...]) -> str:
    cols = " | ".join(f"{p} us | {p} roof %" for p in peers)
    lines = [f"# fp8_linear vs XLA and torch fp8 linears ({head['device'].get('device', '?')})",
             "", f"Copy bandwidth {head['copy_gbs']:.0f} GB/s measured (nominal HBM "
             f"{fmt(head['hbm_tbs'], '.2f')} TB/s). floor = weight bytes / copy bandwidth; "
             "roof % = floor / time. err: relative to dequant_bf16 (W8A8 peers include x's "
             "e4m3 rounding).", "",
             f"| shape | scales | tokens | weight MB | floor us | {cols} | ours err | "
             "w8a8 err |", "|" + "---|" * (7 + 2 * len(peers))]
    for r in rows:
        vals = " | ".join(f"{fmt(r.get(f'{p}_us'), '.1f')} | {fmt(r.get(f'{p}_roof_pct'), '.0f')}"
                          for p in peers)
        lines.append(f"| {r['shape']} {r['out']}x{r['in']} | {r['scales']} | {r['tokens']} | "
                     f"{r['weight_mb']:.1f} | {r['floor_us']:.1f} | {vals} | "
                     f"{fmt(r.get('ours_err'), '.1e')} | {fmt(r.get('ours_w8a8_err'), '.1e')} |")
    errors = [(r, p) for r in rows for p in peers if r.get(f"{p}_error")]
    if errors:
        lines += ["", "Calls that failed:", ""]
        lines += [f"- {r['shape']} {r['scales']} {r['tokens']} tokens, {p}: {r[f'{p}_error']}"
                  for r, p in errors]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", nargs="+", default=["qkv", "o", "gate_up", "down"],
                        choices=list(SHAPES))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--scales", nargs="+", default=list(SCALES), choices=list(SCALES))
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per timing")
    args = parser.parse_args()
    peers = tuple(p for p in PEERS if p in args.peers)
    device = device_description()
    start = time.perf_counter()
    on_gpu = jax.default_backend() == "gpu"
    head = {"device": device, "hbm_tbs": hbm_tbs(device["device"]),
            "copy_gbs": copy_bandwidth_gbs(1 << 30 if on_gpu else 1 << 24)}
    print(json.dumps(head), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def write() -> None:  # after every row: a run cut short keeps what it measured
        result = {**head, "rows": rows, "seconds": time.perf_counter() - start}
        (args.out / "fp8_linear.json").write_text(json.dumps(result, indent=1))
        (args.out / "fp8_linear.md").write_text(markdown(rows, head, peers))

    for shape in args.shapes:
        for scales in args.scales:
            sets = weight_sets(*SHAPES[shape], SCALES[scales])
            weights: Any = None
            if "scaled_mm" in peers:
                try:
                    weights = torch_weights(sets)
                except Exception as e:  # no CUDA torch: each row records it
                    weights = e
            for t in args.tokens:
                rows.append(measure(shape, scales, t, sets, weights, peers, args.budget,
                                    head["copy_gbs"]))
                write()
            del sets, weights
    print(markdown(rows, head, peers))


if __name__ == "__main__":
    main()
