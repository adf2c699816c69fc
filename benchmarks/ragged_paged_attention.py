"""ragged_paged_attention (ours) vs plain XLA, with optional FlashAttention-3 and cuDNN hooks.

Batches (bf16, block 16, vLLM layout, 32 q / 8 kv heads, d 128 unless noted):

* ``prefill``: a few long prompts (q_len = kv_len);
* ``chunked``: prompt chunks appended to long contexts (q_len < kv_len);
* ``mixed``: decode tokens plus chunks, as a serving engine batches them;
* ``decode``: every q_len 1 (also timed with ``paged_attention``, the decode op);
* ``... fp8``: the same batches on ``float8_e4m3fn`` caches (vLLM's ``kv_cache_dtype="fp8"``,
  per-tensor ``k_scale`` / ``v_scale``); no peer takes bf16 queries on fp8 caches, so these
  rows compare with our bf16 rows.

Per configuration it reports the time per call (median of windows of back-to-back calls
under ``jax.jit``), FLOPs (4 · q heads · head_dim per attended (row, token) pair) and the
TFLOP/s reached, the bytes of the floor (each sequence's attended K/V range once per kv
head, plus Q and the output) and the GB/s it implies. Implementations:

* ``ours``: :func:`ragged_paged_attention`;
* ``ours_mma``: the same with ``XLA_KERNELS_RAGGED_WGMMA=0`` (the mma.sync kernel instead of
  the sm_90a wgmma prefill kernel), for batches with a q_len above 1;
* ``xla``: :func:`ragged_paged_attention_xla` (skipped when its per-row gathers would
  exceed ``XLA_CAP`` bytes);
* ``fa3``: ``flash_attn3_jax.flash_mha_with_kvcache`` (paged, ``page_table``), if the
  package imports. It takes a dense [batch, max_q_len, heads, d] query, so ragged batches
  are padded to the longest q_len (the padded rows are counted as its overhead, not as
  FLOPs); causal masking is bottom-right aligned to ``cache_seqlens``;
* ``cudnn``: ``jax._src.cudnn.fused_attention_stablehlo.paged_attention``, if it imports and
  cuDNN accepts the call; only for batches with one q_len (decode without a mask, whole
  prompts with a causal mask), where its mask semantics match ours unambiguously.

Writes ``ragged_paged_attention.json`` and ``.md`` to ``--out``; the latest measured tables
are in ``benchmarks/results/latest/<card>/`` (quoted by docs/kernels/ragged_paged_attention.md;
design notes: docs/design/ragged_paged_attention.md).

Example:
    $ python benchmarks/ragged_paged_attention.py --out benchmarks/results/latest/h100 --quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import traceback
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import budgeted_seconds, device_description, environment
from xla_kernels.kernels.paged_attention import paged_attention
from xla_kernels.kernels.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_xla,
)

BLOCK = 16
XLA_CAP = 8e9  # bytes of K+V the XLA fallback gathers at once (row_batch rows)


def matrix(quick: bool) -> list[dict[str, Any]]:
    """The configurations: name, q_lens, kv_lens, q heads, kv heads, head_dim."""
    rows = [
        ("prefill 4x4096", [4096] * 4, [4096] * 4, 32, 8, 128),
        ("prefill 1x16384", [16384], [16384], 32, 8, 128),
        ("chunked 8x512 of 8192", [512] * 8, [8192] * 8, 32, 8, 128),
        ("mixed 64 decode + 4x512", [1] * 64 + [512] * 4, [2048] * 64 + [4096] * 4, 32, 8, 128),
        ("decode 128x2048", [1] * 128, [2048] * 128, 32, 8, 128),
        ("decode 32x8192", [1] * 32, [8192] * 32, 32, 8, 128),
        ("prefill 4x4096 d64", [4096] * 4, [4096] * 4, 32, 8, 64),
        ("prefill 4x4096 d256", [4096] * 4, [4096] * 4, 16, 4, 256),
        ("prefill 4x4096 MQA", [4096] * 4, [4096] * 4, 32, 1, 128),
    ]
    fp8 = [(f"{n} fp8", q, k, hq, hkv, d) for n, q, k, hq, hkv, d in rows
           if n in ("prefill 4x4096", "chunked 8x512 of 8192", "mixed 64 decode + 4x512",
                    "prefill 4x4096 d64", "prefill 4x4096 d256")]
    if quick:
        rows = rows[:1] + rows[2:5]
    return [dict(name=n, q_lens=q, kv_lens=k, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                 fp8=n.endswith(" fp8"))
            for n, q, k, hq, hkv, d in rows + ([] if quick else fp8)]


def work(cfg: dict[str, Any], elem: int = 2) -> tuple[float, float]:
    """(FLOPs, floor bytes) of a configuration (causal, no window); K/V take one byte per
    element on fp8 caches."""
    pairs = sum(q * (k - q) + q * (q + 1) // 2
                for q, k in zip(cfg["q_lens"], cfg["kv_lens"], strict=True))
    flops = 4.0 * cfg["num_q_heads"] * cfg["head_dim"] * pairs
    kv_elem = 1 if cfg.get("fp8") else elem
    kv = 2 * sum(cfg["kv_lens"]) * cfg["num_kv_heads"] * cfg["head_dim"] * kv_elem
    qo = 2 * sum(cfg["q_lens"]) * cfg["num_q_heads"] * cfg["head_dim"] * elem
    return flops, float(kv + qo)


# Our op's arguments in make_data's dict: the sequence metadata with the free slot.
OURS_ARGS = ("queries", "key_cache", "value_cache", "kv_lens_slots", "block_tables_slots",
             "cu_q_lens_slots", "num_seqs")
# fp8 caches: stored = value / scale (values of about unit size fill e4m3's range well).
FP8_SCALES = {"k_scale": 0.0625, "v_scale": 0.0625}


def attrs(cfg: dict[str, Any]) -> dict[str, Any]:
    """Our op's attributes for a configuration: the scale, and the fp8 caches' scales.

    Example:
        >>> attrs({"head_dim": 64, "fp8": True})
        {'scale': 0.125, 'k_scale': 0.0625, 'v_scale': 0.0625}
    """
    return {"scale": cfg["head_dim"] ** -0.5, **(FP8_SCALES if cfg.get("fp8") else {})}


def make_data(cfg: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Device arrays for one configuration: shuffled blocks, one padding row. Our op also
    gets one free sequence slot (``*_slots``, as a serving engine has), so that a decode
    batch has no more rows than slots and takes the decode path."""
    q_lens, kv_lens = cfg["q_lens"], cfg["kv_lens"]
    n, hq, hkv, d = len(q_lens), cfg["num_q_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    max_blocks = -(-max(kv_lens) // BLOCK)
    num_blocks = n * max_blocks
    tables = rng.permutation(num_blocks).reshape(n, max_blocks).astype(np.int32)
    tokens = sum(q_lens) + 1
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    shape = (num_blocks, BLOCK, hkv, d)
    if cfg.get("fp8"):
        def cache(k: Any, scale: float) -> Any:
            return (jax.random.normal(k, shape) / scale).astype(jnp.float8_e4m3fn)
        key_cache = cache(k2, FP8_SCALES["k_scale"])
        value_cache = cache(k3, FP8_SCALES["v_scale"])
    else:
        key_cache = jax.random.normal(k2, shape, jnp.bfloat16)
        value_cache = jax.random.normal(k3, shape, jnp.bfloat16)
    return {
        "queries": jax.random.normal(k1, (tokens, hq, d), jnp.bfloat16),
        "key_cache": key_cache,
        "value_cache": value_cache,
        "kv_lens": jnp.asarray(kv_lens, jnp.int32),
        "block_tables": jnp.asarray(tables),
        "cu_q_lens": jnp.asarray(cu),
        "num_seqs": jnp.asarray([n], jnp.int32),
        "kv_lens_slots": jnp.asarray([*kv_lens, 0], jnp.int32),
        "block_tables_slots": jnp.asarray(np.concatenate([tables, tables[:1]])),
        "cu_q_lens_slots": jnp.asarray(np.concatenate([cu, cu[-1:]])),
    }


def fa3_impl(cfg: dict[str, Any]) -> Any:
    """FlashAttention-3's paged KV-cache call on a padded [batch, max_q_len] query, or None."""
    if cfg.get("fp8"):
        return None
    try:
        from flash_attn3_jax import flash_mha_with_kvcache
    except ImportError:
        return None
    q_lens = cfg["q_lens"]
    max_q = max(q_lens)
    starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
    # Padded row (seq, j) holds token j - (max_q - q_len) of the sequence: its q_len tokens
    # are the last rows (bottom-right causal alignment); the rows above repeat a real token.
    # The output stays padded (this times the attention only).
    gather = np.minimum(starts[:, None] + np.arange(max_q)[None, :] - (max_q - np.asarray(
        q_lens))[:, None], (starts + np.asarray(q_lens) - 1)[:, None])
    gather = jnp.asarray(np.maximum(gather, starts[:, None]).astype(np.int32))
    scale = cfg["head_dim"] ** -0.5

    def run(x: dict[str, Any]) -> Any:
        q = x["queries"][gather]                              # [n, max_q, hq, d]
        return flash_mha_with_kvcache(q, x["key_cache"], x["value_cache"],
                                      cache_seqlens=x["kv_lens"],
                                      page_table=x["block_tables"], softmax_scale=scale,
                                      is_causal=True)

    return run


def cudnn_impl(cfg: dict[str, Any]) -> Any:
    """cuDNN paged attention for single-q_len batches (decode or whole prompts), or None."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn
    except ImportError:
        return None
    q_lens, kv_lens = cfg["q_lens"], cfg["kv_lens"]
    if cfg.get("fp8") or len(set(q_lens)) != 1 or not (q_lens[0] == 1 or q_lens == kv_lens):
        return None
    n, q_len = len(q_lens), q_lens[0]
    mask = cudnn.MaskType.NO_MASK if q_len == 1 else cudnn.MaskType.CAUSAL
    scale = cfg["head_dim"] ** -0.5

    def run(x: dict[str, Any]) -> Any:
        q = x["queries"][: n * q_len].reshape(n, q_len, cfg["num_q_heads"], cfg["head_dim"])
        table = x["block_tables"][:, None, :, None]
        return cudnn.paged_attention(
            q, x["key_cache"], x["value_cache"], jnp.full((n,), q_len, jnp.int32),
            x["kv_lens"], table, table, scale=scale, mask_type=mask)

    return run


def measure(cfg: dict[str, Any], budget: float) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = make_data(cfg, rng)
    flops, floor = work(cfg)
    row: dict[str, Any] = {k: cfg[k] for k in ("name", "num_q_heads", "num_kv_heads",
                                               "head_dim")}
    row.update(tokens=sum(cfg["q_lens"]), seqs=len(cfg["q_lens"]), gflop=flops / 1e9,
               floor_mb=floor / 1e6)
    kw = attrs(cfg)
    names = ("queries", "key_cache", "value_cache", "kv_lens", "block_tables", "cu_q_lens",
             "num_seqs")

    def run(name: str, fn: Any) -> None:
        try:
            sec = budgeted_seconds(jax.jit(fn), (x,), budget)
        except Exception as e:  # a failing impl is reported, not fatal
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
            return
        row[f"{name}_ms"] = sec * 1e3
        row[f"{name}_tflops"] = flops / sec / 1e12
        row[f"{name}_gbs"] = floor / sec / 1e9

    run("ours", lambda d: ragged_paged_attention(*(d[k] for k in OURS_ARGS), **kw))
    if any(q > 1 for q in cfg["q_lens"]):
        # The same op with the sm_90a wgmma kernel switched off (the mma.sync kernel; equal
        # to "ours" where the wgmma kernel does not apply).
        with environment(XLA_KERNELS_RAGGED_WGMMA="0"):
            run("ours_mma", lambda d: ragged_paged_attention(*(d[k] for k in OURS_ARGS), **kw))
    gathered = 2 * 32 * max(cfg["kv_lens"]) * cfg["num_kv_heads"] * cfg["head_dim"] * 2
    if gathered <= XLA_CAP:
        run("xla", lambda d: ragged_paged_attention_xla(*(d[k] for k in names), **kw))
    if all(q == 1 for q in cfg["q_lens"]):
        n = len(cfg["q_lens"])
        run("paged_attention", lambda d: paged_attention(
            d["queries"][:n], d["key_cache"], d["value_cache"], d["block_tables"],
            d["kv_lens"], **kw))
    for name, make in (("fa3", fa3_impl), ("cudnn", cudnn_impl)):
        fn = make(cfg)
        if fn is None:
            row[f"{name}_error"] = "not available for this batch or not importable"
        else:
            run(name, fn)
    return row


def markdown(result: dict[str, Any]) -> str:
    """The table; the last column is the fastest peer's time over ours (below 1: it is
    faster). paged_attention counts as a peer: it is what a decode-only batch could call."""
    impls = ("ours", "ours_mma", "xla", "paged_attention", "fa3", "cudnn")
    lines = [f"# ragged_paged_attention on {result['device']['device']}", "",
             f"{result['date']}, jax {result['device']['jax']}. ms per call "
             "(TFLOP/s, GB/s of the floor).", "",
             "| batch | tokens | GFLOP | floor MB | " + " | ".join(impls)
             + " | best peer / ours |",
             "|---|---|---|---|" + "---|" * (len(impls) + 1)]
    for r in result["rows"]:
        cells = []
        for i in impls:
            ms = r.get(f"{i}_ms")
            cells.append("-" if ms is None else
                         f"{ms:.3f} ({r[f'{i}_tflops']:.0f}, {r[f'{i}_gbs']:.0f})")
        peers = [r[f"{i}_ms"] for i in ("paged_attention", "fa3", "cudnn") if f"{i}_ms" in r]
        ratio = f"{min(peers) / r['ours_ms']:.2f}x" if peers and "ours_ms" in r else "-"
        lines.append(f"| {r['name']} | {r['tokens']} | {r['gflop']:.1f} | {r['floor_mb']:.0f} | "
                     + " | ".join(cells) + f" | {ratio} |")
    bf16 = {r["name"]: r for r in result["rows"]}
    speedups = [f"{r['name']}: {bf16[r['name'][:-4]]['ours_ms'] / r['ours_ms']:.2f}x"
                for r in result["rows"] if r["name"].endswith(" fp8") and "ours_ms" in r
                and "ours_ms" in bf16.get(r["name"][:-4], {})]
    if speedups:
        lines += ["", "fp8 caches, our bf16 time / our fp8 time: " + ", ".join(speedups) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    parser.add_argument("--quick", action="store_true", help="a few configurations")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per impl and config")
    parser.add_argument("--configs", default="",
                        help="comma-separated name prefixes: only those configurations")
    args = parser.parse_args()
    result: dict[str, Any] = {"device": device_description(),
                              "date": datetime.datetime.now().isoformat(timespec="seconds"),
                              "rows": []}
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    for cfg in matrix(args.quick):
        if wanted and not any(cfg["name"].startswith(w) for w in wanted):
            continue
        row = measure(cfg, args.budget)
        print(json.dumps(row))
        result["rows"].append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ragged_paged_attention.json").write_text(json.dumps(result, indent=1))
    (args.out / "ragged_paged_attention.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
