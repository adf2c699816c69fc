"""Greedy tokens from Hugging Face transformers in f32: what vLLM's tokens are checked against."""

from __future__ import annotations

from pathlib import Path

FP8_KV_ATTENTION = "xla_kernels_fp8_kv"
"""transformers attention that reads keys and values as an fp8 (e4m3) cache holds them."""


def _register_fp8_kv_attention() -> None:
    """Register :data:`FP8_KV_ATTENTION`: transformers' SDPA attention (f32) on keys and
    values rounded as tpu-inference's models store them (``quantize_kv`` with scale 1: the
    f32 rows clipped to e4m3's range and cast to float8_e4m3fn), and queries and outputs
    rounded to bf16 (our ops take bf16 queries with an fp8 cache and give outputs in their
    dtype). Rounding is idempotent, so rounding the whole cache each step equals storing
    rounded rows."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def as_stored(x: torch.Tensor) -> torch.Tensor:
        limit = torch.finfo(torch.float8_e4m3fn).max
        return x.clamp(-limit, limit).to(torch.float8_e4m3fn).to(x.dtype)

    def attention(module, query, key, value, *args, **kwargs):
        query = query.to(torch.bfloat16).to(query.dtype)
        out, weights = sdpa_attention_forward(module, query, as_stored(key), as_stored(value),
                                              *args, **kwargs)
        return out.to(torch.bfloat16).to(out.dtype), weights

    AttentionInterface.register(FP8_KV_ATTENTION, attention)


def load(model_dir: Path, kv_cache_dtype: str = "auto"):
    """The f32 transformers model both functions below run (pass it to them to load it once)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {}
    if kv_cache_dtype == "fp8":
        _register_fp8_kv_attention()
        kwargs["attn_implementation"] = FP8_KV_ATTENTION
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs).eval()


def greedy_tokens(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, *,
                  kv_cache_dtype: str = "auto",
                  model=None) -> tuple[list[list[int]], list[float]]:
    """Each prompt's ``max_new_tokens`` greedy continuation (EOS ignored, as in the vLLM run),
    and per prompt the smallest gap between the top two logits along the way: a gap near
    rounding error means a different but correct engine may pick the other token. With
    ``kv_cache_dtype="fp8"`` attention reads an fp8-rounded cache
    (:func:`_register_fp8_kv_attention`). ``model``: one :func:`load` returned."""
    import torch

    model = model or load(model_dir, kv_cache_dtype)
    tokens, margins = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out, margin, past = [], float("inf"), None
            for _ in range(max_new_tokens):
                result = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = result.past_key_values
                logits = result.logits[0, -1]
                top = torch.topk(logits, 2).values
                margin = min(margin, float(top[0] - top[1]))
                token = int(torch.argmax(logits))
                out.append(token)
                ids = torch.tensor([[token]])
            tokens.append(out)
            margins.append(margin)
    return tokens, margins


def logit_deficits(model_dir: Path, prompts: list[list[int]], generated: list[list[int]], *,
                   kv_cache_dtype: str = "auto", model=None) -> list[list[float]]:
    """Teacher-forced scoring of another engine's greedy tokens: per prompt and step, how far
    the generated token's logit lies below the best logit, the reference reading the
    engine's own prefix (prompt + its tokens so far). 0 where the engine took the
    reference's argmax. Unlike comparing free-running sequences, one near-tie does not turn
    every later step into a mismatch: each step is judged on the same context, so a small
    deficit at a near-tie and 0 elsewhere is rounding, and a large one anywhere is an error.
    ``model``: one :func:`load` returned."""
    import torch

    model = model or load(model_dir, kv_cache_dtype)
    deficits = []
    with torch.no_grad():
        for prompt, tokens in zip(prompts, generated, strict=True):
            if not tokens:
                deficits.append([])
                continue
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0]
            steps = logits[len(prompt) - 1:-1].double()
            chosen = steps[torch.arange(len(tokens)), torch.tensor(tokens)]
            deficits.append([float(d) for d in steps.max(-1).values - chosen])
    return deficits
