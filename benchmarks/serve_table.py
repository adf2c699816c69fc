"""The 8b table: serve-bench results (one JSON per cell, ``scripts/gpu/serve.sh
8b_table_WEIGHTS_KV_SHAPE``) side by side with the HBM roofline of each decode step.

For each cell: decode tokens/s, the wall decode step at the widest batch (the median of the
engine's steps with the most sequences, host included, async scheduling) and the device
step (that batch replayed back to back: no host work), the bytes the device step must read
(every weight but the embedding, and the replayed batch's KV cache) and the floor they set
at ``--copy-gbs`` (a copy bandwidth measured on the same machine, read + write), and the
device step's fraction of that floor. At 256 tokens a bf16 weight is used for 256 rows, so
the projections are compute-bound there (docs/design/serving_step.md): ``compute floor``
is 2 x tokens x the parameters read (projections and LM head) at ``--peak-tflops`` (989,
dense bf16), and ``floor`` is max(weight bytes / bandwidth, compute floor) + KV bytes /
bandwidth (the GEMMs and the attention run one after the other). ``HBM floor`` is the
issue's roofline, all bytes over the bandwidth.

Writes ``serve_8b_table.md`` and ``serve_8b_table.json`` to ``--out``.

Example:
    $ python benchmarks/serve_table.py --out benchmarks/results/latest/h200 --copy-gbs 4100 \\
        OUT/serve/serve_8b_table_*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def cell(result: dict[str, Any], copy_gbs: float, peak_tflops: float) -> dict[str, Any]:
    """One row of the table from one serve-bench JSON.

    Example:
        >>> r = {"config": {"weights": "model", "kv_cache_dtype": "auto"},
        ...      "decode_tokens_per_s": 100.0, "weights": {"bytes_read_per_step": 4e9,
        ...      "projection_bytes": 4e9}, "kv_cache": {"dtype": "bfloat16"},
        ...      "breakdown": {"replayed_num_seqs": 64, "replayed_context_per_seq": 100,
        ...                    "replayed_kv_bytes_read": 4e9, "decode_step_ms": 2.0,
        ...                    "decode_step_device_ms": 2.5}}
        >>> row = cell(r, copy_gbs=4000.0, peak_tflops=1000.0)
        >>> row["floor_ms"], row["device_of_floor"], row["wall_over_device"]
        (2.0, 0.8, 0.8)
        >>> cell(r, copy_gbs=4000.0, peak_tflops=100.0)["floor_ms"]  # compute-bound GEMMs
        3.56
    """
    config, breakdown = result["config"], result["breakdown"]
    weights = result["weights"]["bytes_read_per_step"]
    kv = breakdown["replayed_kv_bytes_read"]
    seqs = breakdown["replayed_num_seqs"]
    bytes_ms = (weights + kv) / copy_gbs / 1e6
    weight_ms, kv_ms = weights / copy_gbs / 1e6, kv / copy_gbs / 1e6
    # Projections: 2 bytes a parameter in bf16, 1 in fp8 (with f32 scales, 0.03 %); the rest
    # of the bytes read (the LM head) is bf16.
    projection = result["weights"]["projection_bytes"]
    params = projection / (2 if config["weights"] == "model" else 1) + (weights - projection) / 2
    compute_ms = 2 * seqs * params / (peak_tflops * 1e12) * 1e3
    floor = max(weight_ms, compute_ms) + kv_ms
    device, wall = breakdown["decode_step_device_ms"], breakdown["decode_step_ms"]
    return {
        "weights": "bf16" if config["weights"] == "model" else config["weights"],
        "kv_cache": result["kv_cache"]["dtype"],
        "batch": f"{seqs} x {breakdown['replayed_context_per_seq']}",
        "decode_tokens_per_s": round(result["decode_tokens_per_s"], 1),
        "wall_step_ms": wall,
        "device_step_ms": device,
        "weight_gb": round(weights / 1e9, 3),
        "kv_gb": round(kv / 1e9, 3),
        "bytes_floor_ms": round(bytes_ms, 3),
        "compute_floor_ms": round(compute_ms, 3),
        "floor_ms": round(floor, 3),
        "device_of_floor": round(floor / device, 3),
        "device_of_bytes_floor": round(bytes_ms / device, 3),
        "wall_over_device": round(wall / device, 3),
        "attention_ms": breakdown.get("attention_ms"),
    }


def markdown(rows: list[dict[str, Any]], head: dict[str, Any]) -> str:
    lines = [f"# serve-bench --preset 8b: the decode step against its floor ({head['device']})",
             "",
             f"Copy bandwidth {head['copy_gbs']:.0f} GB/s (--copy-gbs: a measured copy's), dense "
             f"bf16 peak {head['peak_tflops']:.0f} TFLOP/s. HBM floor = (weight + KV bytes) / "
             "copy bandwidth; floor = max(weight bytes / bandwidth, GEMM FLOPs / peak) + KV "
             "bytes / bandwidth; device step = the widest decode batch replayed with no host "
             "work; wall = the engine's median step at that batch size (async scheduling).",
             "",
             "| weights | KV | batch | decode tok/s | wall ms | device ms | weights GB | KV GB "
             "| HBM floor ms | device / HBM floor | GEMM compute floor ms | floor ms "
             "| device / floor | attention ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['weights']} | {r['kv_cache']} | {r['batch']} | {r['decode_tokens_per_s']:.0f} "
            f"| {r['wall_step_ms']:.3f} | {r['device_step_ms']:.3f} | {r['weight_gb']:.2f} "
            f"| {r['kv_gb']:.2f} | {r['bytes_floor_ms']:.3f} "
            f"| {100 * r['device_of_bytes_floor']:.0f} % | {r['compute_floor_ms']:.3f} "
            f"| {r['floor_ms']:.3f} | {100 * r['device_of_floor']:.0f} % "
            f"| {r['attention_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="serve-bench JSON files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--copy-gbs", type=float, required=True)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    results = [json.loads(p.read_text()) for p in args.results]
    rows = [cell(r, args.copy_gbs, args.peak_tflops) for r in results]
    rows.sort(key=lambda r: (int(r["batch"].split(" x ")[0]), r["weights"] != "bf16",
                             r["kv_cache"] != "bfloat16"))
    head = {"device": results[0]["config"]["device"], "copy_gbs": args.copy_gbs,
            "peak_tflops": args.peak_tflops,
            "sources": [p.name for p in args.results]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_8b_table.json").write_text(json.dumps({**head, "rows": rows}, indent=1))
    text = markdown(rows, head)
    (args.out / "serve_8b_table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
