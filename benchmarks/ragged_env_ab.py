"""A/B timing of ragged_paged_attention under environment variants, FA3 alongside.

The kernel reads ``XLA_KERNELS_RAGGED_WGMMA`` (its choice of the Hopper or the mma.sync kernel)
at every launch, and XLA records the launch in its command buffer on a program's first run,
so each variant gets a freshly jitted program, compiled and first run with its environment
set. Every variant (and FlashAttention-3's paged call, where it applies) is timed twice,
interleaved, on the same data: the spread of the two is the run-to-run noise. Prints one
JSON line per configuration, in TFLOP/s.

Example (on the GPU machine):
    $ python benchmarks/ragged_env_ab.py --configs "prefill 4x4096,chunked 8x512 of 8192" \\
        --variants "wgmma:;mma:XLA_KERNELS_RAGGED_WGMMA=0"
    prefill 4x4096 {"wgmma": [..., ...], "mma": [..., ...], "fa3": [..., ...]}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np


def parse_variants(spec: str) -> dict[str, dict[str, str]]:
    """``"name:VAR=value,VAR=value;name2:..."`` as {name: {VAR: value}}.

    Example:
        >>> parse_variants("base:;mma:XLA_KERNELS_RAGGED_WGMMA=0")
        {'base': {}, 'mma': {'XLA_KERNELS_RAGGED_WGMMA': '0'}}
    """
    variants: dict[str, dict[str, str]] = {}
    for part in spec.split(";"):
        name, _, env = part.partition(":")
        variants[name.strip()] = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", required=True,
                        help="comma-separated names of ragged_paged_attention.py's matrix")
    parser.add_argument("--variants", default="ours:",
                        help='"name:VAR=value,...;name2:..." (default: one, unchanged)')
    parser.add_argument("--budget", type=float, default=0.4, help="seconds per timing")
    args = parser.parse_args()
    from xla_kernels.bench import budgeted_seconds, environment, load_script
    from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention

    rb = load_script(Path(__file__).with_name("ragged_paged_attention.py"))
    known = {c["name"]: c for c in rb.matrix(quick=False)}
    variants = parse_variants(args.variants)
    switches = {k for env in variants.values() for k in env}
    for name in args.configs.split(","):
        cfg = known[name.strip()]
        x = rb.make_data(cfg, np.random.default_rng(0))
        flops, _ = rb.work(cfg)
        kw = rb.attrs(cfg)
        fa3 = rb.fa3_impl(cfg) if cfg["head_dim"] <= 128 else None
        tflops: dict[str, list[float]] = {}
        for _ in range(2):
            for vname, env in variants.items():

                def call(d: dict[str, Any], kw: dict[str, Any] = kw) -> Any:
                    return ragged_paged_attention(*(d[k] for k in rb.OURS_ARGS), **kw)

                # The variant's switches set, the others unset, for this timing only.
                with environment(**{k: env.get(k) for k in switches}):
                    sec = budgeted_seconds(jax.jit(call), (x,), args.budget)
                tflops.setdefault(vname, []).append(round(flops / sec / 1e12, 1))
            if fa3 is not None:
                sec = budgeted_seconds(jax.jit(fa3), (x,), args.budget)
                tflops.setdefault("fa3", []).append(round(flops / sec / 1e12, 1))
        print(name.strip(), json.dumps(tflops), flush=True)


if __name__ == "__main__":
    main()
