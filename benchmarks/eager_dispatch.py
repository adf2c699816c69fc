"""Per-call cost of an eager torch op: torch.add vs simple_add through the native (C++)
kernel vs the Python kernel, on CPU tensors and (when available) CUDA tensors.

    PYTHONPATH=src python benchmarks/eager_dispatch.py [--out DIR] [--rounds N]

For f32[1024] inputs it prints, per device, the median µs per call of

* ``dispatch``: the call alone (batches of calls, divided; CUDA work is queued, not
  waited for; on the CPU the kernel runs inside the call);
* ``call+sync``: one call and waiting for its result (``torch.cuda.synchronize``);

for ``torch.add``, ``torch.ops.xla_kernels.simple_add`` with the native kernel, and the
same op with the Python kernel (a child process with ``XLA_KERNELS_TORCH_NATIVE=0``),
plus each op's ratio to ``torch.add`` measured in the same process, interleaved. The
report goes to ``DIR/eager_dispatch.json`` when ``--out`` is given.

Example:
    $ PYTHONPATH=src python benchmarks/eager_dispatch.py --rounds 50
    cpu   torch.add   dispatch 1.40 us ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from xla_kernels.frontends.torch import native as torch_native
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.simple_add import simple_add

N = 1024
BATCH = 50  # calls per timed batch (dispatch); per-call timer overhead is then negligible


def measure(device: str, rounds: int) -> dict[str, dict[str, float]]:
    """Median µs per call of torch.add and of simple_add in this process, interleaved."""
    add = torch_op(simple_add)
    a = torch.randn(N, device=device)
    b = torch.randn(N, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fns = {"torch.add": lambda: torch.add(a, b), "simple_add": lambda: add(a, b)}
    torch.testing.assert_close(add(a, b), a + b, rtol=0, atol=0)
    for fn in fns.values():  # warm-up: plans, allocator pools, CUDA context
        for _ in range(500):
            fn()
    sync()
    dispatch: dict[str, list[float]] = {k: [] for k in fns}
    roundtrip: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(BATCH):
                fn()
            dispatch[name].append((time.perf_counter() - t0) / BATCH)
            sync()
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                sync()
                roundtrip[name].append(time.perf_counter() - t0)
    return {name: {"dispatch_us": round(statistics.median(dispatch[name]) * 1e6, 3),
                   "call_and_sync_us": round(statistics.median(roundtrip[name]) * 1e6, 3)}
            for name in fns}


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def child(rounds: int) -> dict[str, Any]:
    """What one process measures: per device, torch.add and simple_add."""
    return {"status": torch_native.native_status(),
            "results": {d: measure(d, rounds) for d in devices()}}


def python_path_in_child(rounds: int) -> dict[str, Any]:
    env = dict(os.environ, XLA_KERNELS_TORCH_NATIVE="0")
    proc = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(rounds)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write eager_dispatch.json here")
    parser.add_argument("--rounds", type=int, default=200, help="interleaved rounds")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rounds)))
        return

    native = child(args.rounds)
    python = python_path_in_child(args.rounds)
    table: dict[str, dict[str, Any]] = {}
    for device in devices():
        n, p = native["results"][device], python["results"][device]
        rows = {"torch.add": n["torch.add"], "simple_add native": n["simple_add"],
                "simple_add python": p["simple_add"]}
        for key in ("dispatch_us", "call_and_sync_us"):
            rows["simple_add native"][f"{key}_vs_torch_add"] = round(
                n["simple_add"][key] / n["torch.add"][key], 2)
            rows["simple_add python"][f"{key}_vs_torch_add"] = round(
                p["simple_add"][key] / p["torch.add"][key], 2)
        table[device] = rows

    print(f"native kernels: {native['status']}")
    print(f"{'device':6s} {'op':20s} {'dispatch us':>12s} {'x torch.add':>12s} "
          f"{'call+sync us':>13s} {'x torch.add':>12s}")
    for device, rows in table.items():
        for name, r in rows.items():
            print(f"{device:6s} {name:20s} {r['dispatch_us']:12.2f} "
                  f"{r.get('dispatch_us_vs_torch_add', 1.0):12.2f} "
                  f"{r['call_and_sync_us']:13.2f} "
                  f"{r.get('call_and_sync_us_vs_torch_add', 1.0):12.2f}")
    report = {
        "what": f"per-call µs of an eager op on two f32[{N}] tensors, median after warm-up; "
                f"dispatch: batches of {BATCH} calls without waiting; call+sync: one call "
                "and waiting for its result. Ratios are to torch.add in the same process.",
        "native_status": native["status"], "python_status": python["status"],
        "torch": torch.__version__, "host": platform.node(), "rounds": args.rounds,
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "results": table,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "eager_dispatch.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
