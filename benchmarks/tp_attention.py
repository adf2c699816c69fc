"""Paged attention with the kv heads split over N devices vs the same on one device.

For each configuration (32 q / 8 kv heads, bf16, head_dim 128, block 16) it runs one op
under plain ``jax.jit``: ``paged_attention`` decode (num_seqs x context), or
``ragged_paged_attention`` on a ragged batch (a prefill-heavy one and a mixed one: prefill
chunks and decodes in one call); once on device 0, once with the KV caches (vLLM layout,
sharded along kv heads) and the queries (along q heads) placed over a 1-D mesh of the
first N devices (each op's sharding rule keeps each device's call local).
Per config it records: the largest absolute difference between the two outputs (expect 0:
each head's math is the same), the collectives of the compiled N-device program and which
of them move a KV cache (expect none), the time per call on 1 and N devices and the speedup
(goal: >= 1.7x at N = 2).

Timing (the method of ``benchmarks/paged_attention.py``): each jitted program runs a chain
of ``CHAIN`` calls, each with its own queries and block table (so XLA can merge no work
between calls); the tables rotate over disjoint sets of blocks sized past the L2. Programs
are queued back to back (dispatch overlaps device work) and the median per-call time of 5
windows is kept. Decode sequences have the full context; a ragged sequence's query rows
are the last q_len tokens of its kv_len (causal).

``tp_attention.json`` and ``tp_attention.md`` in ``--out`` are rewritten after each config.
``--smoke`` runs tiny float32 configs; on the CPU it fakes N devices
(``--xla_force_host_platform_device_count``), which checks the script, not the speed.

Example:
    $ python benchmarks/tp_attention.py --n 2 --out benchmarks/results/latest/h100x2
    $ python benchmarks/tp_attention.py --smoke --out /tmp/tp-smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv and "device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()

import jax  # after XLA_FLAGS
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xla_kernels.bench import budgeted_seconds, device_description
from xla_kernels.kernels.paged_attention import paged_attention
from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention

CHAIN = 16               # op calls per timed program
L2_BYTES = 50e6          # H100 L2; input sets rotate over at least 3x this
BLOCK = 16
MEMORY_SHARE = 0.7       # skip a config whose data would take more of one device's memory
COLLECTIVE = re.compile(r"(all-gather|all-to-all|collective-permute|all-reduce)")


def matrix(smoke: bool) -> list[dict[str, Any]]:
    """The configurations: the op, its sequences' query rows (``q_lens``: 1 for decode)
    and contexts (``kv_lens``), q heads, kv heads, head_dim, dtype.

    Example:
        >>> [c["name"] for c in matrix(smoke=False)]
        ['paged 128x8192', 'paged 32x32768', 'ragged prefill 4x4096', \
'ragged mixed 64 decode + 4x512']
    """
    rows = ([("paged", "4x256", [1] * 4, [256] * 4, 8, 4, 128, "float32"),
             ("paged", "2x512", [1] * 2, [512] * 2, 8, 4, 64, "float32"),
             ("ragged", "3 chunks + 2 decodes", [40, 17, 64, 1, 1], [300, 17, 64, 90, 256], 8,
              4, 128, "float32")] if smoke else
            [("paged", "128x8192", [1] * 128, [8192] * 128, 32, 8, 128, "bfloat16"),
             ("paged", "32x32768", [1] * 32, [32768] * 32, 32, 8, 128, "bfloat16"),
             ("ragged", "prefill 4x4096", [4096] * 4, [4096] * 4, 32, 8, 128, "bfloat16"),
             ("ragged", "mixed 64 decode + 4x512", [1] * 64 + [512] * 4,
              [2048] * 64 + [4096] * 4, 32, 8, 128, "bfloat16")])
    return [dict(op=op, name=f"{op} {name}", q_lens=q, kv_lens=k, num_q_heads=hq,
                 num_kv_heads=hkv, head_dim=d, dtype=dt)
            for op, name, q, k, hq, hkv, d, dt in rows]


def kv_bytes(cfg: dict[str, Any]) -> int:
    """Bytes of K and V one call reads (each sequence's context once).

    Example:
        >>> kv_bytes(dict(kv_lens=[10, 20], num_kv_heads=2, head_dim=4, dtype="bfloat16"))
        960
    """
    return (2 * jnp.dtype(cfg["dtype"]).itemsize * sum(cfg["kv_lens"]) * cfg["num_kv_heads"]
            * cfg["head_dim"])


def memory_limit(device: Any) -> float:
    """Bytes one device may hold (``inf`` where the backend does not say: the CPU)."""
    stats = device.memory_stats() or {}
    return float(stats.get("bytes_limit", math.inf))


def make_data(cfg: dict[str, Any], sets: int, device: Any) -> dict[str, Any]:
    """Random caches (vLLM layout) and ``CHAIN`` (queries, block table) pairs on ``device``
    (queries [seqs, q heads, d] for paged, [rows, q heads, d] for ragged); the tables rotate
    over ``sets`` disjoint sets of blocks. ``meta``: the sequence arrays after the table
    (paged: kv_lens; ragged: kv_lens, cu_q_lens, num_seqs)."""
    q_lens, kv_lens = cfg["q_lens"], cfg["kv_lens"]
    s, hq, hkv, d = len(kv_lens), cfg["num_q_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    pages = -(-max(kv_lens) // BLOCK)
    nblocks = sets * s * pages
    rows = s if cfg["op"] == "paged" else sum(q_lens)
    k1, k2, k3 = jax.random.split(jax.random.key(sum(kv_lens) + 7 * s), 3)
    with jax.default_device(device):
        cache = jax.jit(lambda k: jax.random.normal(k, (nblocks, BLOCK, hkv, d), cfg["dtype"]))
        rng = np.random.default_rng(0)
        perm = rng.permutation(nblocks).reshape(sets, s, pages)
        qs = jax.random.normal(k3, (CHAIN, rows, hq, d), cfg["dtype"])
        meta = [jnp.asarray(kv_lens, jnp.int32)]
        if cfg["op"] == "ragged":
            meta += [jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32),
                     jnp.asarray([s], jnp.int32)]
        return {"k": cache(k1), "v": cache(k2), "qs": [qs[i] for i in range(CHAIN)],
                "bts": [jnp.asarray(perm[i % sets], jnp.int32) for i in range(CHAIN)],
                "meta": meta}


def shard(data: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """``data`` over ``mesh``: caches along kv heads, queries along q heads, the rest
    replicated."""
    def put(x: Any, spec: P) -> Any:
        return jax.device_put(x, NamedSharding(mesh, spec))

    heads = P(None, None, "tp", None)
    return {"k": put(data["k"], heads), "v": put(data["v"], heads),
            "qs": [put(q, P(None, "tp", None)) for q in data["qs"]],
            "bts": [put(b, P()) for b in data["bts"]], "meta": [put(m, P()) for m in data["meta"]]}


def chained(op: str, scale: float) -> Any:
    """The jitted chain of ``CHAIN`` distinct calls of ``op`` (paged or ragged)."""
    def run(qs: list, k: Any, v: Any, bts: list, meta: list) -> list:
        if op == "paged":
            return [paged_attention(qs[i], k, v, bts[i], meta[0], scale=scale)
                    for i in range(CHAIN)]
        kv_lens, cu_q_lens, num_seqs = meta
        return [ragged_paged_attention(qs[i], k, v, kv_lens, bts[i], cu_q_lens, num_seqs,
                                       scale=scale) for i in range(CHAIN)]

    return jax.jit(run)


def collectives(text: str, cache_shape: tuple[int, ...]) -> dict[str, Any]:
    r"""The compiled program's collectives by kind, and those whose result has the cache's
    leading dimensions (a cache moved between devices).

    Example:
        >>> text = "%a = bf16[64,16,8,128]{3,2,1,0} all-gather(%p)\n%b = f32[4] all-reduce(%q)"
        >>> found = collectives(text, (64, 16, 4, 128))
        >>> found["counts"], len(found["cache_collectives"])
        ({'all-gather': 1, 'all-reduce': 1}, 1)
    """
    lines = [line.strip() for line in text.splitlines() if COLLECTIVE.search(line.split("(")[0])]
    counts: dict[str, int] = {}
    for line in lines:
        kind = COLLECTIVE.search(line.split("(")[0]).group(1)
        counts[kind] = counts.get(kind, 0) + 1
    lead = f"[{cache_shape[0]},{cache_shape[1]},"
    return {"counts": counts, "cache_collectives": [line[:300] for line in lines
                                                    if lead in line.split("(")[0]]}


def measure(cfg: dict[str, Any], devices: list[Any], budget: float) -> dict[str, Any]:
    """One config on one device and on ``devices`` (see the module doc)."""
    n = len(devices)
    nbytes = kv_bytes(cfg)
    sets = max(1, min(CHAIN, math.ceil(3 * L2_BYTES / nbytes)))
    row: dict[str, Any] = {**cfg, "devices": n, "kv_bytes": nbytes, "sets": sets}
    if 2 * sets * nbytes > MEMORY_SHARE * memory_limit(devices[0]):
        row["skipped"] = f"caches of {2 * sets * nbytes / 1e9:.1f} GB do not fit one device"
        return row
    data = make_data(cfg, sets, devices[0])
    fn = chained(cfg["op"], cfg["head_dim"] ** -0.5)
    args = (data["qs"], data["k"], data["v"], data["bts"], data["meta"])
    row["one_device_ms"] = budgeted_seconds(fn, args, budget, calls=CHAIN) * 1e3
    one = np.asarray(fn(*args)[0], np.float32)
    sharded = shard(data, Mesh(np.array(devices), ("tp",)))
    del data, args
    args = (sharded["qs"], sharded["k"], sharded["v"], sharded["bts"], sharded["meta"])
    row.update(collectives(fn.lower(*args).compile().as_text(), sharded["k"].shape))
    row[f"{n}_devices_ms"] = budgeted_seconds(fn, args, budget, calls=CHAIN) * 1e3
    row["max_abs_diff"] = float(np.abs(np.asarray(fn(*args)[0], np.float32) - one).max())
    row["speedup"] = row["one_device_ms"] / row[f"{n}_devices_ms"]
    row["kv_gbs_n_devices"] = nbytes / (row[f"{n}_devices_ms"] * 1e-3) / 1e9
    return row


def markdown(result: dict[str, Any]) -> str:
    """The results as a short markdown report."""
    n = result["devices"]
    lines = [f"# Paged attention split over {n} devices along kv heads — "
             f"{result['device']} x {n}, jax {result['jax']}, {result['date']}", "",
             "Method: plain jax.jit; caches [blocks, 16, kv heads, d] sharded along kv heads "
             "and queries along q heads over a 1-D mesh, vs the same arrays on device 0. "
             f"Per call, median of 5 windows of pipelined programs of {CHAIN} distinct calls "
             "(benchmarks/paged_attention.py's method). paged: paged_attention decode, every "
             "sequence at full context; ragged: ragged_paged_attention (prefill chunks and "
             "decodes in one call, causal). Goal (paged): >= 1.7x at 2 devices, outputs "
             "identical.", "",
             f"| config | q/kv heads | d | dtype | KV GB | 1 device ms | {n} devices ms "
             "| speedup | max abs diff | cache collectives | all collectives |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        head = (f"| {r['name']} | {r['num_q_heads']}/{r['num_kv_heads']} "
                f"| {r['head_dim']} | {r['dtype']} | {r['kv_bytes'] / 1e9:.2f} |")
        if "skipped" in r:
            lines.append(f"{head} skipped: {r['skipped']} |||||")
            continue
        lines.append(f"{head} {r['one_device_ms']:.4f} | {r[f'{n}_devices_ms']:.4f} | "
                     f"{r['speedup']:.2f}x | {r['max_abs_diff']:g} | "
                     f"{len(r['cache_collectives'])} | {r['counts'] or 'none'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2, help="devices to split over (default 2)")
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny float32 configs (fakes devices on the CPU)")
    parser.add_argument("--budget", type=float, default=0.3,
                        help="seconds of timed runs per config and placement")
    args = parser.parse_args()
    devices = jax.devices()
    if len(devices) < args.n:
        parser.error(f"--n {args.n}: JAX sees {len(devices)} {devices[0].platform} "
                     f"device(s). Fix: pass --n {len(devices)} or run on {args.n} GPUs.")
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {**device_description(), "devices": args.n,
                              "date": datetime.date.today().isoformat(), "chain": CHAIN,
                              "smoke": args.smoke, "rows": []}
    for cfg in matrix(args.smoke):
        row = measure(cfg, devices[:args.n], args.budget)
        result["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "cache_collectives"}),
              flush=True)
        (args.out / "tp_attention.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "tp_attention.md").write_text(markdown(result))


if __name__ == "__main__":
    main()
