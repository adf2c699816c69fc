"""benchmarks/moe.py on the CPU with its tiny model: every peer runs, ours agrees with the
ragged_dot peer (bf16 and fp8 block weights), and the table and JSON are written (the speed
columns mean nothing on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "moe.py"


def test_tiny_run_writes_the_table_and_agrees_with_ragged_dot(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny", "--tokens", "1",
                           "16", "--budget", "0.02", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads((tmp_path / "moe.json").read_text())["rows"]
    assert [(r["weights"], r["tokens"]) for r in rows] == [
        ("bf16", 1), ("bf16", 16), ("fp8 128x128", 1), ("fp8 128x128", 16)]
    for r in rows:
        assert all(r[f"{p}_ms"] > 0 for p in ("ours", "ragged_dot", "loop")), r
        assert r["err_vs_ragged_dot"] < 2e-2, r
        hit = r["experts_hit"]
        assert hit == 2 if r["tokens"] == 1 else 2 <= hit <= 8, r
    table = (tmp_path / "moe.md").read_text()
    assert "| tiny | bf16 | 1 | 2 |" in table and "Calls that failed" not in table
