"""benchmarks/vllm_latency.py against ``vllm serve`` on the CPU (the tiny Llama, two small
rates): every request completes, and its timings are consistent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xla_kernels import bench

ROOT = Path(__file__).resolve().parents[2]
OUTPUT_LEN = 6


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("latency")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vllm_latency.py"), "--model", "tiny",
         "--out", str(out), "--rates", "8", "inf", "--num-requests", "4", "--input-len", "24",
         "--output-len", str(OUTPUT_LEN), "--max-num-seqs", "4", "--max-model-len", "64",
         "--gpu-memory-utilization", "0.1", "--port", "8792", "--startup-timeout", "400"],
        capture_output=True, text=True, timeout=600, env=env)
    log = out / "vllm_latency_server.log"
    tail = (log.read_text()[-3000:] if log.exists() else "") + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    return json.loads((out / "vllm_latency.json").read_text()), (out / "vllm_latency.md")


@pytest.mark.slow
def test_every_request_completes_at_every_rate(report):
    result, _ = report
    assert [r["rate"] for r in result["rates"]] == [8.0, "inf"]
    for row in result["rates"]:
        assert row["completed"] == row["requests"] == 4 and row["failed"] == 0
        assert row["output_tokens"] == 4 * OUTPUT_LEN
        assert row["request_throughput"] > 0 and row["output_tokens_per_s"] > 0


@pytest.mark.slow
def test_each_request_has_consistent_timings(report):
    result, _ = report
    for records in result["requests"].values():
        for r in records:
            assert r["ok"] and r["output_tokens"] == OUTPUT_LEN
            assert len(r["itl_s"]) == OUTPUT_LEN - 1
            assert 0 < r["ttft_s"] <= r["e2e_s"]
            assert sum(r["itl_s"]) == pytest.approx(r["e2e_s"] - r["ttft_s"], abs=1e-6)
    for row in result["rates"]:
        for name in ("ttft", "itl", "e2e"):
            assert 0 <= row[f"{name}_p50_ms"] <= row[f"{name}_p99_ms"]
        assert row["ttft_p50_ms"] <= row["e2e_p99_ms"]


@pytest.mark.slow
def test_report_writes_down_the_server_settings(report):
    result, md = report
    s = result["settings"]
    assert s["platform"] == "xla_kernels.vllm (XlaKernelsPlatform)"
    assert (s["max_num_seqs"], s["max_model_len"], s["dtype"]) == (4, 64, "float32")
    assert s["gpu_memory_utilization"] == 0.1 and s["gpu_memory_utilization_passed"]
    assert any("Memory statistics" in line for line in s["server_memory"])
    assert "| inf | 4/4 |" in md.read_text()
    start = s["server_startup"]
    assert start["compilations"] > 0 and start["compilation_s"] > 0
    assert any("Precompile all" in line for line in start["phases"])
    assert "programs compiled or loaded from the cache" in md.read_text()


SERVER_LOG = """\
(E) INFO 12-03 20:02:01 [c.py:1] Enabling JAX compile cache.
(E) INFO 12-03 20:02:03 [c.py:2] Precompile all the subgraphs with possible input shapes.
(E) INFO 12-03 20:02:04 [c.py:3] Compilation of model finished in 1.25 [secs].
(E) INFO 12-03 20:02:05 [c.py:3] Compilation of sampling finished in 0.50 [secs].
(E) INFO 12-03 20:02:09 [core.py:4] init engine (profile, create kv cache) took 8.00 s
(A) INFO 12-03 20:02:10 [l.py:5] Route: /v1/models, Methods: GET
(A) INFO 12-03 20:02:11 [l.py:6] Application startup complete.
(E) INFO 12-03 20:02:30 [c.py:3] Compilation of late finished in 9.00 [secs].
(E) INFO 12-03 20:02:31 [core.py:4] a later step took 1.00 s
"""


def test_startup_lines_name_the_phases_and_sum_the_compilations_until_the_server_is_up():
    script = bench.load_script(ROOT / "benchmarks" / "vllm_latency.py")
    start = script.startup_lines(SERVER_LOG)
    assert start == {
        "phases": ["20:02:01 Enabling JAX compile cache.",
                   "20:02:03 Precompile all the subgraphs with possible input shapes.",
                   "20:02:09 init engine (profile, create kv cache) took 8.00 s",
                   "20:02:11 Application startup complete."],
        "compilations": 2, "compilation_s": 1.75}
