"""simple_add against XLA's own fused add, side by side, across sizes and dtypes.

Writes ``simple_add.json`` and ``simple_add.md`` to ``--out``.

Example:
    $ python benchmarks/simple_add.py --out benchmarks/results/latest/h100
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels import dtypes
from xla_kernels.bench import copy_bandwidth_gbs, device_description, pipelined_seconds
from xla_kernels.kernels.simple_add import simple_add


def measure(size_log2: int, dtype: str, iters: int) -> dict:
    n = 1 << size_log2
    rng = np.random.default_rng(size_log2)
    np_dtype = dtypes.to_numpy(dtype)
    a = jnp.asarray(rng.standard_normal(n).astype(np_dtype))
    b = jnp.asarray(rng.standard_normal(n).astype(np_dtype))
    assert np.array_equal(np.asarray(jax.jit(simple_add)(a, b)), np.asarray(a + b))
    nbytes = 3 * n * np_dtype.itemsize
    ours = pipelined_seconds(simple_add, a, b, repeats=iters)
    xla = pipelined_seconds(lambda x, y: x + y, a, b, repeats=iters)
    return {"size_log2": size_log2, "dtype": dtype, "bytes": nbytes,
            "ours_ms": ours * 1e3, "xla_ms": xla * 1e3,
            "ours_gbs": nbytes / ours / 1e9, "xla_gbs": nbytes / xla / 1e9,
            "ratio_xla_over_ours_time": xla / ours}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=30,
                        help="timed repeats of 50 queued calls (median taken)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy_gbs = copy_bandwidth_gbs()
    rows = [measure(s, d, args.iters) for d in ("f32", "bf16", "f16") for s in (16, 20, 24, 26, 28)]
    for r in rows:
        r["ours_fraction_of_copy"] = r["ours_gbs"] / copy_gbs
    result = {**device_description(), "date": datetime.date.today().isoformat(),
              "copy_gbs": copy_gbs, "rows": rows}
    (args.out / "simple_add.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# simple_add vs XLA add — {result['device']}, jax {result['jax']}, "
             f"{result['date']}", "", f"Device copy bandwidth (read+write): {copy_gbs:.0f} GB/s",
             "", "| dtype | elements | ours ms | XLA ms | ours GB/s | XLA GB/s | XLA time / ours "
             "| ours / copy bw |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | 2^{r['size_log2']} | {r['ours_ms']:.4f} | {r['xla_ms']:.4f} | "
              f"{r['ours_gbs']:.0f} | {r['xla_gbs']:.0f} | {r['ratio_xla_over_ours_time']:.3f} | "
              f"{r['ours_fraction_of_copy']:.1%} |" for r in rows]
    (args.out / "simple_add.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
