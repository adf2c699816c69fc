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
  prompts with a causal mask), where its mask semantics match ours unambiguously;
* ``cudnn_dense``: cuDNN's dense flash attention through the public
  ``jax.nn.dot_product_attention(q, k, v, scale=..., is_causal=True,
  implementation="cudnn")``: bf16, layout [batch, seq, heads, head_dim] (BTNH), GQA by
  passing num_kv_heads K/V heads, causal mask (top-left, the same as bottom-right here).
  Only for fresh prefills of equal lengths (q_len = kv_len, no cached context): its K/V
  are the blocks our op reads, gathered once into dense arrays outside the timing, so both
  do the same work on the same values; other batches record ``n/a``. The dense upper bound:
  no block table, no paging.

Batches of one q_len give FA3 and both cuDNN peers their [batch, q_len, heads, d] queries
ready-made (the same values as our flat queries), so no peer times a copy of its input.
For fresh prefills every peer's output is checked against ours (``<peer>_max_diff``, the
largest absolute difference on the first call of a program).

``--matrix dense`` runs the fresh causal prefills of the issue "Prefill against the dense
upper bound" (ours, FA3, cuDNN paged and cuDNN dense, ``--chain`` 8 op calls per program,
each on its own queries): 4 x 4096, 1 x 16384, 4 x 4096 at head_dim 64, 8 x 2048 MHA and
4 x 4096 at head_dim 256 with 32 q / 8 kv heads (cuDNN takes head_dim up to 256 on sm_90),
and reports TFLOP/s and ours over cudnn_dense. It writes ``ragged_paged_attention_dense.*``.

Writes ``ragged_paged_attention.json`` and ``.md`` to ``--out``; the latest measured tables
are in ``benchmarks/results/latest/<card>/`` (quoted by docs/kernels/ragged_paged_attention.md;
design notes: docs/design/ragged_paged_attention.md).

Example:
    $ python benchmarks/ragged_paged_attention.py --out benchmarks/results/latest/h100 --quick
    $ python benchmarks/ragged_paged_attention.py --out /tmp/dense --matrix dense
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
DENSE_CHAIN = 8  # op calls per program in the dense matrix (the measurement)
MATRIX_IMPLS = {
    "default": ("ours", "ours_mma", "xla", "paged_attention", "fa3", "cudnn", "cudnn_dense"),
    "dense": ("ours", "fa3", "cudnn", "cudnn_dense"),
}
PEERS = ("paged_attention", "fa3", "cudnn", "cudnn_dense")


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


def dense_matrix(quick: bool) -> list[dict[str, Any]]:
    """The fresh causal prefills of the issue "Prefill against the dense upper bound"
    (bf16, q_len = kv_len); head_dim 256 with 32 q / 8 kv heads, the heads of the others.

    Example:
        >>> [(c["name"], c["num_q_heads"], c["num_kv_heads"]) for c in dense_matrix(True)]
        [('prefill 4x4096', 32, 8), ('prefill 1x16384', 32, 8)]
    """
    rows = [
        ("prefill 4x4096", [4096] * 4, 32, 8, 128),
        ("prefill 1x16384", [16384], 32, 8, 128),
        ("prefill 4x4096 d64", [4096] * 4, 32, 8, 64),
        ("prefill 8x2048 MHA", [2048] * 8, 32, 32, 128),
        ("prefill 4x4096 d256 32/8", [4096] * 4, 32, 8, 256),
    ]
    if quick:
        rows = rows[:2]
    return [dict(name=n, q_lens=q, kv_lens=list(q), num_q_heads=hq, num_kv_heads=hkv,
                 head_dim=d, fp8=False) for n, q, hq, hkv, d in rows]


def fresh_prefill(cfg: dict[str, Any]) -> bool:
    """Whether every sequence is a whole prompt of one length (no cached context): the
    batches a dense [batch, seq, heads, d] attention computes exactly.

    Example:
        >>> fresh_prefill({"q_lens": [8, 8], "kv_lens": [8, 8]})
        True
        >>> fresh_prefill({"q_lens": [8, 4], "kv_lens": [8, 4]})
        False
        >>> fresh_prefill({"q_lens": [4, 4], "kv_lens": [8, 8]})
        False
    """
    q_lens = cfg["q_lens"]
    return (not cfg.get("fp8") and q_lens == cfg["kv_lens"] and len(set(q_lens)) == 1
            and q_lens[0] > 1)


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


def make_data(cfg: dict[str, Any], rng: np.random.Generator, chain: int = 1) -> dict[str, Any]:
    """Device arrays for one configuration: shuffled blocks, one padding row. Our op also
    gets one free sequence slot (``*_slots``, as a serving engine has), so that a decode
    batch has no more rows than slots and takes the decode path.

    ``queries`` holds ``chain`` query arrays (one per call of a program; the first is the
    same for any ``chain``). Batches of one q_len also get them as [batch, q_len, heads, d]
    (``queries_bsnd``, the same values), and fresh prefills the K/V our op reads as dense
    [batch, seq, kv heads, d] arrays (``dense_key``, ``dense_value``)."""
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
    queries = [jax.random.normal(k1 if i == 0 else jax.random.fold_in(k1, i), (tokens, hq, d),
                                 jnp.bfloat16) for i in range(chain)]
    x: dict[str, Any] = {
        "queries": queries,
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
    if len(set(q_lens)) == 1:
        x["queries_bsnd"] = [q[: n * q_lens[0]].reshape(n, q_lens[0], hq, d) for q in queries]
    if fresh_prefill(cfg):
        seq = kv_lens[0]
        for name in ("key", "value"):
            x[f"dense_{name}"] = x[f"{name}_cache"][jnp.asarray(tables)].reshape(
                n, max_blocks * BLOCK, hkv, d)[:, :seq]
    return x


def fa3_impl(cfg: dict[str, Any]) -> Any:
    """FlashAttention-3's paged KV-cache call on a padded [batch, max_q_len] query, or None.
    The call is ``run(x, i)`` on the ``i``-th queries, as every impl's."""
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

    def run(x: dict[str, Any], i: int) -> Any:
        # One q_len: the queries as they are (the gather would be a copy of them).
        q = x["queries_bsnd"][i] if "queries_bsnd" in x else x["queries"][i][gather]
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

    def run(x: dict[str, Any], i: int) -> Any:
        table = x["block_tables"][:, None, :, None]
        return cudnn.paged_attention(
            x["queries_bsnd"][i], x["key_cache"], x["value_cache"],
            jnp.full((n,), q_len, jnp.int32), x["kv_lens"], table, table, scale=scale,
            mask_type=mask)

    return run


def cudnn_dense_impl(cfg: dict[str, Any]) -> Any:
    """cuDNN's dense causal flash attention (``jax.nn.dot_product_attention``, BTNH, GQA
    with num_kv_heads K/V heads) on the dense K/V of a fresh prefill, or None."""
    if not fresh_prefill(cfg):
        return None
    scale = cfg["head_dim"] ** -0.5

    def run(x: dict[str, Any], i: int) -> Any:
        return jax.nn.dot_product_attention(
            x["queries_bsnd"][i], x["dense_key"], x["dense_value"], scale=scale,
            is_causal=True, implementation="cudnn")

    return run


def program(impl: Any, chain: int) -> Any:
    """One jitted program of ``chain`` calls of ``impl(x, i)``, each on its own queries."""
    return jax.jit(lambda x: [impl(x, i) for i in range(chain)])


def measure(cfg: dict[str, Any], budget: float, chain: int = 1,
            impls: tuple[str, ...] = MATRIX_IMPLS["default"]) -> dict[str, Any]:
    """One configuration: each of ``impls`` that applies, timed in programs of ``chain``
    calls (``<impl>_ms`` per call, TFLOP/s, GB/s) or its ``<impl>_error``."""
    rng = np.random.default_rng(0)
    x = make_data(cfg, rng, chain)
    flops, floor = work(cfg)
    row: dict[str, Any] = {k: cfg[k] for k in ("name", "num_q_heads", "num_kv_heads",
                                               "head_dim")}
    row.update(tokens=sum(cfg["q_lens"]), seqs=len(cfg["q_lens"]), gflop=flops / 1e9,
               floor_mb=floor / 1e6, chain=chain)
    kw = attrs(cfg)
    names = ("queries", "key_cache", "value_cache", "kv_lens", "block_tables", "cu_q_lens",
             "num_seqs")
    n, q_len = len(cfg["q_lens"]), cfg["q_lens"][0]
    reference: list[Any] = []  # ours' first output as [batch, q_len, heads, d] (fresh prefills)

    def run(name: str, fn: Any) -> None:
        if name not in impls:
            return
        try:
            compiled = program(fn, chain)
            sec = budgeted_seconds(compiled, (x,), budget, calls=chain)
            if fresh_prefill(cfg) and name in ("ours", *PEERS):
                out = compiled(x)[0]
                if name == "ours":
                    reference.append(out[: n * q_len].reshape(x["queries_bsnd"][0].shape))
                elif reference:
                    row[f"{name}_max_diff"] = float(jnp.max(jnp.abs(
                        out.astype(jnp.float32) - reference[0].astype(jnp.float32))))
                del out
        except Exception as e:  # a failing impl is reported, not fatal
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
            return
        row[f"{name}_ms"] = sec * 1e3
        row[f"{name}_tflops"] = flops / sec / 1e12
        row[f"{name}_gbs"] = floor / sec / 1e9

    def ours(d: dict[str, Any], i: int) -> Any:
        return ragged_paged_attention(d["queries"][i], *(d[k] for k in OURS_ARGS[1:]), **kw)

    run("ours", ours)
    if any(q > 1 for q in cfg["q_lens"]):
        # The same op with the sm_90a wgmma kernel switched off (the mma.sync kernel; equal
        # to "ours" where the wgmma kernel does not apply).
        with environment(XLA_KERNELS_RAGGED_WGMMA="0"):
            run("ours_mma", ours)
    gathered = 2 * 32 * max(cfg["kv_lens"]) * cfg["num_kv_heads"] * cfg["head_dim"] * 2
    if gathered <= XLA_CAP:
        run("xla", lambda d, i: ragged_paged_attention_xla(
            d["queries"][i], *(d[k] for k in names[1:]), **kw))
    if all(q == 1 for q in cfg["q_lens"]):
        run("paged_attention", lambda d, i: paged_attention(
            d["queries"][i][:n], d["key_cache"], d["value_cache"], d["block_tables"],
            d["kv_lens"], **kw))
    for name, make in (("fa3", fa3_impl), ("cudnn", cudnn_impl),
                       ("cudnn_dense", cudnn_dense_impl)):
        if name not in impls:
            continue
        fn = make(cfg)
        if fn is None:
            row[f"{name}_error"] = ("n/a: only fresh prefills of one length (no cached "
                                    "context, not fp8)" if name == "cudnn_dense" else
                                    "not available for this batch or not importable")
        else:
            run(name, fn)
    return row


def cell(r: dict[str, Any], impl: str, gbs: bool = True) -> str:
    """One impl's table cell: ms (TFLOP/s[, GB/s]), ``n/a`` where it does not apply,
    ``failed`` where it raised, ``-`` where it was not run or is not available.

    Example:
        >>> cell({"ours_ms": 1.0, "ours_tflops": 500.0, "ours_gbs": 300.0}, "ours")
        '1.000 (500, 300)'
        >>> cell({"cudnn_dense_error": "n/a: ..."}, "cudnn_dense")
        'n/a'
    """
    ms = r.get(f"{impl}_ms")
    if ms is None:
        error = r.get(f"{impl}_error", "")
        return ("n/a" if error.startswith("n/a") else
                "-" if not error or error.startswith("not available") else "failed")
    rate = f"{r[f'{impl}_tflops']:.0f}" + (f", {r[f'{impl}_gbs']:.0f}" if gbs else "")
    return f"{ms:.3f} ({rate})"


def errors(result: dict[str, Any]) -> list[str]:
    """Markdown lines naming each failed impl and its error."""
    lines = [f"- {r['name']}, {k[:-6]}: {v[:200]}" for r in result["rows"]
             for k, v in r.items() if k.endswith("_error") and not v.startswith(("n/a",
                                                                                 "not avail"))]
    return ["", "Failed:", "", *lines] if lines else []


def markdown(result: dict[str, Any]) -> str:
    """The table; the last column is the fastest peer's time over ours (below 1: it is
    faster). paged_attention counts as a peer: it is what a decode-only batch could call.
    The dense matrix's table is TFLOP/s against cuDNN's dense attention instead."""
    if result.get("matrix") == "dense":
        return dense_markdown(result)
    impls = MATRIX_IMPLS["default"]
    lines = [f"# ragged_paged_attention on {result['device']['device']}", "",
             f"{result['date']}, jax {result['device']['jax']}. ms per call "
             "(TFLOP/s, GB/s of the floor).", "",
             "| batch | tokens | GFLOP | floor MB | " + " | ".join(impls)
             + " | best peer / ours |",
             "|---|---|---|---|" + "---|" * (len(impls) + 1)]
    for r in result["rows"]:
        cells = [cell(r, i) for i in impls]
        peers = [r[f"{i}_ms"] for i in PEERS if f"{i}_ms" in r]
        ratio = f"{min(peers) / r['ours_ms']:.2f}x" if peers and "ours_ms" in r else "-"
        lines.append(f"| {r['name']} | {r['tokens']} | {r['gflop']:.1f} | {r['floor_mb']:.0f} | "
                     + " | ".join(cells) + f" | {ratio} |")
    bf16 = {r["name"]: r for r in result["rows"]}
    speedups = [f"{r['name']}: {bf16[r['name'][:-4]]['ours_ms'] / r['ours_ms']:.2f}x"
                for r in result["rows"] if r["name"].endswith(" fp8") and "ours_ms" in r
                and "ours_ms" in bf16.get(r["name"][:-4], {})]
    if speedups:
        lines += ["", "fp8 caches, our bf16 time / our fp8 time: " + ", ".join(speedups) + "."]
    return "\n".join(lines + errors(result)) + "\n"


def dense_markdown(result: dict[str, Any]) -> str:
    """The dense matrix: ms per call (TFLOP/s) of ours and the peers, ours' TFLOP/s over
    cudnn_dense's (above 1: ours is faster) and cudnn_dense's largest difference to ours."""
    impls = MATRIX_IMPLS["dense"]
    lines = [f"# ragged_paged_attention against cuDNN dense on {result['device']['device']}",
             "", f"{result['date']}, jax {result['device']['jax']}. Fresh causal prefills, bf16, "
             f"programs of {result['chain']} chained calls (each on its own queries); ms per "
             "call (TFLOP/s, causal FLOPs). ours: block 16, permuted blocks. cudnn_dense: "
             "jax.nn.dot_product_attention(implementation=\"cudnn\", is_causal=True), "
             "dense [batch, seq, heads, d] K/V of the same values.", "",
             "| batch | q / kv heads | d | GFLOP | " + " | ".join(impls)
             + " | ours / cudnn_dense | cudnn_dense max diff |",
             "|---|---|---|---|" + "---|" * (len(impls) + 2)]
    for r in result["rows"]:
        ratio = (f"{r['ours_tflops'] / r['cudnn_dense_tflops']:.2f}x"
                 if "ours_tflops" in r and "cudnn_dense_tflops" in r else "-")
        diff = f"{r['cudnn_dense_max_diff']:.3g}" if "cudnn_dense_max_diff" in r else "-"
        lines.append(f"| {r['name']} | {r['num_q_heads']} / {r['num_kv_heads']} | "
                     f"{r['head_dim']} | {r['gflop']:.1f} | "
                     + " | ".join(cell(r, i, gbs=False) for i in impls)
                     + f" | {ratio} | {diff} |")
    return "\n".join(lines + errors(result)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    parser.add_argument("--quick", action="store_true", help="a few configurations")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per impl and config")
    parser.add_argument("--configs", default="",
                        help="comma-separated name prefixes: only those configurations")
    parser.add_argument("--matrix", choices=tuple(MATRIX_IMPLS), default="default",
                        help="default: every batch kind and impl; dense: the fresh causal "
                        "prefills against cuDNN's dense attention (ours, fa3, cudnn, "
                        "cudnn_dense), written to ragged_paged_attention_dense.*")
    parser.add_argument("--chain", type=int, default=None,
                        help=f"op calls per timed program (default: {DENSE_CHAIN} with "
                        "--matrix dense, else 1)")
    args = parser.parse_args()
    dense = args.matrix == "dense"
    chain = args.chain or (DENSE_CHAIN if dense else 1)
    result: dict[str, Any] = {"device": device_description(),
                              "date": datetime.datetime.now().isoformat(timespec="seconds"),
                              "matrix": args.matrix, "chain": chain, "rows": []}
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    for cfg in (dense_matrix if dense else matrix)(args.quick):
        if wanted and not any(cfg["name"].startswith(w) for w in wanted):
            continue
        row = measure(cfg, args.budget, chain, MATRIX_IMPLS[args.matrix])
        print(json.dumps(row))
        result["rows"].append(row)
    stem = "ragged_paged_attention" + ("_dense" if dense else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
