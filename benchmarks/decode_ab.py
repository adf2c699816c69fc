"""A/B of two builds of the decode kernels (nvcc flags), timed by CUPTI (decode_trace.py).

Runs :mod:`decode_trace` in fresh processes that alternate between build A (``--a-flags``,
default none) and build B (``--b-flags``, e.g. ``-Xptxas=-O2``), ``--rounds`` times
(A1 B1 A2 B2 ...). The flags reach nvcc through ``NVCC_APPEND_FLAGS``, which is part of
the kernel build cache's key, so each build is compiled once and then reused. Alternating
processes spread slow drifts (clocks, temperature) over both builds.

Per config and phase (``ours_xla``, ``ours_fp8_xla``, and ``cudnn_xla`` as the control
that no flag touches) it reports the end-to-end time per call of each round, the median
per build and B / A; and each build's fp8 speedup (bf16 end to end over fp8's). The
control's spread between rounds is the noise to read the B / A column against.

Writes ``decode_ab.json`` and ``decode_ab.md`` (plus each round's ``decode_trace_<tag>``
JSON and log) to ``--out``.

Example (on the GPU machine):
    $ python benchmarks/decode_ab.py --out /tmp/ab --b-flags=-Xptxas=-O2 \\
        --configs 128x8192 32x2048 8x32768 32x2048/8/256
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

PHASES = ("ours_xla", "ours_fp8_xla", "cudnn_xla")


def end_to_end_us(trace: dict[str, Any]) -> dict[tuple[str, str], float]:
    """``(config, phase) -> median end-to-end µs per call`` of one decode_trace JSON.

    Example:
        >>> end_to_end_us({"configs": [{"config": "c", "ours_xla": {"main": {
        ...     "end_to_end_us": {"median": 10.0}}}, "cudnn_xla": {"error": "none"}}]})
        {('c', 'ours_xla'): 10.0}
    """
    times = {}
    for row in trace["configs"]:
        for phase in PHASES:
            median = ((row.get(phase) or {}).get("main", {}).get("end_to_end_us") or {}) \
                .get("median")
            if median is not None:
                times[(row["config"], phase)] = float(median)
    return times


def summarize(rounds: dict[str, list[dict[tuple[str, str], float]]]) -> list[dict[str, Any]]:
    """Rows per (config, phase): each build's rounds, medians and B / A.

    Example:
        >>> a = [{("c", "ours_xla"): 10.0}, {("c", "ours_xla"): 10.2}]
        >>> b = [{("c", "ours_xla"): 9.0}, {("c", "ours_xla"): 9.4}]
        >>> row, = summarize({"A": a, "B": b})
        >>> row["A_median"], row["B_median"], round(row["B_over_A"], 4)
        (10.1, 9.2, 0.9109)
    """
    keys = sorted({k for build in rounds.values() for r in build for k in r},
                  key=lambda k: (k[0], PHASES.index(k[1])))
    rows = []
    for config, phase in keys:
        row: dict[str, Any] = {"config": config, "phase": phase}
        for name, build in rounds.items():
            values = [r[(config, phase)] for r in build if (config, phase) in r]
            row[f"{name}_us"] = values
            row[f"{name}_median"] = statistics.median(values) if values else None
        a, b = row.get("A_median"), row.get("B_median")
        row["B_over_A"] = b / a if a and b else None
        rows.append(row)
    return rows


def fp8_speedups(rows: list[dict[str, Any]], build: str) -> dict[str, float]:
    """``config -> bf16 / fp8`` end-to-end time of one build's medians.

    Example:
        >>> fp8_speedups([{"config": "c", "phase": "ours_xla", "A_median": 18.0},
        ...               {"config": "c", "phase": "ours_fp8_xla", "A_median": 10.0}], "A")
        {'c': 1.8}
    """
    by = {(r["config"], r["phase"]): r.get(f"{build}_median") for r in rows}
    return {c: by[(c, "ours_xla")] / by[(c, "ours_fp8_xla")]
            for c, p in by if p == "ours_xla" and by.get((c, "ours_fp8_xla"))
            and by[(c, "ours_xla")]}


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The table of :func:`summarize`'s rows, with the method and each build's fp8 speedup."""
    lines = [f"# Decode A/B: {meta['b_flags']!r} vs {meta['a_flags'] or 'the default'!r} — "
             f"{meta['device']}, {meta['date']}", "",
             f"Method: benchmarks/decode_ab.py; decode_trace.py (CUPTI kernel timestamps, "
             f"end-to-end µs per call, median of the phase's calls) in {meta['rounds']} "
             f"alternating process pairs (A then B). cudnn_xla is the control (no flag "
             f"touches it)." + (" Each input set's pages were read in one order by every "
                                "call (--same-order)." if meta.get("same_order") else ""), "",
             "| config | phase | A µs (rounds) | B µs (rounds) | A median | B median | B / A |",
             "|---|---|---|---|---|---|---|"]

    def fmt(values: list[float]) -> str:
        return " / ".join(f"{v:.1f}" for v in values) or "—"

    for r in rows:
        ratio = f"{r['B_over_A']:.4f}" if r["B_over_A"] else "—"
        lines.append(f"| {r['config']} | {r['phase']} | {fmt(r.get('A_us', []))} | "
                     f"{fmt(r.get('B_us', []))} | {r.get('A_median') or 0:.1f} | "
                     f"{r.get('B_median') or 0:.1f} | {ratio} |")
    for build in ("A", "B"):
        speedups = fp8_speedups(rows, build)
        if speedups:
            lines += ["", f"fp8 speedup (bf16 / fp8), build {build}: " +
                      ", ".join(f"{c} {s:.3f}x" for c, s in speedups.items())]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--a-flags", default="", help="nvcc flags of build A (default none)")
    parser.add_argument("--b-flags", required=True, help="nvcc flags of build B")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=["128x8192", "32x2048"],
                        help="decode_trace.py's --configs")
    parser.add_argument("--programs", type=int, default=3, help="decode_trace.py's --programs")
    parser.add_argument("--same-order", action="store_true", help="decode_trace.py's --same-order")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("decode_trace.py")
    base_flags = os.environ.get("NVCC_APPEND_FLAGS", "")
    rounds: dict[str, list[dict[tuple[str, str], float]]] = {"A": [], "B": []}
    device, status = "", 0
    for r in range(1, args.rounds + 1):
        for name, flags in (("A", args.a_flags), ("B", args.b_flags)):
            tag = f"ab_{name}{r}"
            env = dict(os.environ, NVCC_APPEND_FLAGS=f"{base_flags} {flags}".strip())
            with open(args.out / f"decode_trace_{tag}.txt", "w") as log:
                code = subprocess.run(
                    [sys.executable, str(script), "--out", str(args.out), "--tag", tag,
                     "--programs", str(args.programs), "--configs", *args.configs,
                     *(["--same-order"] if args.same_order else [])],
                    env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            print(f"{tag} ({flags or 'default'}): exit {code}", flush=True)
            path = args.out / f"decode_trace_{tag}.json"
            if code or not path.exists():
                status = 1
                continue
            trace = json.loads(path.read_text())
            d = trace.get("device") or {}
            device = device or f"{d.get('device', '?')}, jax {d.get('jax', '?')}"
            rounds[name].append(end_to_end_us(trace))
    rows = summarize(rounds)
    meta = {"a_flags": args.a_flags, "b_flags": args.b_flags, "rounds": args.rounds,
            "configs": args.configs, "same_order": args.same_order, "device": device,
            "date": datetime.date.today().isoformat()}
    (args.out / "decode_ab.json").write_text(json.dumps(
        {**meta, "rows": rows, "fp8_speedup": {b: fp8_speedups(rows, b) for b in "AB"}},
        indent=1))
    text = markdown(rows, meta)
    (args.out / "decode_ab.md").write_text(text)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
