"""The main job: build, register and run real kernels, show the custom-call, check, time.

Runs on the GPU when JAX sees one, else on the host CPU. ``make demo`` runs it.

Example:
    $ python -m xla_kernels.demo
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import device_description, pipelined_seconds
from xla_kernels.hlo import assert_single_custom_call, hlo_text
from xla_kernels.kernels.paged_attention import (
    paged_attention,
    paged_attention_numpy_f64,
    paged_attention_xla,
)
from xla_kernels.kernels.paged_attention.testing import make_inputs, rel_error
from xla_kernels.kernels.simple_add import simple_add


def _xla_add(a: jax.Array, b: jax.Array) -> jax.Array:
    return a + b


def run_paged_attention(on_gpu: bool, iters: int) -> dict:
    """Decode paged attention: check against float64, show the custom-call, time vs XLA."""
    config = (dict(num_seqs=32, context=2048, num_q_heads=32, num_kv_heads=8, head_dim=128,
                   block_size=16, dtype="bf16") if on_gpu else
              dict(num_seqs=4, context=256, num_q_heads=8, num_kv_heads=2, head_dim=64,
                   block_size=16, dtype="f32"))
    c = config
    inputs = make_inputs(np.random.default_rng(), num_seqs=c["num_seqs"],
                         num_q_heads=c["num_q_heads"], num_kv_heads=c["num_kv_heads"],
                         head_dim=c["head_dim"], block_size=c["block_size"], dtype=c["dtype"],
                         seq_lens=[c["context"]] * c["num_seqs"])
    scale = float(c["head_dim"]) ** -0.5
    args = [jnp.asarray(inputs[k]) for k in ("query", "key_cache", "value_cache",
                                             "block_tables", "seq_lens")]
    print(f"\npaged_attention decode: {c['num_seqs']} seqs x {c['context']} tokens, "
          f"{c['num_q_heads']} q / {c['num_kv_heads']} kv heads, d={c['head_dim']}, "
          f"block {c['block_size']}, {c['dtype']}")
    out = jax.jit(lambda *a: paged_attention(*a, scale=scale))(*args)
    ref = paged_attention_numpy_f64(*(inputs[k] for k in ("query", "key_cache", "value_cache",
                                                          "block_tables", "seq_lens")),
                                    scale=scale)
    err = rel_error(out, ref)
    print(f"relative error vs float64 reference: {err:.2e}")
    if not err < (2e-2 if c["dtype"] == "bf16" else 1e-5):
        raise SystemExit("paged_attention disagrees with the float64 reference")
    call = assert_single_custom_call(hlo_text(lambda *a: paged_attention(*a, scale=scale), *args),
                                     paged_attention.target)
    print(f"optimized HLO: {call.line[:160]}...")
    kv_bytes = 2 * c["num_seqs"] * c["context"] * c["num_kv_heads"] * c["head_dim"] * \
        args[1].dtype.itemsize
    t_ours = pipelined_seconds(lambda *a: paged_attention(*a, scale=scale), *args, repeats=iters)
    t_xla = pipelined_seconds(lambda *a: paged_attention_xla(*a, scale=scale), *args,
                            repeats=iters)
    print(f"{'implementation':<24}{'median ms':>12}{'KV GB/s':>10}")
    print(f"{'xla-kernels':<24}{t_ours * 1e3:>12.4f}{kv_bytes / t_ours / 1e9:>10.1f}")
    print(f"{'plain XLA gather+einsum':<24}{t_xla * 1e3:>12.4f}{kv_bytes / t_xla / 1e9:>10.1f}")
    print(ratio_line(f"speed-up over plain XLA: {t_xla / t_ours:.2f}x", on_gpu))
    return {**c, "kv_bytes": kv_bytes, "rel_error": err,
            "median_ms": {"xla_kernels": t_ours * 1e3, "xla_gather_einsum": t_xla * 1e3},
            "speedup_vs_xla": t_xla / t_ours}


CPU_CAVEAT = ("  (CPU: the kernels are untuned references and timings on a shared CPU vary "
              "several-fold between runs; this ratio says nothing about speed)")


def ratio_line(line: str, on_gpu: bool) -> str:
    """A printed speed ratio, with the CPU caveat where it is not a GPU measurement.

    Example:
        >>> print(ratio_line("speed-up: 2.00x", on_gpu=False))  # doctest: +ELLIPSIS
        speed-up: 2.00x
          (CPU: the kernels are untuned references and timings on a shared CPU vary ...)
    """
    return line if on_gpu else f"{line}\n{CPU_CAVEAT}"


def run(size_log2: int, iters: int) -> dict:
    """Run the demo; returns the measured numbers."""
    info = device_description()
    print(f"xla-kernels demo on {info['backend']} ({info['device']}), jax {info['jax']}")

    small = simple_add(jnp.array([1.0, 2.0, 3.0]), jnp.array([4.0, 5.0, 6.0]))
    print(f"simple_add([1, 2, 3], [4, 5, 6]) = {small.tolist()}")
    assert small.tolist() == [5.0, 7.0, 9.0], small

    n = 1 << size_log2
    rng = np.random.default_rng()
    a_host = rng.standard_normal(n, dtype=np.float32)
    b_host = rng.standard_normal(n, dtype=np.float32)
    a, b = jnp.asarray(a_host), jnp.asarray(b_host)
    call = assert_single_custom_call(hlo_text(simple_add, a, b), simple_add.target)
    print(f"optimized HLO: {call.line[:200]}")

    out = np.asarray(jax.jit(simple_add)(a, b))
    max_err = float(np.max(np.abs(out.astype(np.float64) - (a_host.astype(np.float64)
                                                               + b_host.astype(np.float64)))))
    ok = np.array_equal(out, a_host + b_host)
    print(f"2^{size_log2} random f32: {'bitwise equal to' if ok else 'DIFFERS from'} NumPy's "
          f"f32 sum; max |error| vs the float64 sum = {max_err:.3g} (f32 rounding)")
    if not ok:
        raise SystemExit("simple_add disagrees with NumPy")

    bytes_moved = 3 * n * 4
    t_ours = pipelined_seconds(simple_add, a, b, repeats=iters)
    t_xla = pipelined_seconds(_xla_add, a, b, repeats=iters)
    gbs_ours, gbs_xla = bytes_moved / t_ours / 1e9, bytes_moved / t_xla / 1e9
    print(f"{'implementation':<24}{'median ms':>12}{'GB/s':>10}")
    print(f"{'xla-kernels simple_add':<24}{t_ours * 1e3:>12.4f}{gbs_ours:>10.1f}")
    print(f"{'XLA a + b':<24}{t_xla * 1e3:>12.4f}{gbs_xla:>10.1f}")
    print(ratio_line(f"ratio (ours / XLA bandwidth): {gbs_ours / gbs_xla:.3f}",
                     info["backend"] == "gpu"))
    simple = {"elements": n, "dtype": "f32", "bytes_moved": bytes_moved,
              "median_ms": {"xla_kernels": t_ours * 1e3, "xla_add": t_xla * 1e3},
              "gb_per_s": {"xla_kernels": gbs_ours, "xla_add": gbs_xla},
              "bandwidth_ratio": gbs_ours / gbs_xla, "exact": ok}
    attention = run_paged_attention(info["backend"] == "gpu", iters)
    return {**info, "simple_add": simple, "paged_attention": attention}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = jax.default_backend() == "gpu"
    parser.add_argument("--size-log2", type=int, default=26 if on_gpu else 22)
    parser.add_argument("--iters", type=int, default=30 if on_gpu else 5,
                        help="timed repeats of 50 queued calls (median taken)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    result = run(args.size_log2, args.iters)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
