"""Where a serving step's host time goes: serve-bench runs under XLA runtime variants, side
by side.

With ``--run`` it runs ``serve-bench`` (default ``--preset 1b --frontend jax
--async-scheduling --no-reference`` on the GPU) once per ``--tp`` and ``--variants`` entry,
each in its own process with the variant's environment (``VARIANTS`` below: ``XLA_FLAGS``
appended to any already set, the PjRt client's async dispatch, ...), writing
``serve_dispatch_tp<t>_<variant>.{json,txt}``; ``scripts/gpu/tp.sh OUT dispatch`` does this in
its ``dispatch`` step. Then (or with only ``--dir``) it tabulates, per run: the tokens/s
and the median decode step of
the engine, its host time per step (with async scheduling: scheduling, the batch's copy,
feeding the tokens and dispatching the step), and serve-bench's replays of the widest
decode step: back to back on one prepared batch (``device step``), with a new batch put on
the device every step as the engine does (``fresh batch``), and the host time of one
launch on an idle device (``dispatch``). A variant whose run failed (an unknown flag, say)
is listed with its log's last line.

Reading it: if ``dispatch`` is most of ``decode step``, the launch is the limit; if
``fresh batch`` is well above ``device step``, the new input buffers cost the step (XLA's
CUDA graphs are updated for them); a variant that moves ``dispatch`` names the cause.

Example:
    $ python benchmarks/dispatch_variants.py --run --out /tmp/out --tp 2 1 \\
        --variants base sync_dispatch nccl nccl_graphs no_graphs
    $ python benchmarks/dispatch_variants.py --dir /tmp/out --out /tmp/report
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# Variant name -> environment of its serve-bench run (scripts/gpu/tp.sh runs them all).
# "base" is serve-bench as it comes: with --async-scheduling --frontend jax on a GPU (this
# script's default) that includes the PjRt client's async dispatch (serving.cli.async_dispatch_env);
# "sync_dispatch" turns it off. (An "async_dispatch" variant, which set the variable to 1,
# ran the same configuration as "base" and is gone.)
VARIANTS = {
    "base": {},
    "sync_dispatch": {"PJRT_GPU_ENABLE_ASYNC_DISPATCH": "0"},
    "nccl": {"XLA_FLAGS": "--xla_gpu_experimental_use_collective_kernels="},
    "nccl_graphs": {"XLA_FLAGS": "--xla_gpu_experimental_use_collective_kernels= "
                                 "--xla_gpu_enable_command_buffer=+COLLECTIVES "
                                 "--xla_gpu_graph_min_graph_size=1"},
    "no_graphs": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
}

NAME = re.compile(r"serve_dispatch_tp(\d+)_(\w+)\.json$")
COLUMNS = ("tp", "variant", "runtime env", "tokens/s", "decode step ms", "host ms/step",
           "device step ms", "fresh batch ms", "dispatch ms")


SERVE_ARGS = ("--preset", "1b", "--frontend", "jax", "--async-scheduling", "--no-reference",
              "--platform", "gpu", "--no-progress")


def variant_env(variant: str, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``variant``'s settings: its ``XLA_FLAGS`` appended to those already
    there (a fake device count, say), its other variables set.

    Example:
        >>> variant_env("no_graphs", {"XLA_FLAGS": "--a=1"})["XLA_FLAGS"]
        '--a=1 --xla_gpu_enable_command_buffer='
    """
    env = dict(environ)
    for key, value in VARIANTS[variant].items():
        env[key] = f"{env[key]} {value}" if key == "XLA_FLAGS" and env.get(key) else value
    return env


def run_variant(out: Path, tp: int, variant: str, serve_args: list[str],
                timeout: float) -> Path:
    """One serve-bench process of ``variant`` at ``tp``; its JSON's path (the output's last
    lines go to the ``.txt`` beside it, the failure's cause among them)."""
    json_path = out / f"serve_dispatch_tp{tp}_{variant}.json"
    cmd = [sys.executable, "-m", "xla_kernels.cli", "serve-bench", *serve_args,
           "--tp", str(tp), "--json", str(json_path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=variant_env(variant, dict(os.environ)))
        text, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        text, code = f"{e.stdout or ''}{e.stderr or ''}timed out after {timeout} s", "timeout"
    tail = [line for line in text.splitlines() if line.strip()][-25:]
    tail.append(f"exit {code}")
    json_path.with_suffix(".txt").write_text("\n".join(tail) + "\n")
    print(f"tp {tp} {variant}: exit {code}", flush=True)
    return json_path


def row(path: Path) -> dict[str, Any]:
    """One table row from a serve-bench JSON named ``serve_dispatch_tp<t>_<variant>.json``
    (or, when the JSON is missing or unreadable, from the ``.txt`` log beside it).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "serve_dispatch_tp2_nccl.txt").write_text("Fatal: unknown flag\\nexit 1\\n")
        >>> row(d / "serve_dispatch_tp2_nccl.json")["error"]
        'Fatal: unknown flag (exit 1)'
    """
    tp, variant = NAME.search(path.name).groups()
    out: dict[str, Any] = {"tp": int(tp), "variant": variant}
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        log = path.with_suffix(".txt")
        lines = log.read_text().strip().splitlines() if log.exists() else []
        if len(lines) >= 2 and lines[-1].startswith("exit"):
            lines = [f"{lines[-2]} ({lines[-1]})"]
        out["error"] = lines[-1].replace("|", "/") if lines else "no JSON and no log"
        return out
    breakdown = result.get("breakdown") or {}
    out.update({
        "runtime env": " ".join(f"{k}={v}" for k, v in
                                result["config"].get("runtime_env", {}).items()
                                if k != "CUDA_VISIBLE_DEVICES") or "-",
        "tokens/s": result["tokens_per_s"],
        "decode step ms": result["decode_step_ms"],
        "host ms/step": result["host_ms_per_step"],
        "device step ms": breakdown.get("decode_step_device_ms"),
        "fresh batch ms": breakdown.get("decode_step_fresh_batch_ms"),
        "dispatch ms": breakdown.get("dispatch_ms"),
    })
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of ``rows`` (failed runs last, with their error).

    Example:
        >>> print(table([{"tp": 2, "variant": "base", "tokens/s": 1.0}]).splitlines()[2])
        | 2 | base |  | 1.0 |  |  |  |  |  |
    """
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['tp']} | {r['variant']} | failed: {r['error']} |"
                         + " |" * (len(COLUMNS) - 3))
        else:
            lines.append("| " + " | ".join("" if r.get(c) is None else str(r[c])
                                           for c in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="where the JSONs are (default: --out)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--run", action="store_true", help="run the variants first")
    parser.add_argument("--tp", type=int, nargs="+", default=[2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    parser.add_argument("--serve-args", default=" ".join(SERVE_ARGS),
                        help="serve-bench's options but --tp and --json (one string)")
    args = parser.parse_args()
    directory, out = Path(args.dir or args.out), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.run:
        for tp in args.tp:
            for variant in args.variants:
                run_variant(directory, tp, variant, args.serve_args.split(), args.timeout)
    paths = {p.with_suffix(".json") for p in directory.glob("serve_dispatch_tp*_*.*")
             if NAME.search(p.with_suffix(".json").name)}
    rows = sorted((row(p) for p in paths), key=lambda r: ("error" in r, r["tp"],
                                                          list(VARIANTS).index(r["variant"])
                                                          if r["variant"] in VARIANTS
                                                          else len(VARIANTS), r["variant"]))
    text = ("# serve-bench under XLA runtime variants\n\n"
            "Method: benchmarks/dispatch_variants.py over `scripts/gpu/tp.sh` (step "
            "`dispatch`), one serve-bench process per row on one machine.\n\n"
            + table(rows) + "\n")
    (out / "dispatch_variants.md").write_text(text)
    (out / "dispatch_variants.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
