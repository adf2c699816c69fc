"""Engine features a vLLM user turns on, through our backend, on the tiny Llama (token ids,
f32): each one must not change greedy tokens (prefix caching, hit on a second pass; chunked
prefill; n-gram speculative decoding), prompts near the model's 2048 positions give
transformers' tokens, seeded sampling repeats itself, and a LoRA adapter
gives the tokens of its merged weights; what the backend cannot run (LoRA on the JAX-native
model path, a speculative method tpu-inference has no proposer for, watermarks) is refused by
name when the engine is configured. Every engine runs in a process of its own (vLLM and
tpu-inference read their settings at import), the same on the CPU and the GPU (`bash
scripts/gpu_vllm.sh features OUT`). The features that need a tokenizer (structured outputs,
`llm.chat`, stop strings, logprobs, `n`) run on SmolLM2's engine in
tests/vllm/test_sampling_params.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow

# One vllm.LLM with the given engine arguments; each pass generates every prompt with the
# given SamplingParams (and the LoRA adapter at its "lora" path); prints the tokens of each
# pass and the prefix cache's hit rate.
_RUN = """
import json, sys
from pathlib import Path
import vllm
from vllm.lora.request import LoRARequest
from xla_kernels.vllm import models

spec = json.loads(sys.argv[1])
checkpoint = models.tiny_llama(Path(spec["dir"]) / "model")
engine = {"max_model_len": 512, **spec["engine"]}
llm = vllm.LLM(model=str(checkpoint.path), dtype="float32", max_num_seqs=4,
               gpu_memory_utilization=0.5, seed=0, skip_tokenizer_init=True, **engine)
passes = []
for params in spec["passes"]:
    adapter = params.pop("lora", None)
    lora = LoRARequest("adapter", 1, adapter) if adapter else None
    outputs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]],
                           vllm.SamplingParams(ignore_eos=True, **params), use_tqdm=False,
                           lora_request=lora)
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


def _run(tmp_path, name, engine, passes, env=None, prompts=None):
    spec = {"dir": str(tmp_path / name), "engine": engine, "passes": passes,
            "prompts": prompts or _prompts()}
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(spec)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, **(env or {})})
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


def test_long_prompts_give_transformers_tokens(tmp_path):
    """Prompts of 1,200-1,900 tokens (max_model_len 2048, the tiny Llama's positions): 19-30
    cache blocks per sequence, prefilled in chunks of 512 tokens beside the other requests'
    decode; the greedy tokens equal transformers' (f32, same weights)."""
    from xla_kernels.vllm import reference

    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 256, n).tolist() for n in (1200, 1500, 1900)]
    result = _run(tmp_path, "long", {"max_model_len": 2048, "max_num_batched_tokens": 512,
                                     "enable_chunked_prefill": True}, [GREEDY],
                  prompts=prompts)
    want, margins = reference.greedy_tokens(tmp_path / "long" / "model", prompts,
                                            GREEDY["max_tokens"])
    assert result["passes"][0] == want, f"reference's smallest top-2 logit gaps: {margins}"


def test_seeded_sampling_repeats_and_the_seed_matters(tmp_path):
    def seeded(seed):
        return {"temperature": 1.0, "max_tokens": 24, "seed": seed}
    result = _run(tmp_path, "seeded", {"max_num_batched_tokens": 512},
                  [seeded(7), seeded(7), seeded(8)])
    first, again, other = result["passes"]
    assert first == again
    assert first != other


LORA_TARGETS = {"q_proj": 256, "v_proj": 128}
"""The tiny Llama's projections the adapter adapts, and their output width."""


def _lora_adapter(checkpoint, directory, rank=8, alpha=16):
    """A PEFT LoRA adapter (seeded random A and B, rank ``rank``) for ``checkpoint``'s
    :data:`LORA_TARGETS`, in ``directory/adapter``; and ``directory/merged``, the checkpoint
    with each adapted weight W + alpha / rank x B A (what the adapter must compute)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(1)
    adapter, merged = directory / "adapter", directory / "merged"
    adapter.mkdir(parents=True)
    shutil.copytree(checkpoint.path, merged)
    weights = load_file(str(checkpoint.path / "model.safetensors"))
    lora = {}
    for layer in range(2):
        for name, out in LORA_TARGETS.items():
            a, b = torch.randn(rank, 256) * 0.1, torch.randn(out, rank) * 0.1
            key = f"model.layers.{layer}.self_attn.{name}"
            lora[f"base_model.model.{key}.lora_A.weight"] = a
            lora[f"base_model.model.{key}.lora_B.weight"] = b
            weights[f"{key}.weight"] = weights[f"{key}.weight"] + alpha / rank * b @ a
    save_file(lora, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": list(LORA_TARGETS), "base_model_name_or_path": str(checkpoint.path)}))
    save_file({k: v.contiguous() for k, v in weights.items()},
              str(merged / "model.safetensors"), metadata={"format": "pt"})
    return adapter, merged


def test_lora_adapter_gives_the_merged_weights_tokens(tmp_path):
    """``enable_lora`` on the PyTorch path (``MODEL_IMPL_TYPE=vllm``; the JAX-native path is
    refused, below): a request without the adapter gives the base model's greedy tokens,
    one with it those of the merged weights (both transformers f32)."""
    from xla_kernels.vllm import models, reference

    checkpoint = models.tiny_llama(tmp_path / "lora" / "model")
    adapter, merged = _lora_adapter(checkpoint, tmp_path / "lora")
    result = _run(tmp_path, "lora", {"enable_prefix_caching": False,
                                     "max_num_batched_tokens": 512, "enable_lora": True,
                                     "max_lora_rank": 8, "max_loras": 1},
                  [GREEDY, {**GREEDY, "lora": str(adapter)}], env={"MODEL_IMPL_TYPE": "vllm"})
    base, adapted = result["passes"]
    steps = GREEDY["max_tokens"]
    assert base == reference.greedy_tokens(checkpoint.path, _prompts(), steps)[0]
    assert adapted == reference.greedy_tokens(merged, _prompts(), steps)[0]
    assert adapted != base


def test_lora_on_the_jax_native_path_is_refused_by_name(tmp_path, monkeypatch, engine_config):
    """``MODEL_IMPL_TYPE`` unset (auto) runs a Llama on tpu-inference's JAX-native path,
    which has no LoRA layers (the engine would stop at start-up on an assertion)."""
    from xla_kernels.vllm import models

    monkeypatch.delenv("MODEL_IMPL_TYPE", raising=False)
    checkpoint = models.tiny_llama(tmp_path / "model")
    with pytest.raises(ValueError, match=r"LoRA \(enable_lora=True\) is not supported on "
                                         r"tpu-inference's JAX-native model path.*Fix: set "
                                         "MODEL_IMPL_TYPE=vllm"):
        engine_config(checkpoint.path, enable_lora=True, max_lora_rank=8)
    monkeypatch.setenv("MODEL_IMPL_TYPE", "vllm")
    assert engine_config(checkpoint.path, enable_lora=True, max_lora_rank=8).lora_config


def test_speculative_method_without_a_proposer_is_refused_by_name(tmp_path, engine_config):
    """tpu-inference's runner proposes with n-gram, EAGLE and DFlash only: a draft model
    would stop the engine at start-up (NotImplementedError)."""
    from xla_kernels.vllm import models

    checkpoint = models.tiny_llama(tmp_path / "model")
    draft = {"method": "draft_model", "model": str(checkpoint.path), "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=r"speculative_config method 'draft_model' is not "
                                         r"supported on this backend.*Fix: use method 'ngram'"):
        engine_config(checkpoint.path, speculative_config=draft)


def test_watermark_config_is_refused_by_name(tmp_path, engine_config):
    """Only vLLM's CUDA model runner applies watermarks; tpu-inference's would generate
    unwatermarked text without a word, so the engine's configuration is refused."""
    from xla_kernels.vllm import models

    checkpoint = models.tiny_llama(tmp_path / "model")
    with pytest.raises(ValueError, match=r"watermark_config \(and so SamplingParams "
                                         r"watermarking\) is not supported on this backend.*"
                                         "Fix: run without a watermark_config"):
        engine_config(checkpoint.path, watermark_config={"key": 7})
    assert engine_config(checkpoint.path).watermark_config is None
