"""``vllm serve`` (vLLM's OpenAI server, its EngineCore in a spawned process) on our
attention, driven by the ``openai`` client: the completions equal transformers' greedy texts
(benchmarks/vllm_serve.py, on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_vllm_serve_answers_openai_requests_with_the_reference_texts(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vllm_serve.py"),
                           "--out", str(tmp_path), "--port", "8791", "--startup-timeout", "600"],
                          capture_output=True, text=True, timeout=900, env=env)
    server_log = (tmp_path / "vllm_serve_server.log")
    log = server_log.read_text()[-4000:] if server_log.exists() else proc.stderr[-4000:]
    result = json.loads((tmp_path / "vllm_serve.json").read_text())
    assert result["texts"] == result["reference_texts"], log
    assert result["matches_transformers"] and proc.returncode == 0, log
    assert len(result["texts"]) == 8 and all(result["texts"])
    # The engine ran in its own process, spawned by the API server.
    assert "(EngineCore pid=" in server_log.read_text()
