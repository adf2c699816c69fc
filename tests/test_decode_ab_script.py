"""benchmarks/decode_ab.py (A/B of a compile-time switch of the decode kernels, timed by
decode_trace.py): its summary of hand-written rounds, its doctests, and what it writes when
decode_trace cannot run (here: no GPU)."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest

from xla_kernels.bench import load_script

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "decode_ab.py"


decode_ab = load_script(SCRIPT)


def test_doctests_pass():
    assert doctest.testmod(decode_ab).failed == 0


def test_summary_ratios_medians_and_fp8_speedups():
    def trace(bf16: float, fp8: float, cudnn: float) -> dict:
        def phase(us: float) -> dict:
            return {"main": {"end_to_end_us": {"median": us}}}
        return {"configs": [{"config": "32x2048", "ours_xla": phase(bf16),
                             "ours_fp8_xla": phase(fp8), "cudnn_xla": phase(cudnn)}]}

    rounds = {"A": [decode_ab.end_to_end_us(trace(92.0, 51.0, 94.0)),
                    decode_ab.end_to_end_us(trace(92.4, 51.2, 94.2))],
              "B": [decode_ab.end_to_end_us(trace(92.2, 48.0, 94.1)),
                    decode_ab.end_to_end_us(trace(92.0, 48.2, 94.3))]}
    rows = decode_ab.summarize(rounds)
    assert [(r["phase"], r["A_us"], r["B_us"]) for r in rows] == [
        ("ours_xla", [92.0, 92.4], [92.2, 92.0]),
        ("ours_fp8_xla", [51.0, 51.2], [48.0, 48.2]),
        ("cudnn_xla", [94.0, 94.2], [94.1, 94.3])]
    fp8 = rows[1]
    assert fp8["A_median"] == 51.1 and fp8["B_median"] == 48.1
    assert abs(fp8["B_over_A"] - 48.1 / 51.1) < 1e-12
    assert decode_ab.fp8_speedups(rows, "B") == {"32x2048": 92.1 / 48.1}
    text = decode_ab.markdown(rows, {"a_flags": "", "b_flags": "-DX=1", "rounds": 2,
                                     "device": "H100", "date": "2026-11-25"})
    assert "| 32x2048 | ours_fp8_xla | 51.0 / 51.2 | 48.0 / 48.2 | 51.1 | 48.1 | 0.9413 |" \
        in text
    assert "build B: 32x2048 1.915x" in text


@pytest.mark.slow
def test_a_failed_round_gives_exit_1_and_an_empty_summary(tmp_path):
    """On this CPU-only machine decode_trace.py fails (no GPU): each round is logged, the
    exit code is 1, and the summary is still written."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--rounds",
                           "1", "--b-flags=-DXK_NOTHING=1", "--configs", "2x64"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ab_A1 (default): exit " in proc.stdout and "ab_B1 (-DXK_NOTHING=1): exit " \
        in proc.stdout
    assert (tmp_path / "decode_trace_ab_A1.txt").exists()
    assert json.loads((tmp_path / "decode_ab.json").read_text())["rows"] == []
