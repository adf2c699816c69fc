"""benchmarks/nsys_window.py on a report-shaped SQLite database: busy time is the union of
kernel intervals inside each NVTX range, and the host share follows from two ranges."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT, "
               "textId INTEGER)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, "
               "deviceId INTEGER)")
    db.execute("INSERT INTO StringIds VALUES (7, 'full')")
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?)",
                   [(1_000, 11_000_000, "first", None), (20_000_000, 60_000_000, None, 7)])
    kernels = [(2_000, 5_000_000), (4_000_000, 8_000_000),       # first: 8 ms busy, overlapping
               (21_000_000, 29_000_000), (30_000_000, 40_000_000),  # full: 8 + 10 ms
               (55_000_000, 70_000_000)]                          # clipped at 60: 5 ms
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0)", kernels)
    db.commit()


def test_host_share_from_the_two_ranges(tmp_path):
    _report(tmp_path / "r.sqlite")
    throughput = {"new_tokens": 3, "decode_step_ms": 10.0}
    (tmp_path / "t.json").write_text(json.dumps(throughput))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nsys_window.py"),
                          str(tmp_path / "r.sqlite"), "--throughput", str(tmp_path / "t.json")],
                         capture_output=True, text=True, check=True)
    device = json.loads(out.stdout)["devices"]["0"]
    assert abs(device["busy_ms"]["first"] - 7.998) < 1e-6
    assert device["busy_ms"]["full"] == 23.0
    # (23 - 7.998) ms over 2 decode steps = 7.501 ms of a 10 ms step
    assert device["device_step_ms"] == 7.501 and device["host_share"] == 0.2499


def test_missing_ranges_are_named(tmp_path):
    _report(tmp_path / "r.sqlite")
    db = sqlite3.connect(tmp_path / "r.sqlite")
    db.execute("DELETE FROM NVTX_EVENTS WHERE text = 'first'")
    db.commit()
    (tmp_path / "t.json").write_text(json.dumps({"new_tokens": 3, "decode_step_ms": 1.0}))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nsys_window.py"),
                          str(tmp_path / "r.sqlite"), "--throughput", str(tmp_path / "t.json")],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "['first']" in out.stderr and "--nvtx" in out.stderr
