"""The benchmark gate: every shipped kernel's headline configurations timed against the
recorded baseline, failing on a slowdown beyond the measured noise.

Kernels may change their machine code (refactors, new tile choices); this gate is what
protects their speed. Each configuration is one jitted program that makes ``CHAIN`` calls
of the op on distinct inputs (in-place cache writes carry the cache from call to call,
donated); programs are queued back to back in windows of about ``--budget / 5`` seconds
and the median window gives the time per op call. That is repeated ``--rounds`` times,
all configurations in turn each round (so a slow drift of the card's clock touches every
one alike); a configuration's time is the median of its rounds and its noise the largest
deviation of one round from that median, relative to it.

``--write`` records the times in ``benchmarks/results/latest/<card>/gate.json`` (card:
``h100``, ``h200``, ... from ``nvidia-smi``; ``--card`` overrides it). Without it the run
is compared with that file: a configuration fails when its time exceeds the baseline's by
more than its tolerance, ``max(--min-tolerance, baseline noise, this run's noise)``. The
exit code is 1 on any slowdown, 2 when there is no baseline to compare with or its
libraries were built otherwise (``hopper_paths``).

Configurations that need another setting of an environment variable the kernels read
once per process (``XLA_KERNELS_RAGGED_WGMMA=0``: the mma.sync prefill kernel on a Hopper
card) run in a child process with that setting.

The whole gate, first-use builds of the kernels included, is sized for one 10-minute GPU
call (36 configurations, 5 rounds of 0.25 s each); ``scripts/gpu/gate.sh`` runs it.

Example:
    $ python benchmarks/gate.py --write                 # record the baseline of this card
    $ python benchmarks/gate.py                         # compare; exit 1 on a slowdown
    $ python benchmarks/gate.py --only paged --rounds 3 # a subset
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "latest"
CHAIN = 8                 # op calls per timed program, each on its own inputs
MIN_TOLERANCE = 0.02      # the smallest slowdown that fails, whatever the measured noise


@dataclasses.dataclass
class Case:
    """One configuration: ``step()`` queues one program of ``calls`` op calls and returns
    something to wait on."""

    name: str
    calls: int
    step: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class Config:
    """A named configuration; ``build(smoke)`` makes its :class:`Case` (``smoke``: tiny
    sizes, for a check of the script on any backend); ``env``: variables set in the child
    process that runs it."""

    name: str
    build: Callable[[bool], Case]
    env: tuple[tuple[str, str], ...] = ()


# ---------------------------------------------------------------------------------------
# Configurations


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _chain(op_call: Callable[..., Any], per_call: list, *shared: Any) -> Case:
    """A program of ``len(per_call)`` calls ``op_call(per_call[i], *shared)``."""
    import jax

    fn = jax.jit(lambda xs, *rest: [op_call(x, *rest) for x in xs])
    return Case("", len(per_call), lambda: fn(per_call, *shared))


def _carried(op_call: Callable[..., Any], state: tuple, per_call: list) -> Case:
    """A program of calls ``state = op_call(state, per_call[i])`` on a donated state (an
    in-place cache write), carried from program to program."""
    import jax

    def program(st: tuple, xs: list) -> tuple:
        for x in xs:
            st = op_call(st, x)
        return st

    fn = jax.jit(program, donate_argnums=(0,))
    box = [state]

    def step() -> Any:
        box[0] = fn(box[0], per_call)
        return box[0]

    return Case("", len(per_call), step)


def _normal(seed: int, shape: tuple, dtype: Any) -> Any:
    import jax

    jnp = _jnp()
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32).astype(dtype)


def _weight(seed: int, shape: tuple, fan_in: int) -> Any:
    """A bf16 weight of normal entries over sqrt(fan_in): products of order one."""
    jnp = _jnp()
    return (_normal(seed, shape, jnp.float32) * fan_in ** -0.5).astype(jnp.bfloat16)


def _dtype(name: str) -> Any:
    jnp = _jnp()
    return {"f32": jnp.float32, "bf16": jnp.bfloat16, "fp8": jnp.float8_e4m3fn}[name]


def simple_add_case(dtype: str, log2: int) -> Callable[[bool], Case]:
    def build(smoke: bool) -> Case:
        from xla_kernels.kernels.simple_add import simple_add

        n = 1 << (10 if smoke else log2)
        xs = [_normal(i, (n,), _dtype(dtype)) for i in range(CHAIN)]
        return _chain(simple_add, xs, _normal(99, (n,), _dtype(dtype)))
    return build


def rms_norm_case(dtype: str, rows: int, hidden: int) -> Callable[[bool], Case]:
    def build(smoke: bool) -> Case:
        from xla_kernels.kernels.rms_norm import rms_norm

        r, h = (8, 256) if smoke else (rows, hidden)
        xs = [_normal(i, (r, h), _dtype(dtype)) for i in range(CHAIN)]
        return _chain(rms_norm, xs, _normal(99, (h,), _dtype(dtype)))
    return build


HKV, HQ, D = 8, 32, 128
FP8_SCALE = 0.0625


def kv_write_case(tokens: int, cache_dtype: str, fused: bool) -> Callable[[bool], Case]:
    """One step's K/V writes of ``tokens`` tokens (bf16) into a cache of 16-token blocks
    with 4x that many slots, at shuffled slots."""
    def build(smoke: bool) -> Case:
        import numpy as np

        from xla_kernels.kernels.kv_cache import reshape_and_cache, reshape_and_cache_fused

        jnp = _jnp()
        n, hkv, d = (8, 2, 64) if smoke else (tokens, HKV, D)
        blocks = -(-4 * n // 16)
        rng = np.random.default_rng(0)
        scales = ({"k_scale": FP8_SCALE, "v_scale": FP8_SCALE} if cache_dtype == "fp8"
                  else {})
        per_call = [(_normal(2 * i, (n, hkv, d), jnp.bfloat16),
                     _normal(2 * i + 1, (n, hkv, d), jnp.bfloat16),
                     jnp.asarray(rng.permutation(blocks * 16)[:n], jnp.int32))
                    for i in range(CHAIN)]
        cdt = _dtype(cache_dtype)
        if fused:
            state = (jnp.zeros((blocks, 16, 2 * hkv, d), cdt),)
            return _carried(lambda st, x: (reshape_and_cache_fused(
                x[0], x[1], st[0], x[2], **scales),), state, per_call)
        state = (jnp.zeros((blocks, 16, hkv, d), cdt), jnp.zeros((blocks, 16, hkv, d), cdt))
        return _carried(lambda st, x: tuple(reshape_and_cache(
            x[0], x[1], st[0], st[1], x[2], **scales)), state, per_call)
    return build


def _cache(seed: int, shape: tuple, dtype: str) -> Any:
    if dtype == "fp8":
        return (_normal(seed, shape, _jnp().float32) / FP8_SCALE).astype(_dtype("fp8"))
    return _normal(seed, shape, _dtype(dtype))


def paged_case(seqs: int, context: int, cache_dtype: str = "bf16", head_dim: int = D,
               kv_heads: int = HKV) -> Callable[[bool], Case]:
    """paged_attention decode: ``seqs`` sequences of ``context`` tokens, 32 q heads, blocks
    of 16 tokens in shuffled order, bf16 queries."""
    def build(smoke: bool) -> Case:
        import numpy as np

        from xla_kernels.kernels.paged_attention import paged_attention

        jnp = _jnp()
        s, ctx, hq, hkv, d = ((2, 64, 4, 2, head_dim) if smoke
                              else (seqs, context, HQ, kv_heads, head_dim))
        pages = ctx // 16
        tables = np.random.default_rng(0).permutation(s * pages).reshape(s, pages)
        k = _cache(1, (s * pages, 16, hkv, d), cache_dtype)
        v = _cache(2, (s * pages, 16, hkv, d), cache_dtype)
        qs = [_normal(10 + i, (s, hq, d), jnp.bfloat16) for i in range(CHAIN)]
        kw = {"scale": d ** -0.5}
        if cache_dtype == "fp8":
            kw |= {"k_scale": FP8_SCALE, "v_scale": FP8_SCALE}
        return _chain(lambda q, k, v, bt, ln: paged_attention(q, k, v, bt, ln, **kw), qs,
                      k, v, jnp.asarray(tables, jnp.int32), jnp.full((s,), ctx, jnp.int32))
    return build


def ragged_case(q_lens: list[int], kv_lens: list[int], cache_dtype: str = "bf16",
                fused: bool = False, block: int = 16) -> Callable[[bool], Case]:
    """ragged_paged_attention on a batch of (q_len, kv_len) sequences, 32 q / 8 kv heads,
    d 128, shuffled blocks, bf16 queries, one free sequence slot (as a serving engine has:
    a decode batch then takes the decode path)."""
    def build(smoke: bool) -> Case:
        import numpy as np

        from xla_kernels.kernels.ragged_paged_attention import (
            ragged_paged_attention,
            ragged_paged_attention_fused,
        )

        jnp = _jnp()
        ql, kl = ([min(q, 4) for q in q_lens[:3]], [min(k, 64) for k in kv_lens[:3]]) \
            if smoke else (q_lens, kv_lens)
        hq, hkv, d = (4, 2, 64) if smoke else (HQ, HKV, D)
        n = len(ql)
        max_blocks = -(-max(kl) // block)
        num_blocks = n * max_blocks
        tables = np.random.default_rng(0).permutation(num_blocks).reshape(n, max_blocks)
        cu = np.concatenate([[0], np.cumsum(ql), [sum(ql)]])
        meta = (jnp.asarray([*kl, 0], jnp.int32),
                jnp.asarray(np.concatenate([tables, tables[:1]]), jnp.int32),
                jnp.asarray(cu, jnp.int32), jnp.asarray([n], jnp.int32))
        qs = [_normal(10 + i, (sum(ql) + 1, hq, d), jnp.bfloat16) for i in range(CHAIN)]
        kw = {"scale": d ** -0.5}
        if cache_dtype == "fp8":
            kw |= {"k_scale": FP8_SCALE, "v_scale": FP8_SCALE}
        if fused:
            kv = _cache(1, (num_blocks, block, 2 * hkv, d), cache_dtype)
            return _chain(lambda q, kv, *m: ragged_paged_attention_fused(q, kv, *m, **kw),
                          qs, kv, *meta)
        k = _cache(1, (num_blocks, block, hkv, d), cache_dtype)
        v = _cache(2, (num_blocks, block, hkv, d), cache_dtype)
        return _chain(lambda q, k, v, *m: ragged_paged_attention(q, k, v, *m, **kw), qs,
                      k, v, *meta)
    return build


# Llama-3-8B's projections (out, in): the weights that the GEMM configurations stream. gate_up
# in bf16 (235 MB) and e4m3 (117 MB) and down in e4m3 (59 MB) exceed the H100/H200 L2, so a
# chain's calls read their weight from HBM as a decode step does.
LLAMA_LINEARS = {"gate_up": (28672, 4096), "down": (4096, 14336)}


def linear_case(weight: str, tokens: int) -> Callable[[bool], Case]:
    """linear (bf16) on one of Llama-3-8B's weights."""
    def build(smoke: bool) -> Case:
        from xla_kernels.kernels.linear import linear

        jnp = _jnp()
        out, k = (64, 128) if smoke else LLAMA_LINEARS[weight]
        xs = [_normal(i, (tokens, k), jnp.bfloat16) for i in range(CHAIN)]
        return _chain(linear, xs, _weight(99, (out, k), k))
    return build


def fp8_linear_case(weight: str, tokens: int, scheme: str = "none") -> Callable[[bool], Case]:
    """fp8_linear on one of Llama-3-8B's weights in e4m3 with per-channel scales, bf16 x
    (``scheme``: "none", weight-only, or "dynamic", W8A8)."""
    def build(smoke: bool) -> Case:
        import numpy as np

        from xla_kernels.kernels.fp8_linear import fp8_linear, fp8_quantize

        jnp = _jnp()
        out, k = (64, 128) if smoke else LLAMA_LINEARS[weight]
        rng = np.random.default_rng(0)
        q, s = fp8_quantize(rng.standard_normal((out, k), np.float32) * k ** -0.5, (0, 0))
        xs = [_normal(i, (tokens, k), jnp.bfloat16) for i in range(CHAIN)]
        return _chain(lambda x, q, s: fp8_linear(x, q, s, activation_scheme=scheme), xs,
                      jnp.asarray(q), jnp.asarray(s))
    return build


def moe_case(tokens: int) -> Callable[[bool], Case]:
    """fused_moe on Mixtral-8x7B's expert layer (8 experts, hidden 4096, intermediate
    14336, top-2, bf16): 2.8 GB of weights, of which a decode step reads the routed experts'."""
    def build(smoke: bool) -> Case:
        from xla_kernels.kernels.moe import fused_moe

        jnp = _jnp()
        experts, hidden, inter = (4, 128, 256) if smoke else (8, 4096, 14336)
        w13 = _weight(1, (experts, 2 * inter, hidden), hidden)
        w2 = _weight(2, (experts, hidden, inter), inter)
        per_call = [(_normal(10 + i, (tokens, hidden), jnp.bfloat16),
                     _normal(100 + i, (tokens, experts), jnp.float32)) for i in range(CHAIN)]
        return _chain(lambda x, w13, w2: fused_moe(x[0], x[1], w13, w2, top_k=2), per_call,
                      w13, w2)
    return build


MMA = (("XLA_KERNELS_RAGGED_WGMMA", "0"),)

CONFIGS: list[Config] = [
    Config("simple_add f32 2^24", simple_add_case("f32", 24)),
    Config("simple_add bf16 2^24", simple_add_case("bf16", 24)),
    Config("rms_norm bf16 16384x4096", rms_norm_case("bf16", 16384, 4096)),
    Config("rms_norm f32 4096x4096", rms_norm_case("f32", 4096, 4096)),
    Config("reshape_and_cache bf16 8192 tokens", kv_write_case(8192, "bf16", fused=False)),
    Config("reshape_and_cache fp8 8192 tokens", kv_write_case(8192, "fp8", fused=False)),
    Config("reshape_and_cache_fused bf16 8192 tokens", kv_write_case(8192, "bf16", fused=True)),
    Config("reshape_and_cache_fused bf16 256 tokens", kv_write_case(256, "bf16", fused=True)),
    Config("paged bf16 32x2048", paged_case(32, 2048)),
    Config("paged bf16 128x8192", paged_case(128, 8192)),
    Config("paged bf16 1x32768", paged_case(1, 32768)),
    Config("paged bf16 32x2048 d64", paged_case(32, 2048, head_dim=64)),
    Config("paged bf16 32x2048 d256", paged_case(32, 2048, head_dim=256)),
    Config("paged bf16 8x8192 32/32", paged_case(8, 8192, kv_heads=32)),
    Config("paged fp8 32x2048", paged_case(32, 2048, "fp8")),
    Config("paged fp8 128x8192", paged_case(128, 8192, "fp8")),
    Config("paged fp8 32x2048 d256", paged_case(32, 2048, "fp8", head_dim=256)),
    Config("ragged decode 128x2048", ragged_case([1] * 128, [2048] * 128)),
    Config("ragged decode 64x2048 fp8", ragged_case([1] * 64, [2048] * 64, "fp8")),
    Config("ragged prefill 4x4096", ragged_case([4096] * 4, [4096] * 4)),
    Config("ragged prefill 4x4096 fp8", ragged_case([4096] * 4, [4096] * 4, "fp8")),
    Config("ragged chunked 8x512 of 8192", ragged_case([512] * 8, [8192] * 8)),
    Config("ragged mixed 64 decode + 4x512",
           ragged_case([1] * 64 + [512] * 4, [2048] * 64 + [4096] * 4)),
    Config("ragged fused decode 64x2048 b16", ragged_case([1] * 64, [2048] * 64, fused=True)),
    Config("ragged fused prefill 4x4096 b128",
           ragged_case([4096] * 4, [4096] * 4, fused=True, block=128)),
    Config("ragged mma prefill 4x4096", ragged_case([4096] * 4, [4096] * 4), env=MMA),
    Config("ragged mma chunked 8x512 of 8192", ragged_case([512] * 8, [8192] * 8), env=MMA),
    Config("linear bf16 gate_up 1 token", linear_case("gate_up", 1)),
    Config("linear bf16 gate_up 64 tokens", linear_case("gate_up", 64)),
    Config("fp8_linear gate_up 1 token", fp8_linear_case("gate_up", 1)),
    Config("fp8_linear gate_up 16 tokens", fp8_linear_case("gate_up", 16)),
    Config("fp8_linear gate_up 64 tokens", fp8_linear_case("gate_up", 64)),
    Config("fp8_linear down 64 tokens", fp8_linear_case("down", 64)),
    Config("fp8_linear w8a8 gate_up 64 tokens", fp8_linear_case("gate_up", 64, "dynamic")),
    Config("fused_moe mixtral 16 tokens", moe_case(16)),
    Config("fused_moe mixtral 64 tokens", moe_case(64)),
]


# ---------------------------------------------------------------------------------------
# Timing


def seconds_per_call(case: Case, budget: float, windows: int = 5) -> float:
    """Median over ``windows`` windows of back-to-back programs (about ``budget`` seconds
    together) of the time per op call."""
    import jax

    jax.block_until_ready(case.step())
    start = time.perf_counter()
    jax.block_until_ready(case.step())
    one = time.perf_counter() - start
    per_window = max(1, min(500, int(budget / windows / max(one, 1e-6))))
    samples = []
    for _ in range(windows):
        start = time.perf_counter()
        out = None
        for _ in range(per_window):
            out = case.step()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / per_window / case.calls)
    return statistics.median(samples)


def summarize(samples: list[float]) -> dict[str, float]:
    """A configuration's time (ms, the median of its rounds) and noise (the largest
    deviation of a round from it, relative).

    Example:
        >>> summarize([1.0, 1.02, 0.99])
        {'ms': 1.0, 'noise': 0.02, 'rounds_ms': [1.0, 1.02, 0.99]}
    """
    med = statistics.median(samples)
    noise = max(abs(s - med) for s in samples) / med if med > 0 else 0.0
    return {"ms": med, "noise": round(noise, 6), "rounds_ms": list(samples)}


def measure(configs: list[Config], rounds: int, budget: float,
            smoke: bool) -> dict[str, dict[str, float]]:
    """Builds and warms every configuration (first-use kernel builds happen here), then
    times them all in turn, ``rounds`` times."""
    cases = []
    for cfg in configs:
        began = time.perf_counter()
        case = dataclasses.replace(cfg.build(smoke), name=cfg.name)
        import jax

        jax.block_until_ready(case.step())
        print(f"  ready {cfg.name} ({time.perf_counter() - began:.1f} s)", flush=True)
        cases.append(case)
    samples: dict[str, list[float]] = {c.name: [] for c in cases}
    for r in range(rounds):
        for case in cases:
            samples[case.name].append(seconds_per_call(case, budget) * 1e3)
        print(f"  round {r + 1}/{rounds} done", flush=True)
    return {name: summarize(s) for name, s in samples.items()}


def measure_in_child(configs: list[Config], args: argparse.Namespace) -> dict[str, Any]:
    """The configurations (all with one ``env``) timed by this script in a child process
    with that environment."""
    env = {**os.environ, **dict(configs[0].env)}
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.json"
        cmd = [sys.executable, __file__, "--raw-out", str(raw), "--rounds", str(args.rounds),
               "--budget", str(args.budget), *(["--smoke"] if args.smoke else []),
               *(["--src", str(args.src)] if args.src else []),
               "--exact", *[c.name for c in configs]]
        print(f"  child: {' '.join(f'{k}={v}' for k, v in configs[0].env)}", flush=True)
        subprocess.run(cmd, env=env, check=True)
        return json.loads(raw.read_text())


# The ops the configurations call, by module: built ahead in parallel (``--prebuild``).
OPS = {"simple_add": ("simple_add",), "rms_norm": ("rms_norm",),
       "kv_cache": ("reshape_and_cache", "reshape_and_cache_fused"),
       "paged_attention": ("paged_attention",),
       "ragged_paged_attention": ("ragged_paged_attention", "ragged_paged_attention_fused")}


def prebuild(src: Path | None) -> None:
    """Builds every op's CUDA library at once, one process per op (first-use builds one by
    one would take most of a 10-minute call); a failed build shows again when it is used."""
    began = time.perf_counter()
    env = {**os.environ, **({"PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
                            if src else {})}
    procs = []
    for module, ops in OPS.items():
        for op in ops:
            code = (f"from xla_kernels.kernels.{module} import {op}\n"
                    f"from xla_kernels.runtime.library import load_kernel\n"
                    f"load_kernel({op}, 'cuda')")
            procs.append((op, subprocess.Popen([sys.executable, "-c", code], env=env)))
    failed = [op for op, p in procs if p.wait() != 0]
    print(f"  prebuilt {len(procs) - len(failed)}/{len(procs)} ops in "
          f"{time.perf_counter() - began:.0f} s" + (f"; failed: {failed}" if failed else ""),
          flush=True)


def run_all(configs: list[Config], args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration's summary: those without an ``env`` here, the others in one
    child process per distinct ``env``."""
    here = [c for c in configs if not c.env]
    results = measure(here, args.rounds, args.budget, args.smoke) if here else {}
    for env in dict.fromkeys(c.env for c in configs if c.env):
        results |= measure_in_child([c for c in configs if c.env == env], args)
    return {c.name: results[c.name] for c in configs if c.name in results}


# ---------------------------------------------------------------------------------------
# Comparison


def card_from_name(name: str) -> str:
    """The results folder of a GPU model name as nvidia-smi prints it.

    Example:
        >>> card_from_name("NVIDIA H100 80GB HBM3"), card_from_name("NVIDIA H200")
        ('h100', 'h200')
        >>> card_from_name("NVIDIA A100-SXM4-80GB"), card_from_name("cpu")
        ('a100', 'cpu')
    """
    match = re.search(r"\b([A-Z]+\d{2,4})", name)
    return match.group(1).lower() if match else re.sub(r"\W+", "_", name.strip().lower())


def detect_card() -> str:
    """This machine's first GPU as a results folder name (:func:`card_from_name`)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"gate: cannot name the GPU ({e}); pass --card") from e
    return card_from_name(out.splitlines()[0])


def compare(baseline: dict[str, Any], current: dict[str, Any],
            min_tolerance: float = MIN_TOLERANCE) -> list[dict[str, Any]]:
    """One row per configuration of ``current``: baseline and current ms, their ratio, the
    tolerance (``max(min_tolerance, both noises)``) and a verdict: ``ok``, ``faster``
    (beyond the tolerance), ``SLOWER`` (beyond it: the gate fails) or ``new`` (no baseline).

    Example:
        >>> base = {"a": {"ms": 1.0, "noise": 0.01}, "b": {"ms": 1.0, "noise": 0.05}}
        >>> cur = {"a": {"ms": 1.03, "noise": 0.01}, "b": {"ms": 1.04, "noise": 0.01},
        ...        "c": {"ms": 2.0, "noise": 0.0}}
        >>> [(r["name"], r["verdict"]) for r in compare(base, cur)]
        [('a', 'SLOWER'), ('b', 'ok'), ('c', 'new')]
    """
    rows = []
    for name, cur in current.items():
        base = baseline.get(name)
        if base is None:
            rows.append({"name": name, "current_ms": cur["ms"], "verdict": "new"})
            continue
        ratio = cur["ms"] / base["ms"]
        tol = max(min_tolerance, base["noise"], cur["noise"])
        verdict = "SLOWER" if ratio > 1 + tol else "faster" if ratio < 1 - tol else "ok"
        rows.append({"name": name, "baseline_ms": base["ms"], "current_ms": cur["ms"],
                     "ratio": ratio, "tolerance": tol, "verdict": verdict})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The comparison as a fixed-width text table."""
    def cell(r: dict[str, Any], key: str, spec: str) -> str:
        width = int(spec.split(".")[0])
        return format(r[key], spec) if key in r else f"{'-':>{width}}"

    width = max([len(r["name"]) for r in rows] + [13])
    lines = [f"{'configuration':<{width}}  {'baseline ms':>11}  {'current ms':>10}  "
             f"{'ratio':>6}  {'tol':>5}  verdict"]
    lines += [f"{r['name']:<{width}}  {cell(r, 'baseline_ms', '11.4f')}  "
              f"{cell(r, 'current_ms', '10.4f')}  {cell(r, 'ratio', '6.3f')}  "
              f"{cell(r, 'tolerance', '5.1%')}  {r['verdict']}" for r in rows]
    return "\n".join(lines)


def exit_code(rows: list[dict[str, Any]]) -> int:
    """1 if any configuration is slower beyond its tolerance, else 0.

    Example:
        >>> exit_code([{"verdict": "ok"}, {"verdict": "faster"}])
        0
        >>> exit_code([{"verdict": "ok"}, {"verdict": "SLOWER"}])
        1
    """
    return int(any(r["verdict"] == "SLOWER" for r in rows))


def select(configs: list[Config], only: list[str] | None, exact: list[str] | None
           ) -> list[Config]:
    """The configurations whose name contains one of ``only`` (all if None), or is one of
    ``exact``.

    Example:
        >>> [c.name for c in select(CONFIGS, ["simple_add"], None)]
        ['simple_add f32 2^24', 'simple_add bf16 2^24']
        >>> [c.name for c in select(CONFIGS, None, ["rms_norm f32 4096x4096"])]
        ['rms_norm f32 4096x4096']
    """
    if exact is not None:
        unknown = sorted(set(exact) - {c.name for c in configs})
        if unknown:
            raise SystemExit(f"gate: unknown configuration(s) {unknown}")
        return [c for c in configs if c.name in exact]
    chosen = [c for c in configs if only is None or any(o in c.name for o in only)]
    if not chosen:
        raise SystemExit(f"gate: no configuration matches --only {only}")
    return chosen


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="record this run as the card's baseline instead of comparing")
    parser.add_argument("--card", help="results folder name (default: from nvidia-smi)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="folder holding <card>/gate.json (default: %(default)s)")
    parser.add_argument("--out", type=Path,
                        help="also write this run's times and the comparison here (JSON)")
    parser.add_argument("--only", nargs="+", metavar="TEXT",
                        help="only configurations whose name contains one of these")
    parser.add_argument("--exact", nargs="+", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--raw-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median taken)")
    parser.add_argument("--budget", type=float, default=0.25,
                        help="seconds per configuration and round")
    parser.add_argument("--min-tolerance", type=float, default=MIN_TOLERANCE,
                        help="smallest slowdown that fails (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes: checks the script on any backend, times nothing real")
    parser.add_argument("--src", type=Path,
                        help="time the xla_kernels package under this folder (e.g. a base "
                             "commit's src/) instead of the one on the path")
    parser.add_argument("--no-prebuild", action="store_true",
                        help="build each kernel on first use instead of all at once first")
    parser.add_argument("--list", action="store_true", help="print the configurations")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.budget <= 0:
        parser.error("--rounds must be >= 1 and --budget > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.src:  # before anything imports xla_kernels
        args.src = args.src.resolve()
        sys.path.insert(0, str(args.src))
    configs = select(CONFIGS, args.only, args.exact)
    if args.list:
        for c in configs:
            print(c.name + "".join(f"  [{k}={v}]" for k, v in c.env))
        return 0
    if args.raw_out:  # a child of measure_in_child
        args.raw_out.write_text(json.dumps(measure(configs, args.rounds, args.budget,
                                                   args.smoke)))
        return 0
    card = args.card or detect_card()
    path = args.results / card / "gate.json"
    if not args.write and not path.exists():
        print(f"gate: no baseline at {path}; record one with --write", file=sys.stderr)
        return 2
    began = time.perf_counter()
    if not (args.smoke or args.no_prebuild):
        prebuild(args.src)
    import xla_kernels
    from xla_kernels.bench import device_description

    description = device_description()
    gemms = any(c.name.startswith(("linear", "fp8_linear")) for c in configs)
    paths = (hopper_paths() if description["backend"] == "gpu" and gemms and not args.smoke
             else None)
    stored = json.loads(path.read_text()) if path.exists() else None
    if stored is not None:
        why = hopper_paths_differ(stored.get("hopper_paths"), paths)
        # A comparison, or a subset --write that keeps configurations timed with the stored
        # libraries, would mix two builds.
        if why and (not args.write or set(stored["configs"]) - {c.name for c in configs}):
            print(f"gate: {why}", file=sys.stderr)
            return 2
    if args.write and paths is not None and not all(paths.values()):
        print(f"gate: warning: recording a baseline without every Hopper path ({paths}): "
              f"CUTLASS's headers were not found when the libraries were built", file=sys.stderr)
    results = run_all(configs, args)
    record = {**description, "card": card, "package": str(Path(
                  xla_kernels.__file__).parent),
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "commit": git_commit(), "rounds": args.rounds, "budget_s": args.budget,
              "smoke": args.smoke, "hopper_paths": paths, "configs": results}
    print(f"gate: {len(results)} configurations in {time.perf_counter() - began:.0f} s")
    if args.write:
        if stored is not None:  # a subset run keeps the other configurations' baselines
            if paths is None:  # no GEMM timed here: the stored libraries' answer stands
                record["hopper_paths"] = stored.get("hopper_paths")
            record["configs"] = {**stored["configs"], **results}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        rows = compare({}, results)
        print(table(rows))
        print(f"gate: wrote {path}")
        code = 0
    else:
        baseline = stored
        rows = compare(baseline["configs"], results, args.min_tolerance)
        print(f"baseline: {path} (commit {baseline.get('commit')}, {baseline.get('date')})")
        print(table(rows))
        code = exit_code(rows)
        print("gate: " + ("FAILED, slower beyond noise: " + ", ".join(
            r["name"] for r in rows if r["verdict"] == "SLOWER") if code else "passed"))
        record["comparison"] = rows
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return code


def hopper_paths() -> dict[str, bool] | None:
    """Whether this process's linear and fp8_linear CUDA libraries have their Hopper paths
    (built with CUTLASS's headers); None for a tree that cannot say (``--src`` of an older
    tree). A library built where the headers were not found runs its other kernels, 2-3x
    slower on the GEMM configurations, without an error."""
    try:
        from xla_kernels.kernels import fp8_linear, linear

        return {"linear": linear.hopper_path_built(),
                "fp8_linear": fp8_linear.hopper_path_built()}
    except (ImportError, AttributeError):
        return None


def hopper_paths_differ(baseline: dict[str, bool] | None,
                        current: dict[str, bool] | None) -> str | None:
    """Why a comparison would time different kernels (a library with its Hopper path on one
    side only), or None (the same, or a baseline that did not record them).

    Example:
        >>> hopper_paths_differ({"linear": True, "fp8_linear": True},
        ...                     {"linear": True, "fp8_linear": False})[:60]
        "fp8_linear's baseline was timed with its Hopper path, this r"
        >>> hopper_paths_differ(None, {"linear": False, "fp8_linear": False}) is None
        True
    """
    for name, built in sorted((baseline or {}).items()):
        if current is not None and name in current and current[name] != built:
            said = {True: "with", False: "without"}
            return (f"{name}'s baseline was timed {said[built]} its Hopper path, this run's "
                    f"library is {said[current[name]]} it: build with CUTLASS's headers "
                    f"(XLA_KERNELS_CUTLASS_DIR, or the nvidia-cutlass package) on both sides, "
                    f"or record a new baseline with --write")
    return None


def git_commit() -> str | None:
    """The checkout's commit, with ``+dirty`` for uncommitted changes; None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
