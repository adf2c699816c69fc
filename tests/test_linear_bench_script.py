"""benchmarks/linear.py on the CPU with its tiny shape: every peer runs and agrees with XLA's
dot, and the table and JSON are written (the speed columns mean nothing on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "linear.py"


@pytest.mark.slow
def test_tiny_run_writes_the_table_and_agrees_with_xla(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "tiny", "--tokens", "1",
                           "16", "--budget", "0.02", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads((tmp_path / "linear.json").read_text())["rows"]
    assert [r["tokens"] for r in rows] == [1, 16]
    for r in rows:
        assert all(r[f"{p}_us"] > 0 for p in ("linear", "xla_dot", "fp8_linear", "xla_fp8"))
        assert r["linear_err"] < 1e-2 and r["fp8_linear_err"] < 6e-2, r
        assert r["xla_fp8_err"] < 8e-2, r
    table = (tmp_path / "linear.md").read_text()
    assert "| tiny 256x384 | 1 |" in table
