"""paged_attention (ours) vs plain XLA (gather + einsum) vs JAX's Pallas GPU kernel, one run.

For each configuration (num_seqs x context x heads, bf16, block 16) it times, under
``jax.jit``: our op on the vLLM-layout cache, our op on the Pallas-layout cache,
:func:`paged_attention_xla`, and ``jax.experimental.pallas.ops.gpu.paged_attention`` (given
pre-scaled queries, since it applies no softmax scale). It also measures the device copy
bandwidth (a large jitted elementwise copy, bytes read + written) and reports, per config:
times, KV bytes read, achieved GB/s, fraction of copy bandwidth and speedups.

Timing: each jitted program runs a chain of ``CHAIN`` calls, each with its own query and
block table (so XLA can merge no work between calls); the tables rotate over disjoint sets
of blocks of a cache sized past the 50 MB L2, so small configs are not served from L2. Many
programs are queued back to back and the median per-call time of several windows is kept.
Sequences all have the full context length.

Writes ``paged_attention.json``, ``paged_attention.md`` and (if matplotlib is there)
``paged_attention.png`` to ``--out``.

Example:
    $ python benchmarks/paged_attention.py --out benchmarks/results/h100 --quick
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import math
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import budgeted_seconds, device_description
from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_xla

CHAIN = 16               # op calls per timed program
L2_BYTES = 50e6          # H100 L2; input sets rotate over at least 3x this
KV_CAP = 16e9            # skip configs whose KV cache (one copy) is larger
XLA_CAP = 24e9           # skip the XLA impl when its gathered intermediates are larger
BLOCK = 16
IMPLS = ("ours", "ours_pallas_layout", "xla", "pallas")


def matrix(quick: bool, smoke: bool = False) -> list[dict[str, Any]]:
    """The configurations: (num_seqs, context, q heads, kv heads, head_dim)."""
    if smoke:
        rows = [(2, 256, 8, 2, 128), (1, 512, 4, 4, 64)]
    elif quick:
        rows = [(32, 2048, 32, 8, 128), (1, 32768, 32, 8, 128), (8, 8192, 32, 32, 128),
                (128, 512, 32, 8, 128), (32, 2048, 32, 8, 64), (32, 2048, 32, 8, 256)]
    else:
        rows = [(s, c, hq, hkv, 128) for hq, hkv in ((32, 8), (32, 32)) for s in (1, 8, 32, 128)
                for c in (512, 2048, 8192, 32768)]
        rows += [(32, 2048, 32, 8, 64), (32, 2048, 32, 8, 256)]
    return [dict(num_seqs=s, context=c, num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
            for s, c, hq, hkv, d in rows]


def kv_bytes(cfg: dict[str, Any]) -> int:
    """Bytes of K and V the op must read (bf16)."""
    return 2 * 2 * cfg["num_seqs"] * cfg["context"] * cfg["num_kv_heads"] * cfg["head_dim"]


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device copy bandwidth (read + write) of a jitted elementwise op over ``nbytes``."""
    x = jnp.arange(nbytes // 4, dtype=jnp.uint32)
    seconds = budgeted_seconds(jax.jit(lambda v: v + jnp.uint32(1)), (x,), budget=0.5,
                               warmup=2)
    del x
    return 2 * nbytes / seconds / 1e9


def pallas_kernel() -> Any:
    try:
        from jax.experimental.pallas.ops.gpu import paged_attention as module

        return module.paged_attention
    except Exception:
        return None


def pallas_kwargs(fn: Any, pages_per_seq: int) -> dict[str, Any]:
    """Pallas' constraints: pages_per_seq % k_splits == 0, and its compute block divides
    the partition."""
    k_splits = math.gcd(16, pages_per_seq)
    per_part = pages_per_seq // k_splits
    kw = {"k_splits": k_splits, "pages_per_compute_block": math.gcd(8, per_part),
          "block_h": 16}
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


def make_data(cfg: dict[str, Any], sets: int) -> dict[str, Any]:
    """Caches (vLLM layout) and `sets` disjoint (query, block table) sets, on the device."""
    s, ctx, hq, hkv, d = (cfg[k] for k in ("num_seqs", "context", "num_q_heads",
                                            "num_kv_heads", "head_dim"))
    pages = ctx // BLOCK
    nblocks = sets * s * pages
    key = jax.random.key(cfg["context"] + 7 * cfg["num_seqs"])
    k1, k2, k3 = jax.random.split(key, 3)
    # Random data (never zeros): a base of <= 128 MB tiled to the cache size.
    base_blocks = max(1, min(nblocks, int(128e6 // (BLOCK * hkv * d * 2))))
    reps = -(-nblocks // base_blocks)

    @jax.jit
    def cache(k: Any) -> Any:
        base = jax.random.normal(k, (base_blocks, BLOCK, hkv, d), jnp.bfloat16)
        return jnp.tile(base, (reps, 1, 1, 1))[:nblocks]

    rng = np.random.default_rng(0)
    perm = rng.permutation(nblocks).reshape(sets, s, pages)
    # One table per call: call i reads set i % sets, in its own block order (so XLA cannot
    # merge the gathers of different calls either).
    tables = [perm[i % sets] if i < sets else perm[i % sets][:, rng.permutation(pages)]
              for i in range(CHAIN)]
    # One query per call of a chain: identical calls would be merged by XLA (CSE).
    qs = jax.random.normal(k3, (CHAIN, s, hq, d), jnp.bfloat16)
    return {
        "k": cache(k1), "v": cache(k2),
        "qs": [qs[i] for i in range(CHAIN)],
        "bts": [jnp.asarray(tables[i], jnp.int32) for i in range(CHAIN)],
        "lens": jnp.full((s,), ctx, jnp.int32),
    }


def chained(impl: Any) -> Any:
    def run(qs: list, k: Any, v: Any, bts: list, lens: Any) -> list:
        return [impl(qs[i], k, v, bts[i], lens) for i in range(CHAIN)]

    return jax.jit(run)


def events_ms(data: dict[str, Any], k: Any, v: Any, scale: float, layout: str,
              budget: float) -> float | None:
    """Our kernel's device time per call from CUDA events (torch), calling the handler
    eagerly on torch's stream: no XLA, no dispatch in the number. None without torch."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    from xla_kernels.kernels.paged_attention import workspace_size
    from xla_kernels.runtime.eager import Buffer, call_handler
    from xla_kernels.runtime.library import load_kernel

    fn = load_kernel(paged_attention, "cuda").function
    tq = [torch.from_dlpack(q) for q in data["qs"]]
    tb = [torch.from_dlpack(b) for b in data["bts"]]
    tk, tv, tl = torch.from_dlpack(k), torch.from_dlpack(v), torch.from_dlpack(data["lens"])
    s, hq, d = tq[0].shape
    block = tk.shape[1] if layout == "vllm" else tk.shape[2]
    out = torch.empty_like(tq[0])
    ws = torch.empty(workspace_size(s, hq, d, tb[0].shape[1] * block), dtype=torch.float32,
                     device=out.device)
    stream = torch.cuda.current_stream()
    attrs = {"scale": np.float32(scale), "softcap": np.float32(0), "sliding_window": np.int64(0),
             "layout": layout, "k_scale": np.float32(1), "v_scale": np.float32(1)}
    fixed = [Buffer.from_array(t) for t in (tk, tv)]

    def call(i: int) -> None:
        args = [Buffer.from_array(tq[i % len(tq)]), *fixed,
                Buffer.from_array(tb[i % len(tb)]), Buffer.from_array(tl)]
        call_handler(fn, args=args, rets=[Buffer.from_array(out), Buffer.from_array(ws)],
                     attrs=attrs, platform="cuda", stream=stream.cuda_stream,
                     op_name=paged_attention.name)

    for i in range(3):
        call(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call(0)
    end.record()
    end.synchronize()
    n = max(8, min(400, int(budget / max(start.elapsed_time(end) * 1e-3, 1e-6))))
    samples = []
    for _ in range(3):
        start.record()
        for i in range(n):
            call(i)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / n)
    return statistics.median(samples)


def measure(cfg: dict[str, Any], budget: float, pallas: Any) -> dict[str, Any]:
    nbytes = kv_bytes(cfg)
    sets = max(1, min(CHAIN, math.ceil(3 * L2_BYTES / nbytes), int(KV_CAP // nbytes)))
    row: dict[str, Any] = {**cfg, "kv_bytes": nbytes, "sets": sets}
    data = make_data(cfg, sets)
    scale = cfg["head_dim"] ** -0.5
    args = (data["qs"], data["k"], data["v"], data["bts"], data["lens"])
    outs: dict[str, np.ndarray] = {}

    def run(name: str, impl: Any, call_args: tuple) -> None:
        try:
            fn = chained(impl)
            row[f"{name}_ms"] = budgeted_seconds(fn, call_args, budget, calls=CHAIN,
                                                   warmup=2) * 1e3
            outs[name] = np.asarray(jax.jit(impl)(*(a[0] if isinstance(a, list) else a
                                                    for a in call_args)), np.float32)
        except Exception as e:
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            traceback.print_exc(limit=2)

    run("ours", lambda q, k, v, bt, ln: paged_attention(q, k, v, bt, ln, scale=scale), args)
    try:
        row["ours_events_ms"] = events_ms(data, data["k"], data["v"], scale, "vllm", budget)
    except Exception as e:
        row["ours_events_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    xla_bytes = 3 * nbytes + 4 * cfg["num_seqs"] * cfg["num_q_heads"] * cfg["context"]
    if xla_bytes <= XLA_CAP:
        run("xla", lambda q, k, v, bt, ln: paged_attention_xla(q, k, v, bt, ln, scale=scale),
            args)
    else:
        row["xla_error"] = "skipped: gathered intermediates would not fit"
    # Pallas layout [kv_heads, num_blocks, block_size, head_dim], built in place of vLLM's.
    kp = jnp.transpose(data.pop("k"), (2, 0, 1, 3))
    vp = jnp.transpose(data.pop("v"), (2, 0, 1, 3))
    pargs = (data["qs"], kp, vp, data["bts"], data["lens"])
    run("ours_pallas_layout", lambda q, k, v, bt, ln: paged_attention(
        q, k, v, bt, ln, scale=scale, layout="pallas"), pargs)
    if pallas is None:
        row["pallas_error"] = "jax.experimental.pallas.ops.gpu.paged_attention not importable"
    else:
        kw = pallas_kwargs(pallas, cfg["context"] // BLOCK)
        row["pallas_kwargs"] = kw
        scaled = ([(q * scale).astype(q.dtype) for q in data["qs"]], kp, vp, data["bts"],
                  data["lens"])
        run("pallas", lambda q, k, v, bt, ln: pallas(q, k, v, bt, ln, **kw), scaled)
    # Cross-check the implementations on the first input set.
    if "ours" in outs:
        ref = outs["ours"]
        for name, o in outs.items():
            if name != "ours":
                row[f"{name}_rel_diff"] = float(np.linalg.norm(o - ref) /
                                                max(np.linalg.norm(ref), 1e-30))
    for name in IMPLS:
        if f"{name}_ms" in row:
            row[f"{name}_gbs"] = nbytes / (row[f"{name}_ms"] * 1e-3) / 1e9
    if "ours_ms" in row:
        for other in ("xla", "pallas"):
            if f"{other}_ms" in row:
                row[f"speedup_vs_{other}"] = row[f"{other}_ms"] / row["ours_ms"]
    del kp, vp, data, pargs, args
    return row


def fmt(x: Any, spec: str = ".3f", suffix: str = "") -> str:
    return "—" if x is None else format(x, spec) + suffix


def markdown(result: dict[str, Any]) -> str:
    copy = result["copy_gbs"]
    lines = [f"# paged_attention — {result['device']}, jax {result['jax']}, {result['date']}",
             "", f"Device copy bandwidth (read + write): {copy:.0f} GB/s. bf16, block 16, "
             "all sequences at full context; times are per call (median), under jax.jit in "
             "chains of distinct calls. 'ours events' is our kernel alone: CUDA events around "
             "eager handler calls on torch's stream (calls shorter than the eager call's host "
             "overhead, ~50 us, measure the host instead).", "",
             "| seqs | context | q/kv heads | d | KV MB | ours ms | ours GB/s | % copy bw | "
             "ours events ms | ours (pallas layout) ms | XLA ms | Pallas ms | vs Pallas | vs XLA |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "skipped" in r:
            continue
        frac = r.get("ours_gbs", 0) / copy * 100 if "ours_gbs" in r else None
        lines.append(
            f"| {r['num_seqs']} | {r['context']} | {r['num_q_heads']}/{r['num_kv_heads']} | "
            f"{r['head_dim']} | {r['kv_bytes'] / 1e6:.1f} | {fmt(r.get('ours_ms'), '.4f')} | "
            f"{fmt(r.get('ours_gbs'), '.0f')} | {fmt(frac, '.0f')} | "
            f"{fmt(r.get('ours_events_ms'), '.4f')} | "
            f"{fmt(r.get('ours_pallas_layout_ms'), '.4f')} | {fmt(r.get('xla_ms'), '.4f')} | "
            f"{fmt(r.get('pallas_ms'), '.4f')} | {fmt(r.get('speedup_vs_pallas'), '.2f', 'x')} | "
            f"{fmt(r.get('speedup_vs_xla'), '.2f', 'x')} |")
    skipped = [r for r in result["rows"] if "skipped" in r]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(
            f"{r['num_seqs']}x{r['context']} {r['num_q_heads']}/{r['num_kv_heads']} "
            f"({r['skipped']})" for r in skipped)]
    errors = [(r, k, v) for r in result["rows"] for k, v in r.items() if k.endswith("_error")]
    if errors:
        lines += ["", "Errors / skipped impls:"] + [
            f"- {r['num_seqs']}x{r['context']} {r['num_q_heads']}/{r['num_kv_heads']} "
            f"d{r['head_dim']}: {k[:-6]}: {v}" for r, k, v in errors]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in result["rows"] if "skipped" not in r and r["head_dim"] == 128]
    heads = sorted({(r["num_q_heads"], r["num_kv_heads"]) for r in rows}, reverse=True)
    seqs = sorted({r["num_seqs"] for r in rows})
    if not heads or not seqs:
        return False
    fig, axes = plt.subplots(len(heads), len(seqs), figsize=(4 * len(seqs), 3.2 * len(heads)),
                             squeeze=False)
    for i, h in enumerate(heads):
        for j, s in enumerate(seqs):
            ax = axes[i][j]
            sel = sorted((r for r in rows if (r["num_q_heads"], r["num_kv_heads"]) == h
                          and r["num_seqs"] == s), key=lambda r: r["context"])
            for name in IMPLS:
                pts = [(r["context"], r[f"{name}_ms"]) for r in sel if f"{name}_ms" in r]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{s} seqs, {h[0]}/{h[1]} heads", fontsize=9)
            ax.set_xlabel("context")
            ax.set_ylabel("ms per call")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    parser.add_argument("--quick", action="store_true", help="headline config and a few more")
    parser.add_argument("--smoke", action="store_true",
                        help="two tiny configs: checks the script itself on any backend")
    parser.add_argument("--profile", action="store_true",
                        help="only run the headline config a few times (for ncu / nsys)")
    parser.add_argument("--budget", type=float, default=0.15,
                        help="seconds of timed runs per implementation and config")
    args = parser.parse_args()
    if args.profile:
        cfg = matrix(quick=True)[0]
        data = make_data(cfg, 1)
        f = jax.jit(lambda q, k, v, bt, ln: paged_attention(q, k, v, bt, ln, scale=0.088))
        for i in range(5):
            jax.block_until_ready(f(data["qs"][i], data["k"], data["v"], data["bts"][0],
                                    data["lens"]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    copy_gbs = copy_bandwidth_gbs(1 << 24 if args.smoke else 1 << 30)
    print(f"copy bandwidth (jax): {copy_gbs:.0f} GB/s", flush=True)
    try:
        from xla_kernels.bench import copy_bandwidth_gbs as torch_copy

        torch_gbs = torch_copy() if not args.smoke else None
    except Exception:
        torch_gbs = None
    pallas = pallas_kernel()
    rows = []
    for cfg in matrix(args.quick, args.smoke):
        if kv_bytes(cfg) > KV_CAP:
            rows.append({**cfg, "kv_bytes": kv_bytes(cfg), "skipped": "KV cache > 16 GB"})
            continue
        row = measure(cfg, args.budget, pallas)
        row["ours_fraction_of_copy"] = row.get("ours_gbs", 0.0) / copy_gbs
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                          for k, v in row.items()}), flush=True)
    result = {**device_description(), "date": datetime.date.today().isoformat(),
              "copy_gbs": copy_gbs, "copy_gbs_torch_memcpy": torch_gbs, "chain": CHAIN,
              "block_size": BLOCK, "dtype": "bf16",
              "seconds": time.perf_counter() - began, "rows": rows}
    (args.out / "paged_attention.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (args.out / "paged_attention.md").write_text(md)
    plotted = plot(result, args.out / "paged_attention.png")
    print(md)
    print(f"wrote {args.out}/paged_attention.{{json,md{',png' if plotted else ''}}} "
          f"in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
