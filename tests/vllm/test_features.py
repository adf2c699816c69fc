"""Engine features a vLLM user turns on, through our backend, on the tiny Llama (token ids,
f32): each one must not change greedy tokens (prefix caching, hit on a second pass; chunked
prefill; n-gram speculative decoding), and seeded sampling repeats itself. Every engine runs
in a process of its own (vLLM and tpu-inference read their settings at import), the same on
the CPU and the GPU (`bash scripts/gpu_vllm.sh features OUT`)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow

# One vllm.LLM with the given engine arguments; each pass generates every prompt with the
# given SamplingParams; prints the tokens of each pass and the prefix cache's hit rate.
_RUN = """
import json, sys
from pathlib import Path
import vllm
from xla_kernels.vllm import models

spec = json.loads(sys.argv[1])
checkpoint = models.tiny_llama(Path(spec["dir"]) / "model")
llm = vllm.LLM(model=str(checkpoint.path), dtype="float32", max_model_len=512,
               max_num_seqs=4, gpu_memory_utilization=0.5, seed=0, skip_tokenizer_init=True,
               **spec["engine"])
passes = []
for params in spec["passes"]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]],
                           vllm.SamplingParams(ignore_eos=True, **params), use_tqdm=False)
    passes.append([list(o.outputs[0].token_ids) for o in outputs])
hits = [getattr(o, "num_cached_tokens", None) for o in outputs]
print("RESULT " + json.dumps({"passes": passes, "cached_tokens": hits}))
"""


def _prompts() -> list[list[int]]:
    """Three prompts of 70-150 tokens: repeated phrases (something for the n-gram proposer
    to find) around a shared 64-token prefix (something for the prefix cache)."""
    rng = np.random.default_rng(5)
    shared = rng.integers(3, 256, 64).tolist()
    phrase = rng.integers(3, 256, 6).tolist()
    return [shared + phrase * 2 + rng.integers(3, 256, 9).tolist(),
            shared + rng.integers(3, 256, 20).tolist() + phrase * 4,
            shared + phrase * 10 + rng.integers(3, 256, 20).tolist()]


GREEDY = {"temperature": 0.0, "max_tokens": 24}


def _run(tmp_path, name, engine, passes):
    spec = {"dir": str(tmp_path / name), "engine": engine, "passes": passes,
            "prompts": _prompts()}
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(spec)], capture_output=True,
                          text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Greedy tokens with prefix caching off and every prompt prefilled in one step."""
    result = _run(tmp_path_factory.mktemp("plain"), "plain",
                  {"enable_prefix_caching": False, "max_num_batched_tokens": 512}, [GREEDY])
    tokens = result["passes"][0]
    assert all(len(t) == GREEDY["max_tokens"] for t in tokens)
    return tokens


def test_prefix_caching_hits_and_keeps_the_tokens(tmp_path, plain):
    result = _run(tmp_path, "prefix", {"enable_prefix_caching": True,
                                       "max_num_batched_tokens": 512}, [GREEDY, GREEDY])
    assert result["passes"] == [plain, plain]
    # The second pass found its prompts' full blocks in the cache.
    assert all(c and c > 0 for c in result["cached_tokens"]), result["cached_tokens"]


def test_chunked_prefill_keeps_the_tokens(tmp_path, plain):
    """A 32-token step budget: each 70-150-token prompt is prefilled over 3-5 steps, beside
    the other requests' decode."""
    result = _run(tmp_path, "chunked", {"enable_prefix_caching": False,
                                        "enable_chunked_prefill": True,
                                        "max_num_batched_tokens": 32}, [GREEDY])
    assert result["passes"][0] == plain


def test_ngram_speculative_decoding_keeps_the_tokens(tmp_path, plain):
    speculative = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                   "prompt_lookup_min": 1}
    result = _run(tmp_path, "ngram", {"enable_prefix_caching": False,
                                      "max_num_batched_tokens": 512,
                                      "speculative_config": speculative}, [GREEDY])
    assert result["passes"][0] == plain


def test_seeded_sampling_repeats_and_the_seed_matters(tmp_path):
    def seeded(seed):
        return {"temperature": 1.0, "max_tokens": 24, "seed": seed}
    result = _run(tmp_path, "seeded", {"max_num_batched_tokens": 512},
                  [seeded(7), seeded(7), seeded(8)])
    first, again, other = result["passes"]
    assert first == again
    assert first != other
