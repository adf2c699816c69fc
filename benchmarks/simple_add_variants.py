"""simple_add's compile-time tuning knobs against XLA's add, side by side in one run.

Each variant is the shipped kernel source built with other ``-D`` values, declared as
its own op. Prints one table; ``--out`` also writes it as JSON.

Example:
    $ python benchmarks/simple_add_variants.py --out /tmp/variants
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import pipelined_seconds
from xla_kernels.kernels.simple_add import simple_add

VARIANTS = {
    "unroll1": {},  # the shipped default
    "unroll4": {"XK_SIMPLE_ADD_UNROLL": "4"},
    "unroll4_streaming": {"XK_SIMPLE_ADD_UNROLL": "4", "XK_SIMPLE_ADD_STREAMING": "1"},
    "unroll2_streaming": {"XK_SIMPLE_ADD_UNROLL": "2", "XK_SIMPLE_ADD_STREAMING": "1"},
    "unroll8_streaming": {"XK_SIMPLE_ADD_UNROLL": "8", "XK_SIMPLE_ADD_STREAMING": "1"},
}


def variant(name: str, defines: dict[str, str]):
    kernel = dataclasses.replace(simple_add.kernels["cuda"], defines=defines)
    return type(simple_add)(f"xla_kernels_variants.simple_add_{name}", inputs=simple_add.inputs,
                            outputs=simple_add.output_rule, kernels={"cuda": kernel},
                            vmap_method=simple_add.vmap_method)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    rows = []
    for log2 in (24, 26, 28):
        for dtype in (jnp.float32, jnp.bfloat16):
            rng = np.random.default_rng(log2)
            a = jnp.asarray(rng.standard_normal(1 << log2), dtype)
            b = jnp.asarray(rng.standard_normal(1 << log2), dtype)
            nbytes = 3 * a.size * a.dtype.itemsize
            row = {"size_log2": log2, "dtype": str(a.dtype)}
            row["xla_gbs"] = nbytes / pipelined_seconds(lambda x, y: x + y, a, b,
                                                        repeats=args.repeats) / 1e9
            for name, defines in VARIANTS.items():
                op = variant(name, defines)
                assert np.array_equal(np.asarray(jax.jit(op)(a, b)), np.asarray(a + b))
                row[name] = nbytes / pipelined_seconds(op, a, b, repeats=args.repeats) / 1e9
            rows.append(row)
            print(" ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "simple_add_variants.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
