"""Our paged-attention decode run back to back inside XLA programs vs eagerly, with cuDNN's
in the same kind of program: every GPU kernel's start and end from CUPTI (torch.profiler).

Why: the paged-attention matrix timed our kernel 2-4 % slower inside chained XLA programs
than the same handler called eagerly on torch's stream (CUDA events), while Nsight Compute
showed one grid, one byte count and one isolated duration for both launches. Kernel
timestamps settle such questions: on the H100 the kernel took the same time in both
(docs/design/paged_attention.md, "Timing methods"). This script records what the GPU ran in
four phases of one config, each ``--programs`` x ``CHAIN`` calls queued back to back
after a warm-up:

- ``ours_xla``: the chained program of :mod:`paged_attention` (benchmarks), our custom call;
- ``cudnn_xla``: the same chain with cuDNN's paged attention (JAX's private wrapper);
- ``ours_eager``: our handler called eagerly on torch's stream with the same queries and
  block tables (:func:`paged_attention.eager_caller`);
- ``ours_fp8_xla``: the first chain on float8_e4m3fn copies of the caches (scales 1), for
  issue 12's fp8 / bf16 speedup (``fp8_speedup``: bf16 end to end over fp8's). Its input
  sets are sized for the fp8 bytes (``fp8_sets``; before 2026-11-26's last change it read the
  bf16 chain's sets, i.e. its caches again after half the bytes).

Per phase it reports the main kernel (the kernel name with the largest total time): count,
grid, duration (median, min, max), the interval from one main kernel's end to the next
one's end (the time per call the GPU actually gave it: programmatic dependent launch lets
a kernel start before its predecessor ends, so durations alone overlap), the idle gaps
between consecutive device activities, every other kernel, memset and copy, and the
streams used. A phase whose trace holds none of its kernels says so in ``error`` (CUPTI
records the kernels of every library in the process; if XLA's are missing, this method is
void).

``--ncu`` records nothing itself: after the warm-up it makes one launch of ours (eager), one
of cuDNN and one of ours on the fp8 caches (one-call programs) between ``cudaProfilerStart``
and ``Stop``, for Nsight Compute with ``--profile-from-start off``.

Example (on the GPU machine):
    $ python benchmarks/decode_trace.py --out /tmp/trace --configs 128x8192 32x2048
    $ XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/decode_trace.py ...
    $ python benchmarks/decode_trace.py --out /tmp/trace2 --configs 32x2048 --same-order
    $ ncu --profile-from-start off --set full -o /tmp/decode \\
        python benchmarks/decode_trace.py --out /tmp/trace --configs 128x8192 --ncu
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
# Our main kernel's name; the reduce kernel (launched with PDL, so resident and waiting
# while the main kernel runs) can have the larger total duration.
MAIN_KERNEL = "paged_attention_main"


def device_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Kernels, memsets and copies of a chrome trace (torch.profiler's export), by start.

    Example:
        >>> device_events({"traceEvents": [
        ...     {"cat": "kernel", "name": "b", "ts": 5, "dur": 1},
        ...     {"cat": "cpu_op", "name": "x", "ts": 0, "dur": 9},
        ...     {"cat": "kernel", "name": "a", "ts": 1, "dur": 2}]})[0]["name"]
        'a'
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") in DEVICE_CATEGORIES]
    return sorted(events, key=lambda e: e["ts"])


def summarize(events: list[dict[str, Any]], main_hint: str = "") -> dict[str, Any]:
    """Timeline statistics of one phase (µs): see the module docstring. ``main_hint``
    (a substring of the kernel name) picks the main kernel; else the largest total time.

    Example:
        >>> ev = [{"cat": "kernel", "name": "k", "ts": t, "dur": 10, "args": {}}
        ...       for t in (0, 12, 24)]
        >>> s = summarize(ev)
        >>> s["main"]["count"], s["main"]["end_to_end_us"]["median"], s["gaps_us"]["median"]
        (3, 12.0, 2.0)
        >>> summarize(ev, "paged_attention")["error"]
        "no kernel named like 'paged_attention' recorded (seen: ['k'])"
    """
    if not events:
        return {"error": "no device activity recorded"}
    totals: dict[str, float] = {}
    for e in events:
        totals[e["name"]] = totals.get(e["name"], 0.0) + e["dur"]
    hinted = [n for n in totals if main_hint in n]
    if not hinted:
        return {"error": f"no kernel named like {main_hint!r} recorded "
                         f"(seen: {sorted(n[:80] for n in totals)})"}
    main = max(hinted, key=totals.__getitem__)
    mains = [e for e in events if e["name"] == main]
    ends = [e["ts"] + e["dur"] for e in mains]
    durs = [float(e["dur"]) for e in mains]
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in itertools.pairwise(events)]
    span = max(e["ts"] + e["dur"] for e in events) - events[0]["ts"]

    def stats(xs: list[float]) -> dict[str, float] | None:
        if not xs:
            return None
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
                "max": round(max(xs), 3), "sum": round(sum(xs), 3)}

    args = mains[0].get("args", {})
    return {
        "main": {"name": main[:160], "count": len(mains), "grid": args.get("grid"),
                 "block": args.get("block"), "duration_us": stats(durs),
                 "end_to_end_us": stats([b - a for a, b in itertools.pairwise(ends)])},
        "gaps_us": stats([float(g) for g in gaps]),
        "span_us": round(span, 3),
        "span_per_main_us": round(span / len(mains), 3),
        "others": {n[:160]: {"count": sum(e["name"] == n for e in events),
                             "total_us": round(t, 3)}
                   for n, t in totals.items() if n != main},
        "streams": sorted({str(e.get("args", {}).get("stream")) for e in events}),
    }


def record(run: Callable[[], None]) -> list[dict[str, Any]]:
    """Device events of ``run()`` (which must wait for its own work) under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return device_events(json.loads(path.read_text()))


def profiled_launches(pa: Any, data: dict[str, Any], chains: dict[str, Any],
                      impls: dict[str, Any], scale: float) -> None:
    """One launch each of ours (eager), cuDNN and ours on fp8 caches (one-call programs of
    ``impls``, with the first input set of ``chains``) inside the profiler range, each
    warmed up first (the ``--ncu`` mode)."""
    import jax
    import torch

    call = pa.eager_caller(data, data["k"], data["v"], scale, "vllm")
    programs = []
    for name, impl in impls.items():
        _, fargs, _ = chains[name]
        one = jax.jit(impl)
        args = (fargs[0][0], fargs[1], fargs[2], fargs[3][0], fargs[4])
        jax.block_until_ready(one(*args))
        programs.append((one, args))
    call(0)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call(0)
    torch.cuda.synchronize()
    for one, args in programs:
        jax.block_until_ready(one(*args))
    torch.cuda.profiler.stop()


def phases(pa: Any, cfg: dict[str, Any], programs: int, ncu: bool = False,
           spare_pages: int = 0, same_order: bool = False) -> dict[str, Any]:
    """The four phases of one config (see the module docstring); with ``ncu``, only
    :func:`profiled_launches`; ``same_order``: :func:`paged_attention.make_data`'s
    ``reorder=False``."""
    import jax
    import jax.numpy as jnp

    from xla_kernels.kernels.paged_attention import paged_attention

    nbytes = pa.kv_bytes(cfg)
    sets = pa.input_sets(nbytes)
    data = pa.make_data(cfg, sets, spare_pages, reorder=not same_order)
    scale = cfg["head_dim"] ** -0.5
    args = (data["qs"], data["k"], data["v"], data["bts"], data["lens"])
    chains = {"ours_xla": (pa.chained(lambda q, k, v, bt, ln: paged_attention(
        q, k, v, bt, ln, scale=scale)), args, MAIN_KERNEL)}
    # The same chain on float8_e4m3fn copies of the caches (half the bytes), rotating over
    # input sets sized for its own bytes: with the bf16 config's sets, the fp8 caches would
    # be read again after half the bytes, so more of them could still sit in L2 than in the
    # bf16 chain, a difference that favours fp8 (e.g. 32 x 2048: 134 MB of fp8 K+V, 2.7x the
    # L2, in one set).
    fp8_sets = pa.input_sets(nbytes // 2)
    fp8_data = (data if fp8_sets == sets
                else pa.make_data(cfg, fp8_sets, spare_pages, reorder=not same_order))
    fp8 = (fp8_data["qs"], fp8_data["k"].astype(jnp.float8_e4m3fn),
           fp8_data["v"].astype(jnp.float8_e4m3fn), fp8_data["bts"], fp8_data["lens"])
    del fp8_data  # frees its bf16 caches when they are not the bf16 chain's
    impls = {"ours_fp8_xla": lambda q, k, v, bt, ln: paged_attention(
        q, k, v, bt, ln, scale=scale, k_scale=1.0, v_scale=1.0)}
    chains["ours_fp8_xla"] = (pa.chained(impls["ours_fp8_xla"]), fp8, MAIN_KERNEL)
    cudnn = pa.load_peers()["cudnn"]
    if not isinstance(cudnn, str):
        tables = pa.cudnn_tables(data["bts"], data["k"].shape[0])
        impls["cudnn_xla"] = pa.cudnn_impl(cudnn, scale)
        chains["cudnn_xla"] = (pa.chained(impls["cudnn_xla"]),
                               (data["qs"], data["k"], data["v"], tables, data["lens"]), "")
    result: dict[str, Any] = {"config": pa.label(cfg), "kv_bytes": nbytes, "sets": sets,
                              "fp8_sets": fp8_sets,
                              "spare_pages": spare_pages, "same_order": same_order,
                              "cache_blocks": data["k"].shape[0],
                              "k_address_mod_4096": data["k"].unsafe_buffer_pointer() % 4096,
                              "v_minus_k_bytes": (data["v"].unsafe_buffer_pointer()
                                                  - data["k"].unsafe_buffer_pointer()),
                              "calls_per_phase": programs * pa.CHAIN}
    if ncu:
        profiled_launches(pa, data, chains, impls, scale)
        return result
    for name, (fn, fargs, hint) in chains.items():
        for _ in range(2):
            jax.block_until_ready(fn(*fargs))

        def run(fn: Any = fn, fargs: tuple = fargs) -> None:
            outs = [fn(*fargs) for _ in range(programs)]
            jax.block_until_ready(outs)

        result[name] = summarize(record(run), hint)
    call = pa.eager_caller(data, data["k"], data["v"], scale, "vllm")
    if call is not None:
        for i in range(3):
            call(i)

        def run_eager() -> None:
            for i in range(programs * pa.CHAIN):
                call(i)

        result["ours_eager"] = summarize(record(run_eager), MAIN_KERNEL)
    e2e = {name: (result.get(name, {}).get("main", {}).get("end_to_end_us") or {}).get("median")
           for name in ("ours_xla", "ours_fp8_xla", "cudnn_xla")}
    if e2e["ours_xla"] and e2e["ours_fp8_xla"]:
        result["fp8_speedup"] = e2e["ours_xla"] / e2e["ours_fp8_xla"]
    if e2e["ours_xla"] and e2e["cudnn_xla"]:
        result["cudnn_over_ours"] = e2e["cudnn_xla"] / e2e["ours_xla"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["128x8192", "32x2048"],
                        help="SEQSxCONTEXT[/KV_HEADS[/HEAD_DIM]] at 32 q heads (8 kv heads "
                             "and head_dim 128 unless given), block 16, bf16")
    parser.add_argument("--programs", type=int, default=3, help="chained programs per phase")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="default", help="names the JSON (e.g. the XLA flags)")
    parser.add_argument("--spare-pages", type=int, default=0,
                        help="unused cache blocks per sequence (varies the caches' placement)")
    parser.add_argument("--same-order", action="store_true",
                        help="every call reads its input set's pages in one order (nothing "
                             "left in L2 for the next call once a set exceeds the L2)")
    parser.add_argument("--ncu", action="store_true",
                        help="one profiled launch of ours and of cuDNN per config, nothing else")
    args = parser.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from xla_kernels.bench import device_description, load_script

    pa = load_script(Path(__file__).with_name("paged_attention.py"))
    results = {"device": device_description(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "configs": []}
    for text in args.configs:
        shape, *heads = text.split("/")
        seqs, context = (int(x) for x in shape.split("x"))
        kv_heads, head_dim = ([int(x) for x in heads] + [8, 128][len(heads):])[:2]
        cfg = pa.config(seqs, context, num_kv_heads=kv_heads, head_dim=head_dim)
        row = phases(pa, cfg, args.programs, args.ncu, args.spare_pages, args.same_order)
        results["configs"].append(row)
        if args.ncu:
            continue
        for name in ("ours_xla", "cudnn_xla", "ours_eager", "ours_fp8_xla"):
            s = row.get(name, {})
            m = s.get("main", {})
            e2e = (m.get("end_to_end_us") or {}).get("median")
            print(f"{row['config']} {name}: {m.get('count')} x {m.get('name', '')[:40]!r} "
                  f"grid {m.get('grid')}: end-to-end median {e2e} us, duration "
                  f"{(m.get('duration_us') or {}).get('median')} us, gaps {s.get('gaps_us')}, "
                  f"others {s.get('others')}", flush=True)
        print(f"{row['config']} (K % 4096: {row['k_address_mod_4096']}, V - K: "
              f"{row['v_minus_k_bytes']}): cuDNN / ours "
              f"{row.get('cudnn_over_ours', 0):.4f}, fp8 speedup {row.get('fp8_speedup', 0):.3f}x",
              flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"decode_trace_{args.tag}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
