"""Does XLA:GPU put our custom calls into CUDA-graph command buffers, and what does one call
cost inside one jitted program?

Under ``jax.jit``, a chain of ``N`` calls of
:data:`~xla_kernels.kernels.simple_add.simple_add` on f32[256], each consuming the previous
result (``x = simple_add(x, b)``, nothing to merge), for ``N`` in 1, 8, 32, 128; baselines:
the same chain of XLA's own adds, which XLA fuses into one kernel (``xla_add``; with
``lax.optimization_barrier`` between the steps too, ``xla_add_barrier``), and that chain with
XLA's fusion passes disabled, one kernel per add (``xla_add_unfused``).

Each XLA setting runs in its own child process (``XLA_FLAGS`` is read once per process):
``default`` (XLA's own command-buffer defaults), ``cmdbuf_off``
(``--xla_gpu_enable_command_buffer=``, nothing captured), and those two with the fusion
passes disabled for the unfused baseline. For every program it records:

* ``hlo_command_buffer``: whether the compiled HLO text has a ``command_buffer``
  computation (XLA's HLO-level ``CommandBufferScheduling`` pass), and how many of our
  custom calls sit inside such computations and outside;
* ``cb_thunks``: how many of the program's kernels (custom calls and fusions) XLA put into
  command buffers, from the log of its thunk-level ``CommandBufferConversionPass`` (newer
  XLA forms command buffers from thunks, after the HLO, so they never show in the HLO
  text): ``TF_CPP_VMODULE=command_buffer_conversion_pass=2``. ``None`` when the child's log
  has no line of that pass (the log is not there, so capture is unknown);
* ``latency_us``: one call of the program and ``block_until_ready``, median of many;
  ``pipelined_us``: :func:`xla_kernels.bench.pipelined_seconds` (50 calls queued, one wait).

Per call µs = (t(128) - t(1)) / 127 of each timing: the cost one more call adds inside one
program. The issue's goal: <= 1.5 µs per simple_add call (2.31 µs measured before).

On a machine without a GPU (or with ``--platform cpu``) it runs the same on XLA:CPU, which
has no command buffers: those columns read False / 0.

Writes ``command_buffers.json`` and ``command_buffers.md`` to ``--out`` after each setting.

Example:
    $ python benchmarks/command_buffers.py --out benchmarks/results/latest/h100
    $ python benchmarks/command_buffers.py --out /tmp/cb --platform cpu --quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NS = (1, 8, 32, 128)
SIZE = 256
LATENCY_CALLS = 300
GOAL_US = 1.5
BEFORE_US = 2.31
CHILD_TIMEOUT = 240
NO_FUSION = "--xla_disable_hlo_passes=priority-fusion,fusion,multi_output_fusion"
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"flags": "", "impls": ("simple_add", "xla_add", "xla_add_barrier")},
    "cmdbuf_off": {"flags": "--xla_gpu_enable_command_buffer=",
                   "impls": ("simple_add", "xla_add", "xla_add_barrier")},
    "default_no_fusion": {"flags": NO_FUSION, "impls": ("xla_add_unfused",)},
    "cmdbuf_off_no_fusion": {"flags": f"--xla_gpu_enable_command_buffer= {NO_FUSION}",
                             "impls": ("xla_add_unfused",)},
}
VMODULE = "command_buffer_conversion_pass=2,command_buffer_scheduling=2"
CB_LOG_FILES = ("command_buffer_conversion_pass", "command_buffer_scheduling")
CB_CREATED = "Creating command buffer thunk with the following thunks:"
MARK = "@@command_buffers@@"

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?\s(custom-call|fusion)\((.*)$")


# ------------------------------------------------------------------------ the child

def chain(impl: str, n: int) -> Callable[..., Any]:
    """``n`` dependent steps ``x = step(x, b)`` starting from ``x = a``."""
    import jax

    from xla_kernels.kernels.simple_add import simple_add

    def step(x: Any, b: Any) -> Any:
        if impl == "simple_add":
            return simple_add(x, b)
        if impl == "xla_add_barrier":
            return jax.lax.optimization_barrier(x + b)
        return x + b

    def run(a: Any, b: Any) -> Any:
        x = a
        for _ in range(n):
            x = step(x, b)
        return x

    return run


def hlo_counts(text: str, target: str) -> dict[str, Any]:
    """Command-buffer computations and kernels of a compiled program's HLO text."""
    current = None
    counts = {"hlo_custom_calls_in_cb": 0, "hlo_custom_calls_outside_cb": 0, "hlo_fusions": 0}
    names: list[str] = []
    cb_computations = 0
    for line in text.splitlines():
        header = _HEADER.match(line) if not line.startswith(" ") else None
        if header:
            current = header.group(1)
            cb_computations += current.startswith("command_buffer")
            continue
        if line.startswith("}"):
            current = None
            continue
        instr = _INSTR.match(line) if current is not None else None
        if instr is None:
            continue
        if instr.group(2) == "fusion":
            counts["hlo_fusions"] += 1
            names.append(instr.group(1))
        elif f'custom_call_target="{target}"' in instr.group(3):
            inside = current.startswith("command_buffer")
            counts["hlo_custom_calls_in_cb" if inside else "hlo_custom_calls_outside_cb"] += 1
            names.append(instr.group(1))
    # (By computation names only: the text's stack-frame table names this file.)
    return {"hlo_command_buffer": cb_computations > 0,
            "hlo_cb_computations": cb_computations, **counts, "kernel_names": names}


def latency_us(fn: Callable[..., Any], *args: Any) -> float:
    """Median µs of one call plus waiting for its result."""
    import jax

    for _ in range(10):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(LATENCY_CALLS):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def child(impls: list[str], ns: tuple[int, ...]) -> dict[str, Any]:
    """Compile, check and time every chain; marks each compile in stderr for the parent."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from xla_kernels.bench import device_description, pipelined_seconds
    from xla_kernels.kernels.simple_add import simple_add

    a = jnp.arange(SIZE, dtype=jnp.float32) / SIZE
    b = jnp.full((SIZE,), 0.25, jnp.float32)
    rows = []
    for impl in impls:
        for n in ns:
            row: dict[str, Any] = {"impl": impl, "n": n}
            try:
                fn = chain(impl, n)
                print(f"{MARK} BEGIN {impl} {n}", file=sys.stderr, flush=True)
                start = time.perf_counter()
                compiled = jax.jit(fn).lower(a, b).compile()
                out = np.asarray(compiled(a, b))
                row["compile_s"] = time.perf_counter() - start
                print(f"{MARK} END {impl} {n}", file=sys.stderr, flush=True)
                want = np.asarray(a)
                for _ in range(n):
                    want = want + np.asarray(b)
                row["correct"] = bool(np.array_equal(out, want))
                row.update(hlo_counts(compiled.as_text(), simple_add.target))
                row["latency_us"] = latency_us(jax.jit(fn), a, b)
                row["pipelined_us"] = pipelined_seconds(fn, a, b) * 1e6
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            rows.append(row)
    return {**device_description(), "rows": rows}


# ------------------------------------------------------------------------ the parent

def log_counts(stderr: str, row: dict[str, Any], on_gpu: bool) -> None:
    """Fill ``row["cb_thunks"]`` from the child's log between its compile marks."""
    names = set(row.pop("kernel_names", []))
    if not on_gpu:
        row["cb_thunks"] = 0
        return
    begin = f"{MARK} BEGIN {row['impl']} {row['n']}"
    end = f"{MARK} END {row['impl']} {row['n']}"
    if begin not in stderr or end not in stderr:
        row["cb_thunks"] = None
        return
    segment = stderr.split(begin, 1)[1].split(end, 1)[0]
    lines = [ln for ln in segment.splitlines() if any(f in ln for f in CB_LOG_FILES)]
    if not lines:
        row["cb_thunks"] = None
        return
    captured = []
    for ln in lines:
        if CB_CREATED in ln:
            captured += [t.strip() for t in ln.split(CB_CREATED, 1)[1].split(",")]
    row["cb_thunks"] = sum(t in names for t in captured)
    row["cb_buffers"] = sum(CB_CREATED in ln for ln in lines)


def slopes(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per impl: (t(max N) - t(min N)) / (max N - min N) of each timing, in µs."""
    out: dict[str, dict[str, float]] = {}
    for impl in dict.fromkeys(r["impl"] for r in rows):
        mine = sorted((r for r in rows if r["impl"] == impl and "latency_us" in r),
                      key=lambda r: r["n"])
        if len(mine) >= 2 and mine[-1]["n"] > mine[0]["n"]:
            lo, hi = mine[0], mine[-1]
            out[impl] = {f"{k}_per_call_us": (hi[f"{k}_us"] - lo[f"{k}_us"]) / (hi["n"] - lo["n"])
                         for k in ("latency", "pipelined")}
    return out


def run_setting(name: str, platform: str | None, ns: tuple[int, ...]) -> dict[str, Any]:
    """One child process under the setting's XLA_FLAGS; its rows, log counts and slopes."""
    setting = SETTINGS[name]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE=VMODULE,
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {setting['flags']}".strip())
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if platform:
        env["JAX_PLATFORMS"] = platform
    record: dict[str, Any] = {"xla_flags": setting["flags"], "impls": list(setting["impls"])}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", ",".join(setting["impls"]),
             "--ns", ",".join(map(str, ns))],
            env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        record["error"] = f"child timed out after {CHILD_TIMEOUT} s"
        return record
    record["seconds"] = time.perf_counter() - start
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
        record["error"] = f"child exit {proc.returncode}: {' | '.join(tail)[:500]}"
        return record
    rows = report.pop("rows")
    on_gpu = report.get("backend") != "cpu"
    for row in rows:
        log_counts(proc.stderr, row, on_gpu)
    record.update(description=report, rows=rows, slopes=slopes(rows))
    return record


def yes_no(values: list[Any]) -> str:
    return "/".join("—" if v is None else ("y" if v is True else "n" if v is False else str(v))
                    for v in values)


def markdown(result: dict[str, Any]) -> str:
    """The short report: header (device, versions, date, method), table, goal line."""
    lines = [f"# Command buffers: custom calls inside one program — {result['device']}, "
             f"jax {result['jax']}, {result['date']}", "",
             f"jaxlib {result['jaxlib']}, python {result['python']}, backend "
             f"{result['backend']}.", "",
             f"Method: under jax.jit, a chain of N dependent calls on f32[{SIZE}] "
             "(x = step(x, b)); each XLA setting in its own process. 'latency' is one program "
             "call plus block_until_ready (median of "
             f"{LATENCY_CALLS}); 'pipelined' is xla_kernels.bench.pipelined_seconds. Per call = "
             f"(t(N={max(result['ns'])}) - t(N={min(result['ns'])})) / "
             f"{max(result['ns']) - min(result['ns'])}. 'HLO cb' = a command_buffer computation "
             "in the compiled HLO text; 'CB thunks' = kernels XLA's command-buffer conversion "
             "logged as captured (— = no log line of that pass: unknown), both per N "
             f"({'/'.join(map(str, result['ns']))}). xla_add fuses into one kernel; "
             "xla_add_unfused has the fusion passes disabled (one kernel per add).", "",
             "| setting | impl | kernels | HLO cb | custom calls in/out of HLO cb | CB thunks | "
             + " | ".join(f"N={n} µs" for n in result["ns"])
             + " | per call µs (latency) | per call µs (pipelined) |",
             "|---|---|---|---|---|---|" + "---|" * len(result["ns"]) + "---|---|"]
    for name, setting in result["settings"].items():
        if "error" in setting:
            lines.append(f"| {name} | — | {setting['error']} |")
            continue
        for impl in setting["impls"]:
            rows = [r for r in setting["rows"] if r["impl"] == impl]
            slope = setting["slopes"].get(impl, {})
            kernels = [r.get("hlo_fusions", 0) + r.get("hlo_custom_calls_in_cb", 0)
                       + r.get("hlo_custom_calls_outside_cb", 0) if "error" not in r else None
                       for r in rows]
            calls = [f"{r['hlo_custom_calls_in_cb']}/{r['hlo_custom_calls_outside_cb']}"
                     if "hlo_custom_calls_in_cb" in r else "—" for r in rows]
            times = [format(r["latency_us"], ".1f") if "latency_us" in r else "—" for r in rows]
            lines.append(
                f"| {name} | {impl} | {yes_no(kernels)} | "
                f"{yes_no([r.get('hlo_command_buffer') for r in rows])} | "
                f"{' '.join(calls) if impl == 'simple_add' else '—'} | "
                f"{yes_no([r.get('cb_thunks') for r in rows])} | " + " | ".join(times)
                + f" | {fmt(slope.get('latency_per_call_us'))} | "
                f"{fmt(slope.get('pipelined_per_call_us'))} |")
    errors = [(name, r) for name, s in result["settings"].items() for r in s.get("rows", [])
              if "error" in r or not r.get("correct", True)]
    if errors:
        lines += ["", "Errors:"] + [
            f"- {name} {r['impl']} N={r['n']}: {r.get('error', 'wrong result')}"
            for name, r in errors]
    ours = result["settings"].get("default", {}).get("slopes", {}).get("simple_add")
    if ours:
        lat = ours["latency_per_call_us"]
        verdict = "met" if lat <= GOAL_US else "not met"
        lines += ["", f"simple_add per call inside one program (default flags, latency): "
                      f"{lat:.2f} µs; goal <= {GOAL_US} µs ({verdict}; {BEFORE_US} µs "
                      "measured before)."]
    return "\n".join(lines) + "\n"


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def summary(name: str, setting: dict[str, Any]) -> list[str]:
    """One line per (setting, impl)."""
    if "error" in setting:
        return [f"{name}: ERROR {setting['error']}"]
    lines = []
    for impl in setting["impls"]:
        rows = [r for r in setting["rows"] if r["impl"] == impl]
        slope = setting["slopes"].get(impl, {})
        lines.append(
            f"{name:<22s} {impl:<16s} latency µs "
            + " ".join(fmt(r.get("latency_us")) for r in rows)
            + f"  per call {fmt(slope.get('latency_per_call_us'))} µs (pipelined "
            f"{fmt(slope.get('pipelined_per_call_us'))}); HLO cb "
            f"{yes_no([r.get('hlo_command_buffer') for r in rows])}, CB thunks "
            f"{yes_no([r.get('cb_thunks') for r in rows])}"
            + "".join(f"; N={r['n']}: {r['error']}" for r in rows if "error" in r))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    parser.add_argument("--quick", action="store_true", help="only the default and cmdbuf_off "
                        "settings (no unfused baseline)")
    parser.add_argument("--platform", choices=("cpu", "cuda"),
                        help="JAX_PLATFORMS for the children (default: JAX's choice)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ns", default=",".join(map(str, NS)), help=argparse.SUPPRESS)
    args = parser.parse_args()
    ns = tuple(int(n) for n in args.ns.split(","))
    if args.child:
        print(json.dumps(child(args.child.split(","), ns)))
        return

    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    names = [n for n in SETTINGS if not (args.quick and "no_fusion" in n)]
    result: dict[str, Any] = {"device": "?", "backend": "?", "jax": "?", "jaxlib": "?",
                              "python": sys.version.split()[0],
                              "date": datetime.date.today().isoformat(), "ns": list(ns),
                              "size": SIZE, "goal_us": GOAL_US, "before_us": BEFORE_US,
                              "settings": {}}
    for name in names:
        setting = run_setting(name, args.platform, ns)
        result.update(setting.pop("description", {}))
        result["settings"][name] = setting
        result["seconds"] = time.perf_counter() - began
        (args.out / "command_buffers.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "command_buffers.md").write_text(markdown(result))
        print("\n".join(summary(name, setting)), flush=True)
    print(markdown(result))
    print(f"wrote {args.out}/command_buffers.{{json,md}} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
