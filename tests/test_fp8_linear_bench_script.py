"""benchmarks/fp8_linear.py on the CPU with its tiny shape: every JAX peer runs and agrees with
the dequantize + dot peer, torch._scaled_mm's failure without CUDA is recorded, not fatal,
and the table and JSON are written (the speed columns mean nothing on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "fp8_linear.py"


@pytest.mark.slow
def test_tiny_run_writes_the_table_and_agrees_with_the_dequantized_dot(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "tiny", "--tokens", "1",
                           "16", "--budget", "0.02", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "fp8_linear.json").read_text())
    rows = result["rows"]
    assert [(r["scales"], r["tokens"]) for r in rows] == [
        ("block", 1), ("block", 16), ("channel", 1), ("channel", 16)]
    for r in rows:
        assert all(r[f"{p}_us"] > 0 for p in ("ours", "ours_w8a8", "xla_fp8", "dequant_bf16"))
        assert r["ours_err"] < 1e-2 and r["ours_w8a8_err"] < 6e-2, r
        assert r["xla_fp8_err"] < 6e-2 and r["weight_copies"] == 16, r
        assert r["scaled_mm_us"] is None and r["scaled_mm_error"], r
    assert rows[0]["weight_mb"] == (256 * 384 + 4 * 2 * 3) / 1e6
    table = (tmp_path / "fp8_linear.md").read_text()
    assert "| tiny 256x384 | block | 1 |" in table and "Calls that failed" in table
