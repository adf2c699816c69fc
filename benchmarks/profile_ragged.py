"""One profiled call each of our ragged_paged_attention kernels and the peers, for Nsight tools.

For each configuration (names of :mod:`ragged_paged_attention`'s matrices, e.g.
``"prefill 4x4096"``) it builds the data, compiles and warms up every variant (``ours``: the
wgmma kernel on sm_90a; ``ours_mma``: the mma.sync kernel; ``fa3``: FlashAttention-3's
paged call when importable; ``cudnn_dense``: cuDNN's dense causal flash attention on a fresh
prefill's dense K/V), then runs each once between ``cuProfilerStart`` and
``cuProfilerStop``. Run it under ``ncu --profile-from-start off`` (only those calls'
kernels are profiled) or ``nsys profile --capture-range=cudaProfilerApi``.

Example (on the GPU machine):
    $ ncu --profile-from-start off --set full -o ragged \\
        python benchmarks/profile_ragged.py --configs "prefill 4x4096"
"""

from __future__ import annotations

import argparse
import ctypes
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", required=True,
                        help='config names as in ragged_paged_attention.py, e.g. "prefill 4x4096"')
    parser.add_argument("--variants", default="ours,ours_mma,fa3",
                        help="comma-separated subset of ours, ours_mma, fa3, cudnn_dense")
    args = parser.parse_args()
    from xla_kernels.bench import load_script

    rb = load_script(Path(__file__).with_name("ragged_paged_attention.py"))
    from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention

    cuda = ctypes.CDLL("libcuda.so.1")
    known = {c["name"]: c for c in rb.matrix(quick=False) + rb.dense_matrix(quick=False)}
    peers = {"fa3": rb.fa3_impl, "cudnn_dense": rb.cudnn_dense_impl}
    wanted = args.variants.split(",")
    for name in args.configs:
        cfg = known[name]
        x = rb.make_data(cfg, np.random.default_rng(0))
        attrs = rb.attrs(cfg)
        calls: dict[str, Any] = {}
        for variant in wanted:
            if variant in peers:
                impl = peers[variant](cfg)
                if impl is None:
                    print(f"{variant}: not available for {name}", flush=True)
                    continue

                def fn(d: dict[str, Any], impl: Any = impl) -> Any:
                    return impl(d, 0)
            else:
                # The kernel choice is read at launch (and recorded in XLA's command
                # buffer on the first run): set for the warm-up and the profiled call.
                os.environ["XLA_KERNELS_RAGGED_WGMMA"] = "0" if variant == "ours_mma" else "1"

                def fn(d: dict[str, Any], kw: dict[str, Any] = attrs) -> Any:
                    return ragged_paged_attention(d["queries"][0],
                                                  *(d[k] for k in rb.OURS_ARGS[1:]), **kw)
            jitted = jax.jit(fn)
            jax.block_until_ready(jitted(x))  # compile + warm-up with this environment
            jax.block_until_ready(jitted(x))
            calls[variant] = jitted
        for variant, jitted in calls.items():
            os.environ["XLA_KERNELS_RAGGED_WGMMA"] = "0" if variant == "ours_mma" else "1"
            cuda.cuProfilerStart()
            jax.block_until_ready(jitted(x))
            cuda.cuProfilerStop()
            print(f"profiled {variant} {name}", flush=True)


if __name__ == "__main__":
    main()
