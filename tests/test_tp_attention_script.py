"""benchmarks/tp_attention.py --smoke on fake CPU devices: paged_attention and
ragged_paged_attention split along kv heads over 2 devices give one device's outputs, and
the compiled programs hold no collective (the speed columns mean nothing on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "tp_attention.py"


@pytest.mark.slow
def test_smoke_run_splits_both_ops_without_collectives(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--budget", "0.05",
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads((tmp_path / "tp_attention.json").read_text())["rows"]
    assert {r["op"] for r in rows} == {"paged", "ragged"}
    for r in rows:
        assert r["max_abs_diff"] == 0, r["name"]
        assert r["counts"] == {} and r["cache_collectives"] == [], r["name"]
        assert r["2_devices_ms"] > 0 and r["speedup"] > 0
    table = (tmp_path / "tp_attention.md").read_text()
    assert "| ragged 3 chunks + 2 decodes | 8/4 | 128 | float32 |" in table
