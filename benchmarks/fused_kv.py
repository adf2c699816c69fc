"""The fused K/V cache (tpu-inference's layout) against the two separate caches, same data.

For each batch (bf16 unless noted, 32 q / 8 kv heads, d 128, shuffled blocks, vLLM layout
for the separate caches): ``ragged_paged_attention`` on separate caches with 16-token
blocks (the reference), ``ragged_paged_attention_fused`` on the fused cache holding the same
values with 16-, 128- and 256-token blocks; and the write of one step's new tokens,
``reshape_and_cache`` vs ``reshape_and_cache_fused``. Each time is the median of windows of
back-to-back jitted calls (:func:`xla_kernels.bench.budgeted_seconds`), all in one process.
The ratio column is fused / separate time (below 1: the fused layout is faster).

Writes ``fused_kv.json`` and ``fused_kv.md`` to ``--out``.

Example:
    $ python benchmarks/fused_kv.py --out benchmarks/results/latest/h100
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import budgeted_seconds, device_description
from xla_kernels.kernels.kv_cache import reshape_and_cache, reshape_and_cache_fused
from xla_kernels.kernels.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_fused,
)

BATCHES = [
    ("decode 64x2048", [1] * 64, [2048] * 64, False),
    ("decode 32x8192", [1] * 32, [8192] * 32, False),
    ("mixed 64 decode + 4x512", [1] * 64 + [512] * 4, [2048] * 64 + [4096] * 4, False),
    ("prefill 4x4096", [4096] * 4, [4096] * 4, False),
    ("decode 64x2048 fp8", [1] * 64, [2048] * 64, True),
    ("prefill 4x4096 fp8", [4096] * 4, [4096] * 4, True),
]
HQ, HKV, D = 32, 8, 128
FP8_SCALE = 0.0625


def problem(q_lens: list[int], kv_lens: list[int], fp8: bool, block: int,
            rng: np.random.Generator) -> dict[str, Any]:
    """The batch with `block`-token blocks: the same token values whatever the block size
    (the cache is made per token, then laid into shuffled blocks), one free sequence slot so
    that a decode batch takes the decode path."""
    n = len(q_lens)
    max_blocks = -(-max(kv_lens) // block)
    num_blocks = n * max_blocks
    tables = rng.permutation(num_blocks).reshape(n, max_blocks).astype(np.int32)
    keys = jax.random.normal(jax.random.PRNGKey(1), (num_blocks * block, HKV, D), jnp.float32)
    values = jax.random.normal(jax.random.PRNGKey(2), (num_blocks * block, HKV, D), jnp.float32)
    dtype = jnp.float8_e4m3fn if fp8 else jnp.bfloat16
    scale = FP8_SCALE if fp8 else 1.0
    k = (keys / scale).astype(dtype).reshape(num_blocks, block, HKV, D)
    v = (values / scale).astype(dtype).reshape(num_blocks, block, HKV, D)
    fused = jnp.stack([k, v], axis=3).reshape(num_blocks, block, 2 * HKV, D)
    cu = np.concatenate([[0], np.cumsum(q_lens), [sum(q_lens)]]).astype(np.int32)
    return {
        "queries": jax.random.normal(jax.random.PRNGKey(0), (sum(q_lens) + 1, HQ, D),
                                     jnp.bfloat16),
        "key_cache": k, "value_cache": v, "kv_cache": fused,
        "kv_lens": jnp.asarray([*kv_lens, 0], jnp.int32),
        "block_tables": jnp.asarray(np.concatenate([tables, tables[:1]])),
        "cu_q_lens": jnp.asarray(cu), "num_seqs": jnp.asarray([n], jnp.int32),
    }


META = ("kv_lens", "block_tables", "cu_q_lens", "num_seqs")


def measure(name: str, q_lens: list[int], kv_lens: list[int], fp8: bool,
            budget: float) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    kw = {"scale": D ** -0.5, **({"k_scale": FP8_SCALE, "v_scale": FP8_SCALE} if fp8 else {})}
    row: dict[str, Any] = {"name": name}
    x = problem(q_lens, kv_lens, fp8, 16, rng)
    row["separate_b16_ms"] = 1e3 * budgeted_seconds(jax.jit(
        lambda d: ragged_paged_attention(d["queries"], d["key_cache"], d["value_cache"],
                                         *(d[m] for m in META), **kw)), (x,), budget)
    for block in (16, 128, 256):
        if block != 16:
            x = problem(q_lens, kv_lens, fp8, block, rng)
        row[f"fused_b{block}_ms"] = 1e3 * budgeted_seconds(jax.jit(
            lambda d: ragged_paged_attention_fused(d["queries"], d["kv_cache"],
                                                   *(d[m] for m in META), **kw)), (x,), budget)
    # One step's writes: a token per sequence (decode) or the chunk's tokens.
    tokens = sum(q_lens)
    new = jax.random.normal(jax.random.PRNGKey(3), (tokens, HKV, D), jnp.bfloat16)
    capacity = x["kv_cache"].shape[0] * x["kv_cache"].shape[1]
    slots = jnp.asarray(rng.permutation(capacity)[:tokens], jnp.int32)
    scales = {k: v for k, v in kw.items() if k != "scale"}
    row["write_fused_ms"] = 1e3 * budgeted_seconds(jax.jit(
        lambda kv: reshape_and_cache_fused(new, new, kv, slots, **scales)),
        (x["kv_cache"],), budget)
    row["write_separate_ms"] = 1e3 * budgeted_seconds(jax.jit(
        lambda kc, vc: reshape_and_cache(new, new, kc, vc, slots, **scales)),
        (x["kv_cache"][:, :, 0::2], x["kv_cache"][:, :, 1::2]), budget)
    for block in (16, 128, 256):
        row[f"fused_b{block}_ratio"] = row[f"fused_b{block}_ms"] / row["separate_b16_ms"]
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict[str, Any]], device: dict[str, str]) -> str:
    lines = [f"# Fused K/V cache vs separate caches ({device.get('device_kind', '?')})", "",
             "Times in ms (median of windows of back-to-back jitted calls); ratio = fused / "
             "separate (16-token blocks).", "",
             "| batch | separate b16 | fused b16 | ratio | fused b128 | ratio | fused b256 | "
             "ratio | write separate | write fused |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['separate_b16_ms']:.4f} | {r['fused_b16_ms']:.4f} | "
            f"{r['fused_b16_ratio']:.3f} | {r['fused_b128_ms']:.4f} | "
            f"{r['fused_b128_ratio']:.3f} | {r['fused_b256_ms']:.4f} | "
            f"{r['fused_b256_ratio']:.3f} | {r['write_separate_ms']:.4f} | "
            f"{r['write_fused_ms']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per timing")
    args = parser.parse_args()
    device = device_description()
    rows = [measure(n, q, k, fp8, args.budget) for n, q, k, fp8 in BATCHES]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fused_kv.json").write_text(json.dumps({"device": device, "rows": rows},
                                                       indent=1))
    (args.out / "fused_kv.md").write_text(markdown(rows, device))
    print(markdown(rows, device))


if __name__ == "__main__":
    main()
