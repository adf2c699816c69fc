"""vllm.LLM.generate through xla-kernels' attention: greedy tokens equal transformers' (f32),
and the model ran our backend and ops. Each run is `python -m xla_kernels.vllm.check` in a
process of its own (vLLM and tpu-inference read their settings at import)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CASES = [("tiny", "flax_nnx"), ("tiny", "vllm"), ("smollm2", "flax_nnx")]


def _check(tmp_path, model, impl, *options):
    out = tmp_path / f"{model}-{impl}.json"
    proc = subprocess.run([sys.executable, "-m", "xla_kernels.vllm.check", "--model", model,
                           "--model-impl", impl, "--json", str(out), *options],
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
    # tpu-inference's default backend, whose methods hand over to ours off TPU.
    assert result["attention"]["backend"] == "RPAAttentionBackend"
    traces = result["attention"]["traces"]
    assert traces["attend"] > 0, traces
    assert traces["ragged_paged_attention"] > 0 and traces["reshape_and_cache"] > 0, traces
    assert proc.returncode == 0, proc.stderr[-4000:]
    if model == "smollm2":
        assert result["text"][0].startswith(" Paris"), result["text"]


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["flax_nnx", "vllm"])
def test_tensor_parallel_splits_heads_over_two_devices(tmp_path, impl):
    """tensor_parallel_size=2 on two host devices: the runner's mesh has model=2, our
    attention runs per device on its heads (shard_map), the tokens stay the reference's."""
    proc, result = _check(tmp_path, "tiny", impl, "--tensor-parallel-size", "2")
    assert result["tensor_parallel_size"] == 2
    assert result["tokens"] == result["reference_tokens"], result
    assert result["ran_xla_kernels_attention"], result["attention"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "'model': 2" in proc.stdout + proc.stderr, "the runner's mesh is not model=2"


@pytest.mark.slow
def test_fp8_kv_cache_matches_a_reference_reading_the_same_rounded_cache(tmp_path):
    """kv_cache_dtype="fp8": tpu-inference's model quantizes k/v (scale 1) and our ops store
    them as they are and read them back; transformers reading keys and values rounded the
    same way (bf16 queries and outputs) gives the same greedy tokens."""
    proc, result = _check(tmp_path, "tiny", "flax_nnx", "--kv-cache-dtype", "fp8")
    assert result["kv_cache_dtype"] == "fp8"
    assert result["tokens"] == result["reference_tokens"], result
    assert proc.returncode == 0, proc.stderr[-4000:]
