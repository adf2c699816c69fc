"""Greedy tokens from Hugging Face transformers in f32: what vLLM's tokens are checked against."""

from __future__ import annotations

from pathlib import Path


def greedy_tokens(model_dir: Path, prompts: list[list[int]], max_new_tokens: int
                  ) -> tuple[list[list[int]], list[float]]:
    """Each prompt's ``max_new_tokens`` greedy continuation (EOS ignored, as in the vLLM run),
    and per prompt the smallest gap between the top two logits along the way: a gap near
    rounding error means a different but correct engine may pick the other token."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
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
