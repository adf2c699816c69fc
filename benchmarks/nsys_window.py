"""GPU busy time inside NVTX ranges of an Nsight Systems report, and the decode step's host
share that follows from two of them.

``benchmarks/vllm_throughput.py --nvtx`` marks a 1-token run (``first``) and an N-token run
(``full``) of the same batch. Their difference is N - 1 decode steps, in wall time (the
script's own timing) and in GPU busy time (here: the union of every kernel interval on the
device while the range is open, so overlapping kernels count once). Per decode step::

    device_ms = (busy(full) - busy(first)) / (N - 1)
    host_share = 1 - device_ms / wall_step_ms

Reads the SQLite export of the report (``nsys export --type sqlite``): tables NVTX_EVENTS
(ranges, text inline or through StringIds) and CUPTI_ACTIVITY_KIND_KERNEL.

Example:
    $ python benchmarks/nsys_window.py OUT/vllm.sqlite --throughput OUT/vllm_throughput.json
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path


def ranges(db: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """The first NVTX range of each name: name -> (start ns, end ns)."""
    has_strings = db.execute("SELECT name FROM sqlite_master WHERE name='StringIds'").fetchone()
    text = ("COALESCE(e.text, s.value)" if has_strings else "e.text")
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if has_strings else ""
    found: dict[str, tuple[int, int]] = {}
    for name, start, end in db.execute(
            f"SELECT {text}, e.start, e.end FROM NVTX_EVENTS e {join} "
            "WHERE e.end IS NOT NULL ORDER BY e.start"):
        if name is not None and name not in found:
            found[name] = (int(start), int(end))
    return found


def busy_ns(db: sqlite3.Connection, start: int, end: int, device: int | None = None) -> int:
    """Union of kernel intervals clipped to [start, end] (on one device, or all)."""
    query = "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end > ? AND start < ?"
    params: list[int] = [start, end]
    if device is not None:
        query += " AND deviceId = ?"
        params.append(device)
    total, reach = 0, start
    for k_start, k_end in sorted(db.execute(query, params)):
        k_start, k_end = max(k_start, reach), min(k_end, end)
        if k_end > k_start:
            total += k_end - k_start
            reach = k_end
    return total


def host_share(db_path: Path, throughput: dict) -> dict:
    db = sqlite3.connect(db_path)
    marks = ranges(db)
    missing = {"first", "full"} - marks.keys()
    if missing:
        raise SystemExit(f"nsys_window: NVTX ranges {sorted(missing)} not in {db_path} (run "
                         "vllm_throughput.py with --nvtx under nsys -t cuda,nvtx)")
    devices = [d for (d,) in db.execute(
        "SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY deviceId")]
    steps = throughput["new_tokens"] - 1
    wall_step_ms = throughput["decode_step_ms"]
    result = {"decode_steps": steps, "wall_step_ms": wall_step_ms, "devices": {}}
    for device in devices:
        busy = {name: busy_ns(db, *marks[name], device) for name in ("first", "full")}
        device_ms = (busy["full"] - busy["first"]) / steps / 1e6
        result["devices"][str(device)] = {
            "busy_ms": {name: round(ns / 1e6, 3) for name, ns in busy.items()},
            "device_step_ms": round(device_ms, 3),
            "host_share": round(1 - device_ms / wall_step_ms, 4),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sqlite", type=Path)
    parser.add_argument("--throughput", type=Path, required=True,
                        help="vllm_throughput.json of the same run")
    parser.add_argument("--out", type=Path, help="write the result here too")
    args = parser.parse_args(argv)
    result = host_share(args.sqlite, json.loads(args.throughput.read_text()))
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
