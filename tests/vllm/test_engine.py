"""vllm.LLM.generate through xla-kernels' attention: greedy tokens equal transformers' (f32),
and the model ran our backend and ops. Each run is `python -m xla_kernels.vllm.check` in a
process of its own (vLLM and tpu-inference read their settings at import)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CASES = [("tiny", "flax_nnx"), ("tiny", "vllm"), ("smollm2", "flax_nnx")]


def _check(tmp_path, model, impl):
    out = tmp_path / f"{model}-{impl}.json"
    proc = subprocess.run([sys.executable, "-m", "xla_kernels.vllm.check", "--model", model,
                           "--model-impl", impl, "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-4000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("model", "impl"), CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_generate_matches_transformers_through_our_attention(tmp_path, model, impl):
    proc, result = _check(tmp_path, model, impl)
    assert result["tokens"] == result["reference_tokens"], result
    assert result["matches_transformers"]
    assert all(len(t) == 16 for t in result["tokens"])
    assert result["platform"] == "XlaKernelsPlatform"
    assert result["attention"]["backend"] == "XlaKernelsAttentionBackend"
    traces = result["attention"]["traces"]
    assert traces["ragged_paged_attention"] > 0 and traces["reshape_and_cache"] > 0, traces
    assert proc.returncode == 0, proc.stderr[-4000:]
    if model == "smollm2":
        assert result["text"][0].startswith(" Paris"), result["text"]
