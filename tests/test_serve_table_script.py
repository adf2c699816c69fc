"""benchmarks/serve_table.py: its doctests, and a table from two serve-bench-shaped JSONs (a
bytes-bound and a compute-bound cell), sorted by batch, with the floors it derives."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

from xla_kernels.bench import load_script

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "serve_table.py"


def _module():
    return load_script(SCRIPT)


def test_doctests():
    assert doctest.testmod(_module()).failed == 0


def _result(weights: str, seqs: int, device_ms: float) -> dict:
    return {"config": {"weights": weights, "kv_cache_dtype": "auto", "device": "TestGPU"},
            "decode_tokens_per_s": 1000.0,
            "weights": {"bytes_read_per_step": 2e9, "projection_bytes": 2e9},
            "kv_cache": {"dtype": "bfloat16"},
            "breakdown": {"replayed_num_seqs": seqs, "replayed_context_per_seq": 100,
                          "replayed_kv_bytes_read": 2e9, "decode_step_ms": device_ms,
                          "decode_step_device_ms": device_ms, "attention_ms": 0.5}}


def test_table_from_two_cells(tmp_path):
    paths = []
    for name, result in (("big", _result("model", 256, 10.0)), ("small", _result("fp8", 1, 2.0))):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(result))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--copy-gbs",
                           "4000", "--peak-tflops", "100", *map(str, paths)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    table = json.loads((tmp_path / "serve_8b_table.json").read_text())
    small, big = table["rows"]  # sorted by batch
    assert small["batch"] == "1 x 100" and big["batch"] == "256 x 100"
    # 4 GB at 4000 GB/s: 1 ms; one token's 2e9 fp8 parameters at 100 TFLOP/s: 0.04 ms.
    assert small["bytes_floor_ms"] == 1.0 and small["floor_ms"] == 1.0
    assert small["device_of_floor"] == 0.5
    # 256 tokens x 1e9 bf16 parameters: 5.12 ms of compute, above the 0.5 ms weight read.
    assert big["compute_floor_ms"] == 5.12 and big["floor_ms"] == 5.62
    assert "| fp8 | bfloat16 | 1 x 100 |" in (tmp_path / "serve_8b_table.md").read_text()
