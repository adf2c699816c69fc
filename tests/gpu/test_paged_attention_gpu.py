"""paged_attention's CUDA kernel against the float64 reference (GPU machine only).

Covers every dtype x head_dim x block_size x layout x GQA ratio (1, 4, 32 = MQA), softcap
and sliding windows, long contexts with small batches (many partitions, the reduce kernel),
out-of-range block ids, empty sequences, and outputs/workspace poisoned with NaN before the
call (through the eager runtime with torch CUDA tensors). Caches hold NaN in every slot the
kernel must not read.
"""

from __future__ import annotations

import functools
import itertools
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import numpy as np
import pytest

import attention_checks
from attention_checks import check, dequantized, jit_runner, run_cuda_handler, torch_tensor
from xla_kernels.kernels.paged_attention import (
    paged_attention,
    paged_attention_numpy_f64,
    workspace_size,
)
from xla_kernels.kernels.paged_attention.testing import (
    make_inputs,
    rel_error,
)

pytestmark = pytest.mark.gpu
ARGS = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")


def gpu() -> jax.Device:
    return jax.devices("gpu")[0]


run_jax = jit_runner(paged_attention, ARGS, gpu)


def reference(x: dict, **attrs) -> np.ndarray:
    return paged_attention_numpy_f64(*(x[k] for k in ARGS), **attrs)


HEADS = [(8, 8), (8, 2), (32, 1)]
FULL = list(itertools.product(("bf16", "f16", "f32"), (64, 128, 256), (16, 32, 64),
                              ("vllm", "pallas"), HEADS))


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads", FULL)
def test_cuda_matches_float64(rng, dtype, head_dim, block_size, layout, heads):
    hq, hkv = heads
    x = make_inputs(rng, num_seqs=5, num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                    block_size=block_size, dtype=dtype, layout=layout, max_context=700)
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    check(run_jax(x, scale=scale, layout=layout), reference(x, scale=scale, layout=layout),
          dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("softcap,window", [(5.0, 0), (0.0, 1), (0.0, 100), (30.0, 333),
                                            (0.0, 10**9)])
def test_softcap_and_sliding_window(rng, dtype, layout, softcap, window):
    x = make_inputs(rng, num_seqs=6, num_q_heads=16, num_kv_heads=4, head_dim=128,
                    block_size=16, dtype=dtype, layout=layout, max_context=1500,
                    sliding_window=window)
    attrs = dict(scale=0.2, softcap=softcap, sliding_window=window, layout=layout)
    check(run_jax(x, **attrs), reference(x, **attrs), dtype)


# (dtype, head_dim, (q heads, kv heads), seq_lens): contexts split over many partitions
# (the reduce kernel). At head_dim 128 two long sequences in every dtype; at 64 and 256 a
# long one next to a short one the main kernel finishes alone, and with 4 / 1 heads (two
# (sequence, kv head) pairs) the long one takes all 64 partitions, so at head_dim 256 the
# reduce kernel's second round (past 32) runs.
LONG_CONTEXTS = [
    *((dtype, 128, heads, [32768, 20001]) for dtype in ("bf16", "f16", "f32")
      for heads in ((32, 8), (32, 32), (32, 1), (12, 4))),
    *(("bf16", head_dim, heads, [32768, 40]) for head_dim in (64, 256)
      for heads in ((32, 8), (4, 1))),
]


@pytest.mark.parametrize("dtype,head_dim,heads,seq_lens", LONG_CONTEXTS)
def test_long_context_small_batch(rng, dtype, head_dim, heads, seq_lens):
    hq, hkv = heads
    x = make_inputs(rng, num_seqs=len(seq_lens), num_q_heads=hq, num_kv_heads=hkv,
                    head_dim=head_dim, block_size=16, dtype=dtype, seq_lens=seq_lens,
                    max_context=max(seq_lens), poison=False)
    check(run_jax(x, scale=0.0884), reference(x, scale=0.0884), dtype)


@pytest.mark.parametrize("num_seqs", [1, 3, 130])
def test_batch_sizes_and_ragged(rng, num_seqs):
    x = make_inputs(rng, num_seqs=num_seqs, num_q_heads=8, num_kv_heads=2, head_dim=128,
                    block_size=32, dtype="bf16", max_context=4000, poison=num_seqs < 100)
    check(run_jax(x, scale=0.1), reference(x, scale=0.1), "bf16")


def test_out_of_range_ids_and_empty_rows(rng):
    x = make_inputs(rng, num_seqs=6, num_q_heads=8, num_kv_heads=2, head_dim=64,
                    block_size=16, dtype="bf16", seq_lens=[0, -3, 1000, 700, 10**7, 64],
                    max_context=1024, poison=False)
    bt = x["block_tables"]
    nb = x["key_cache"].shape[0]
    bt[2, 5] = -1
    bt[2, 40] = nb
    bt[3, ::3] = 2**31 - 1
    bt[5, :] = -(2**31)  # every token masked
    out = run_jax(x, scale=0.125)
    ref = reference(x, scale=0.125)
    assert np.all(out[[0, 1, 5]] == 0)
    check(out, ref, "bf16")


def test_deterministic(rng):
    x = make_inputs(rng, num_seqs=4, num_q_heads=32, num_kv_heads=8, head_dim=128,
                    block_size=16, dtype="bf16", max_context=9000, poison=False)
    a, b = run_jax(x, scale=0.1), run_jax(x, scale=0.1)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seq_lens", [[20000, 7777], [2048] * 32])
def test_chained_calls_see_each_others_results(rng, seq_lens):
    """Kernels launched with programmatic dependent launch (PDL) may start before the
    previous kernel ends; each must still see its inputs complete. Four calls in one jitted
    program, each query made from the previous output by an XLA op (so the main kernel,
    the reduce kernel when there are several partitions, and XLA's kernels alternate), with
    XLA's default command buffers; every step is checked against the float64 reference on
    the query it was given."""
    x = make_inputs(rng, num_seqs=len(seq_lens), num_q_heads=32, num_kv_heads=8,
                    head_dim=128, block_size=16, dtype="bf16", seq_lens=seq_lens,
                    max_context=max(seq_lens), poison=False)

    def chain(q, *rest):
        outs = []
        for _ in range(4):
            o = paged_attention(q, *rest, scale=0.0884)
            outs.append(o)
            q = (o * 3.0 + q).astype(q.dtype)
        return outs

    args = [jax.device_put(x[k], gpu()) for k in ARGS]
    outs = [np.asarray(o) for o in jax.jit(chain)(*args)]
    q = x["query"]
    for i, out in enumerate(outs):
        ref = paged_attention_numpy_f64(q, *(x[k] for k in ARGS[1:]), scale=0.0884)
        check(out.astype(np.float32), ref, "bf16", f"step {i}")
        q = (out.astype(np.float32) * 3.0 + q.astype(np.float32)).astype(q.dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("seq_lens", [[1, 5000, 33, 640], [20000]])
def test_poisoned_output_and_workspace_fully_written(rng, dtype, seq_lens):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    x = make_inputs(rng, num_seqs=len(seq_lens), num_q_heads=16, num_kv_heads=4,
                    head_dim=128, block_size=16, dtype=dtype, seq_lens=seq_lens)
    q = x["query"]
    n = workspace_size(q.shape[0], q.shape[1], q.shape[2], x["block_tables"].shape[1] * 16)
    got = run_cuda_handler(paged_attention, [torch_tensor(x[k], "cuda") for k in ARGS], n,
                           dict(scale=0.1))
    check(got, reference(x, scale=0.1), dtype, "eager")


# ------------------------------------------------------------------ fp8 KV cache

FP8_FULL = list(itertools.product(("bf16", "f16"), (64, 128, 256), (16, 32, 64),
                                  ("vllm", "pallas"), HEADS))


fp8_inputs = functools.partial(attention_checks.fp8_inputs, make_inputs)


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads", FP8_FULL)
def test_fp8_cuda_matches_float64_of_the_dequantized_cache(rng, dtype, head_dim, block_size,
                                                           layout, heads):
    hq, hkv = heads
    x, scales = fp8_inputs(rng, dtype=dtype, num_seqs=5, num_q_heads=hq, num_kv_heads=hkv,
                           head_dim=head_dim, block_size=block_size, layout=layout,
                           max_context=700)
    attrs = dict(scale=float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim), layout=layout, **scales)
    check(run_jax(x, **attrs), reference(x, **attrs), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp8_error_no_worse_than_the_bf16_kernel_on_the_dequantized_cache(rng, dtype, head_dim):
    """Power-of-two scales make the dequantized cache exact in bf16/f16, so the bf16/f16
    kernel can run on the very values the fp8 kernel reads: the fp8 kernel's error against
    float64 must not exceed it (up to summation order: 1.2x)."""
    x, scales = fp8_inputs(rng, dtype=dtype, scales=(2.0**-5, 2.0**-6), num_seqs=8,
                           num_q_heads=32, num_kv_heads=8, head_dim=head_dim, block_size=16,
                           max_context=3000)
    attrs = dict(scale=head_dim**-0.5, **scales)
    ref = reference(x, **attrs)
    fp8_err = rel_error(run_jax(x, **attrs), ref)
    deq, plain = dequantized(x, attrs, "query")
    same_err = rel_error(run_jax(deq, **plain), ref)
    print(f"fp8 {fp8_err:.3g} vs {dtype} {same_err:.3g}")
    assert fp8_err <= 1.2 * same_err + 1e-6, (fp8_err, same_err)


def test_fp8_bf16_query_rows_past_the_f16_range(rng):
    """One CTA's q heads span 3e5 (past f16's 65504) to 2^-100, and rows mix 3e5 with 1e-3:
    the fp8 core runs its MMAs in f16 (bf16 rows staged as f16 times a power of two per
    row), and the result is still that of the float64 oracle."""
    x, scales = fp8_inputs(rng, dtype="bf16", num_seqs=3, num_q_heads=16, num_kv_heads=2,
                           head_dim=128, block_size=16, max_context=600)
    q = x["query"].astype(np.float32)
    mags = np.array([3e5, 1e5, 7e4, 1.0, 1e-3, 1e-30, 2.0**-100, 5e4] * 2)
    q *= mags[None, :, None]
    q[:, 8, ::2] = 1e-3                 # one row: 3e5 next to 1e-3 (2^-28 of the largest)
    q[:, 8, 1::2] = 3e5
    x["query"] = q.astype(x["query"].dtype)
    attrs = dict(scale=2e-6, **scales)
    check(run_jax(x, **attrs), reference(x, **attrs), "bf16")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("softcap,window", [(5.0, 0), (0.0, 1), (0.0, 100), (30.0, 333)])
def test_fp8_softcap_and_sliding_window(rng, dtype, layout, softcap, window):
    x, scales = fp8_inputs(rng, dtype=dtype, num_seqs=6, num_q_heads=16, num_kv_heads=4,
                           head_dim=128, block_size=16, layout=layout, max_context=1500,
                           sliding_window=window)
    attrs = dict(scale=0.2, softcap=softcap, sliding_window=window, layout=layout, **scales)
    check(run_jax(x, **attrs), reference(x, **attrs), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("heads", [(32, 8), (32, 32), (32, 1), (12, 4)])
def test_fp8_long_context_small_batch(rng, dtype, heads):
    """Many partitions: the reduce kernel applies v_scale."""
    hq, hkv = heads
    x, scales = fp8_inputs(rng, dtype=dtype, num_seqs=2, num_q_heads=hq, num_kv_heads=hkv,
                           head_dim=128, block_size=16, seq_lens=[32768, 20001],
                           max_context=32768, poison=False)
    attrs = dict(scale=0.0884, **scales)
    check(run_jax(x, **attrs), reference(x, **attrs), dtype)


def test_fp8_out_of_range_ids_and_empty_rows(rng):
    x, scales = fp8_inputs(rng, dtype="bf16", num_seqs=6, num_q_heads=8, num_kv_heads=2,
                           head_dim=64, block_size=16, seq_lens=[0, -3, 1000, 700, 10**7, 64],
                           max_context=1024, poison=False)
    bt = x["block_tables"]
    bt[2, 5] = -1
    bt[2, 40] = x["key_cache"].shape[0]
    bt[3, ::3] = 2**31 - 1
    bt[5, :] = -(2**31)
    out = run_jax(x, scale=0.125, **scales)
    assert np.all(out[[0, 1, 5]] == 0)
    check(out, reference(x, scale=0.125, **scales), "bf16")


def test_fp8_deterministic(rng):
    x, scales = fp8_inputs(rng, dtype="bf16", num_seqs=4, num_q_heads=32, num_kv_heads=8,
                           head_dim=128, block_size=16, max_context=9000, poison=False)
    a, b = run_jax(x, scale=0.1, **scales), run_jax(x, scale=0.1, **scales)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("seq_lens", [[1, 5000, 33, 640], [20000]])
def test_fp8_poisoned_output_and_workspace_through_torch(rng, dtype, seq_lens):
    """torch float8_e4m3fn CUDA tensors through the torch operator, and the handler writing
    into NaN-filled output and workspace."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    from xla_kernels.frontends.torch import torch_op

    x, scales = fp8_inputs(rng, dtype=dtype, num_seqs=len(seq_lens), num_q_heads=16,
                           num_kv_heads=4, head_dim=128, block_size=16, seq_lens=seq_lens)
    ins = [torch_tensor(x[k], "cuda") for k in ARGS]
    ref = reference(x, scale=0.1, **scales)
    got = torch_op(paged_attention)(*ins, scale=0.1, **scales)
    check(got.float().cpu().numpy(), ref, dtype, "torch op")
    q = x["query"]
    n = workspace_size(q.shape[0], q.shape[1], q.shape[2], x["block_tables"].shape[1] * 16)
    check(run_cuda_handler(paged_attention, ins, n, dict(scale=0.1, **scales)), ref, dtype,
          "eager")


def _kernel_ms_per_call(attrs: dict, args: list, calls: int = 16, programs: int = 3) -> float:
    """ms per call of ``calls`` chained calls inside one jitted program (each query is the
    previous output, so none can be skipped), ``programs`` runs queued back to back: the
    median interval from one call's main kernel end to the next one's, from CUPTI kernel
    timestamps (torch.profiler, as ``benchmarks/decode_trace.py`` reports the goal). That
    is the GPU's time per call, reduce kernel and launch gaps included, with no host
    timing in it: host-timed windows (8 programs, one wait) read 1.72-1.79x where these
    timestamps gave 1.82-1.87x on the same H100 (c189213), and one configuration's bf16
    time once moved 0.120 -> 0.214 ms between two rounds."""
    from pathlib import Path

    from xla_kernels.bench import load_script

    trace = load_script(Path(__file__).parents[2] / "benchmarks" / "decode_trace.py")

    def chain(q, *rest):
        for _ in range(calls):
            q = paged_attention(q, *rest, scale=0.0884, **attrs)
        return q

    fn = jax.jit(chain)
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    summary = trace.summarize(
        trace.record(lambda: jax.block_until_ready([fn(*args) for _ in range(programs)])),
        trace.MAIN_KERNEL)
    assert "error" not in summary, summary
    assert summary["main"]["count"] == calls * programs, summary["main"]
    return summary["main"]["end_to_end_us"]["median"] / 1e3


@pytest.mark.parametrize("num_seqs,context,heads", [(32, 2048, (32, 8)), (32, 4096, (32, 8)),
                                                    (8, 32768, (32, 8)), (4, 8192, (32, 32))])
def test_fp8_decode_is_at_least_1_8x_bf16_decode(rng, num_seqs, context, heads):
    """Issue 12's goal, on configurations whose bf16 KV read is >= 256 MB: the fp8 kernel
    (half the bytes) at least 1.8x the bf16 kernel, by kernel timestamps
    (:func:`_kernel_ms_per_call`). Prints both times."""
    hq, hkv = heads
    kw = dict(num_seqs=num_seqs, num_q_heads=hq, num_kv_heads=hkv, head_dim=128, block_size=16,
              seq_lens=[context] * num_seqs, max_context=context, extra_blocks=0, poison=False)
    x = make_inputs(rng, dtype="bf16", **kw)
    x8, scales = fp8_inputs(rng, dtype="bf16", scales=(0.05, 0.05), **kw)
    assert x["key_cache"].nbytes * 2 >= 256 * 2**20
    times = {}
    for name, data, attrs in (("bf16", x, {}), ("fp8", x8, scales)):
        times[name] = _kernel_ms_per_call(attrs, [jax.device_put(data[k], gpu()) for k in ARGS])
    speedup = times["bf16"] / times["fp8"]
    print(f"{num_seqs} x {context}, {hq}/{hkv} heads: bf16 {times['bf16']:.4f} ms, fp8 "
          f"{times['fp8']:.4f} ms, {speedup:.2f}x")
    assert speedup >= 1.8, times
