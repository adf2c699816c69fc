"""serve-bench's decode breakdown (tiny preset, CPU): the attention-only replay times the
attention, not copies of the caches, so its share of the device step stays below 1 and
does not grow with cache blocks no request uses."""

from __future__ import annotations

import math
import re

import jax
import pytest

from xla_kernels.serving.attention import Attention
from xla_kernels.serving.bench import BenchOptions, attention_replay, decode_batch, serve_bench
from xla_kernels.serving.config import EngineConfig, preset


def attention_share(num_blocks: int) -> float:
    result = serve_bench(BenchOptions(preset="tiny", platform="cpu", requests=2, new_tokens=4,
                                      num_blocks=num_blocks, reference=False, progress=False))
    return result["breakdown"]["attention_share"]


def test_attention_share_is_below_one_and_flat_in_unused_cache_blocks():
    few, many = attention_share(12), attention_share(4000)
    # With the caches copied in every layer, 4000 blocks gave shares of 100 and more.
    assert 0 < few < 1 and 0 < many < 1, (few, many)
    assert many < 5 * few, (few, many)


@pytest.mark.parametrize("attention", ["xla-kernels", "plain-xla"])
def test_the_attention_replay_updates_the_caches_in_place(attention):
    """The compiled replay holds no copy of a cache (timing-free: plain-xla's share on the
    tiny preset is too close to 1 for a timing test on a shared CPU)."""
    config = preset("tiny")
    engine = EngineConfig(block_size=16, num_blocks=40, max_num_seqs=4, max_model_len=48,
                          token_budget=32)
    with jax.default_device(jax.devices("cpu")[0]):
        jitted, args = attention_replay(config, engine, Attention(attention),
                                        decode_batch(engine, 4, 40))
        hlo = jitted.lower(*args).compile().as_text()
    cache_elements = 40 * 16 * config.num_kv_heads * config.head_dim
    copies = [line for line in hlo.splitlines()
              if " copy(" in line and _elements(line) == cache_elements]
    assert copies == []


def _elements(instruction: str) -> int:
    """Elements of the array an HLO instruction ("%c = f32[40,16,2,64]{3,2,1,0} copy(%a)")
    makes; 0 for a tuple."""
    dims = re.match(r"[^=]*=\s*\w+\[([\d,]*)\]", instruction)
    return 0 if dims is None else math.prod(int(d) for d in dims.group(1).split(",") if d)
