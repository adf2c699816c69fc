"""benchmarks/sampling.py (ours vs FlashInfer's sampling on the GPU) runs its smoke configs
on the CPU and writes both result files; benchmarks/sampling_passes.py (the model of the
kernel's searches) finds the defined thresholds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]


@pytest.mark.slow
def test_the_smoke_run_writes_json_and_markdown(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sampling.py"), "--out",
                          str(tmp_path), "--smoke"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "sampling.json").read_text())
    assert [r["setting"] for r in result["rows"]] == ["k50_p0.9", "plain"]
    assert all(r["ours_us"] > 0 for r in result["rows"])
    assert result["rows"][0]["ours_tokens_in_top_k"] is True
    assert "| k50_p0.9 | f32 | 2 |" in (tmp_path / "sampling.md").read_text()


def test_the_search_model_finds_the_defined_thresholds():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sampling_passes.py"),
                          "--vocab", "3000", "--rows", "2"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| top-k 50, top-p 0.9 |" in out.stdout
