"""ragged_paged_attention on the CPU: the CPU kernel, the plain-XLA fallback and the torch
eager path against the float64 oracle.

Every check draws fresh random inputs (the ``rng`` fixture prints its seed), poisons every
cache slot no query row attends with NaN, and, for the kernel called eagerly, fills the
output with NaN before the call, so padding rows must be written (zeros) and unattended
slots must never be read.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

import xla_kernels as xk
from attention_checks import (
    assert_refused,
    check,
    dequantized,
    fp8_bad_calls,
    handler_attrs,
    jit_runner,
    torch_tensor,
)
from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.kernels.paged_attention import paged_attention
from xla_kernels.kernels.paged_cache import FP8
from xla_kernels.kernels.ragged_paged_attention import (
    BLOCK_SIZES,
    HEAD_DIMS,
    LIMITS,
    ragged_paged_attention,
    ragged_paged_attention_numpy_f64,
    ragged_paged_attention_xla,
    sequence_bounds,
)
from xla_kernels.kernels.ragged_paged_attention.testing import (
    ARGS,
    TOLERANCES,
    garbage_metadata,
    make_inputs,
    mix,
    rel_error,
)
from xla_kernels.runtime.eager import Buffer, KernelError, call_handler
from xla_kernels.runtime.library import load_kernel

ATTRS = ("scale", "softcap", "sliding_window", "layout", "k_scale", "v_scale")


def _rets(out: np.ndarray) -> list:
    """The output and the workspace (the CUDA decode path's; the CPU kernel ignores it)."""
    return [Buffer.from_array(out), Buffer.from_array(np.zeros(1, np.float32))]


def run_cpu_kernel(x: dict, **attrs) -> np.ndarray:
    """The CPU handler called eagerly, writing into a NaN-poisoned output."""
    fn = load_kernel(ragged_paged_attention, "cpu").function
    out = np.full_like(x["queries"], np.nan)
    call_handler(fn, args=[Buffer.from_array(np.ascontiguousarray(x[k])) for k in ARGS],
                 rets=_rets(out), attrs=handler_attrs(**attrs),
                 op_name=ragged_paged_attention.name)
    return out


run_xla = jit_runner(ragged_paged_attention_xla, ARGS)


def reference(x: dict, **attrs) -> np.ndarray:
    return ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), **attrs)


def owned_rows(x: dict) -> int:
    return int(x["cu_q_lens"][int(x["num_seqs"][0])])


# A covering set: every dtype x head_dim once with each batch mix, block sizes, layouts and
# GQA ratios (1, 4, 16 = MQA) rotating through them.
HEADS = [(4, 4), (8, 2), (16, 1)]
MIXES = ["decode", "prefill", "chunks", "mixed", "primes"]
MATRIX = [
    (dtype, d, BLOCK_SIZES[i % 3], ("vllm", "pallas")[i % 2], HEADS[(i // 2) % 3],
     MIXES[i % len(MIXES)])
    for i, (dtype, d) in enumerate(itertools.product(("bf16", "f16", "f32"), HEAD_DIMS))
] + [
    ("bf16", 128, 16, "vllm", (8, 2), kind) for kind in MIXES
]


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads,kind", MATRIX)
def test_cpu_kernel_matches_float64(rng, dtype, head_dim, block_size, layout, heads, kind):
    hq, hkv = heads
    q_lens, kv_lens = mix(kind, rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=hq, num_kv_heads=hkv,
                    head_dim=head_dim, block_size=block_size, dtype=dtype, layout=layout)
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    out = run_cpu_kernel(x, scale=scale, layout=layout)
    ref = reference(x, scale=scale, layout=layout)
    check(out, ref, dtype, kind)
    assert np.all(out[owned_rows(x):] == 0), "padding rows must be zeros"


def test_long_batch_over_1000_tokens(rng):
    q_lens, kv_lens = mix("long", rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=4, num_kv_heads=1,
                    head_dim=64, block_size=64, dtype="bf16", sliding_window=300)
    assert x["queries"].shape[0] > 1000
    attrs = dict(scale=0.125, sliding_window=300)
    ref = reference(x, **attrs)
    check(run_cpu_kernel(x, **attrs), ref, "bf16", "kernel")
    check(run_xla(x, **attrs), ref, "bf16", "xla")


@pytest.mark.parametrize("dtype,layout,softcap,window", [
    ("bf16", "vllm", 5.0, 0), ("f16", "pallas", 0.0, 1), ("f32", "vllm", 0.0, 17),
    ("bf16", "pallas", 10.0, 40), ("f32", "pallas", 30.0, 10**9), ("f16", "vllm", 2.0, 64),
])
def test_softcap_and_sliding_window(rng, dtype, layout, softcap, window):
    q_lens, kv_lens = mix("mixed", rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=64, block_size=16, dtype=dtype, layout=layout,
                    sliding_window=min(window, 10**6))
    attrs = dict(scale=3.0 / 8.0, softcap=softcap, sliding_window=window, layout=layout)
    ref = reference(x, **attrs)
    check(run_cpu_kernel(x, **attrs), ref, dtype, "kernel")
    check(run_xla(x, **attrs), ref, dtype, "xla")


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads,kind", MATRIX[::2])
def test_xla_fallback_matches_float64(rng, dtype, head_dim, block_size, layout, heads, kind):
    hq, hkv = heads
    q_lens, kv_lens = mix(kind, rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=hq, num_kv_heads=hkv,
                    head_dim=head_dim, block_size=block_size, dtype=dtype, layout=layout)
    out = run_xla(x, scale=0.1, layout=layout)
    check(out, reference(x, scale=0.1, layout=layout), dtype, kind)
    assert np.all(out[owned_rows(x):] == 0)


def test_q_len_equal_kv_len_and_shuffled_tables(rng):
    """Whole prompts (q_len = kv_len, causal from position 0); blocks are shuffled."""
    x = make_inputs(rng, q_lens=[33, 1, 64, 17], kv_lens=[33, 1, 64, 17], num_q_heads=4,
                    num_kv_heads=2, head_dim=128, block_size=16, dtype="f32", extra_blocks=9)
    used = x["block_tables"][x["block_tables"] >= 0]
    assert not np.array_equal(np.sort(used), used), "blocks should be shuffled"
    ref = reference(x, scale=0.09)
    check(run_cpu_kernel(x, scale=0.09), ref, "f32")
    # Row 0 of a whole prompt attends only token 0: its output is V[token 0].
    blk = x["block_tables"][0, 0]
    np.testing.assert_allclose(ref[0, 0], x["value_cache"][blk, 0, 0], rtol=1e-12)


def test_agrees_with_paged_attention_when_every_q_len_is_1(rng):
    for dtype, layout, window in (("bf16", "vllm", 0), ("f32", "pallas", 50), ("f16", "vllm", 7)):
        lens = [1, 17, 200, 64, 33]
        x = make_inputs(rng, q_lens=[1] * 5, kv_lens=lens, num_q_heads=8, num_kv_heads=2,
                        head_dim=64, block_size=32, dtype=dtype, layout=layout, num_tokens=5,
                        max_seqs=5)
        attrs = dict(scale=0.2, softcap=0.0, sliding_window=window, layout=layout)
        ours = np.asarray(ragged_paged_attention(*(x[k] for k in ARGS), **attrs), np.float32)
        decode = np.asarray(paged_attention(x["queries"], x["key_cache"], x["value_cache"],
                                            x["block_tables"], x["kv_lens"], **attrs),
                            np.float32)
        assert rel_error(ours, decode.astype(np.float64)) <= TOLERANCES[dtype] / 4
        check(ours, reference(x, **attrs), dtype)


def test_padding_rows_and_unused_slots_give_zeros(rng):
    x = make_inputs(rng, q_lens=[3, 4], kv_lens=[10, 4], num_q_heads=2, num_kv_heads=1,
                    head_dim=64, block_size=16, dtype="bf16", num_tokens=16, max_seqs=8)
    for out in (run_cpu_kernel(x, scale=0.1), run_xla(x, scale=0.1),
                ragged_paged_attention(*(x[k] for k in ARGS), scale=0.1)):
        out = np.asarray(out, np.float32)
        assert np.all(out[7:] == 0)
        assert np.all(np.abs(out[:7]).sum(axis=-1) > 0)
        check(out, reference(x, scale=0.1), "bf16")


def test_out_of_range_block_ids_are_masked(rng):
    x = make_inputs(rng, q_lens=[5, 3, 2, 4], kv_lens=[64, 50, 33, 64], num_q_heads=8,
                    num_kv_heads=4, head_dim=64, block_size=16, dtype="f32", poison=False)
    bt = x["block_tables"]
    num_blocks = x["key_cache"].shape[0]
    bt[0, 1] = -1                      # a bad block in the middle
    bt[1, 0] = num_blocks              # first block past the end
    bt[2, 2] = 2**31 - 1               # huge id in the last, partial block
    bt[3, :] = -(2**31)                # every block bad: all masked -> zeros
    ref = reference(x, scale=0.125)
    rows3 = slice(x["cu_q_lens"][3], x["cu_q_lens"][4])
    assert np.all(ref[rows3] == 0)
    for out in (run_cpu_kernel(x, scale=0.125), run_xla(x, scale=0.125)):
        check(out, ref, "f32")
        assert np.all(np.asarray(out)[rows3] == 0)


def test_inconsistent_device_data_is_clamped(rng):
    """q_len > kv_len, decreasing cu_q_lens, cu_q_lens past num_tokens, num_seqs > max_seqs,
    negative and overlong kv_lens: defined results (sequence_bounds), no out-of-bounds."""
    x = make_inputs(rng, q_lens=[4, 6, 3, 5, 2], kv_lens=[9, 40, 30, 20, 33], num_q_heads=4,
                    num_kv_heads=2, head_dim=64, block_size=16, dtype="f32", num_tokens=22,
                    max_seqs=5, poison=False)
    cases = {
        "q_len > kv_len": dict(kv_lens=np.array([2, 40, 30, 20, 33], np.int32)),
        "decreasing cu": dict(cu_q_lens=np.array([0, 4, 10, 7, 18, 20], np.int32)),
        "cu past num_tokens": dict(cu_q_lens=np.array([0, 4, 10, 13, 40, 99], np.int32)),
        "cu starts late": dict(cu_q_lens=np.array([3, 4, 10, 13, 18, 20], np.int32)),
        "num_seqs > max_seqs": dict(num_seqs=np.array([77], np.int32)),
        "num_seqs < 0": dict(num_seqs=np.array([-3], np.int32)),
        "kv_lens out of range": dict(kv_lens=np.array([-5, 40, 10**6, 20, 33], np.int32)),
    }
    for name, edit in cases.items():
        y = dict(x, **edit)
        ref = reference(y, scale=0.125)
        for what, out in (("kernel", run_cpu_kernel(y, scale=0.125)),
                          ("xla", run_xla(y, scale=0.125))):
            check(out, ref, "f32", f"{name} ({what})")
            np.testing.assert_array_equal(np.asarray(out)[ref == 0], 0)
    # The documented outcomes, spelled out.
    ref = reference(dict(x, **cases["q_len > kv_len"]), scale=0.125)
    assert np.all(ref[:2] == 0) and np.all(np.abs(ref[2:4]).sum(-1) > 0)  # p = -2, -1, 0, 1
    assert sequence_bounds(cases["decreasing cu"]["cu_q_lens"], [5], 22) == [
        (0, 4), (4, 10), (10, 10), (10, 18), (18, 20)]
    assert sequence_bounds(cases["cu past num_tokens"]["cu_q_lens"], [5], 22)[-2:] == [
        (13, 22), (22, 22)]
    assert np.all(reference(dict(x, **cases["num_seqs < 0"]), scale=0.1) == 0)


def test_op_under_jit_and_torch_eager(rng):
    import torch

    from xla_kernels.frontends.torch import torch_op

    q_lens, kv_lens = mix("mixed", rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=128, block_size=32, dtype="bf16", layout="pallas")
    attrs = dict(scale=0.09, softcap=20.0, sliding_window=0, layout="pallas")
    ref = reference(x, **attrs)
    cpu = jax.devices("cpu")[0]
    f = jax.jit(lambda *a: ragged_paged_attention(*a, **attrs))
    out = f(*(jax.device_put(x[k], cpu) for k in ARGS))
    assert out.shape == x["queries"].shape and out.dtype == x["queries"].dtype
    check(out, ref, "bf16", "jax")

    op = torch_op(ragged_paged_attention)
    tensors = [torch.from_numpy(x[k].astype(np.float32)).to(torch.bfloat16)
               if k in ARGS[:3] else torch.from_numpy(x[k]) for k in ARGS]
    got = op(*tensors, **attrs)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == x["queries"].shape
    check(got.float().numpy(), ref, "bf16", "torch")


def test_limits_come_from_the_header():
    assert HEAD_DIMS == (64, 128, 256) and BLOCK_SIZES == (16, 32, 64, 128, 256)
    assert LIMITS["kKvTile"] == 32 and LIMITS["kWarps"] == 4


def _specs(q=(10, 8, 128), k=(10, 16, 2, 128), v=None, kl=(3,), bt=(3, 4), cu=(4,), ns=(1,),
           dtype="bf16", kdtype=None):
    return [xk.Spec(q, dtype), xk.Spec(k, kdtype or dtype), xk.Spec(v or k, kdtype or dtype),
            xk.Spec(kl, "i32"), xk.Spec(bt, "i32"), xk.Spec(cu, "i32"), xk.Spec(ns, "i32")]


BAD_CALLS = [
    ("head_dim", _specs(q=(10, 8, 96), k=(10, 16, 2, 96)), {}, "queries", "head_dim"),
    ("dtype mismatch", _specs(kdtype="f16"), {}, "key_cache", "dtype"),
    ("value dtype", [*_specs()[:2], xk.Spec((10, 16, 2, 128), "f32"), *_specs()[3:]], {},
     "value_cache", "dtype"),
    ("heads", _specs(q=(10, 6, 128), k=(10, 16, 4, 128)), {}, "key_cache", "multiple"),
    ("block size", _specs(k=(10, 8, 2, 128)), {}, "key_cache", "block_size"),
    ("cache dim", _specs(k=(10, 16, 2, 64)), {}, "key_cache", "head_dim"),
    ("value shape", _specs(v=(11, 16, 2, 128)), {}, "value_cache", "shape"),
    ("no seqs", _specs(kl=(0,), bt=(0, 4), cu=(1,)), {}, "kv_lens", "max_seqs >= 1"),
    ("tables", _specs(bt=(4, 4)), {}, "block_tables", "shape"),
    ("cu", _specs(cu=(3,)), {}, "cu_q_lens", "shape"),
    ("num_seqs", _specs(ns=(2,)), {}, "num_seqs", "shape"),
    ("layout", _specs(), {"layout": "nhd"}, "layout", "unknown layout"),
    ("window", _specs(), {"sliding_window": -1}, "sliding_window", ">= 0"),
    ("softcap", _specs(), {"softcap": -1.0}, "softcap", ">= 0"),
    ("scale", _specs(), {"scale": float("nan")}, "scale", "finite"),
    ("pallas dims", _specs(k=(2, 10, 16, 128)), {"layout": "vllm"}, "key_cache", "block_size"),
    ("too many rows", _specs(q=(2**25, 64, 128), k=(10, 16, 8, 128)), {}, "queries", "above"),
    ("capacity", _specs(bt=(3, 2**27)), {}, "block_tables", "above"),
]


@pytest.mark.parametrize("name,specs,attrs,arg,words", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_errors_name_argument_and_fix(name, specs, attrs, arg, words):
    assert_refused(ragged_paged_attention, specs, attrs, arg, words)


def test_bad_dtypes_rejected(rng):
    x = make_inputs(rng, q_lens=[2], kv_lens=[5], num_q_heads=2, num_kv_heads=1, head_dim=64,
                    block_size=16, dtype="f32")
    args = [x[k] for k in ARGS]
    with pytest.raises(xk.OpTypeError, match="queries"):
        ragged_paged_attention(args[0].astype(np.float64), *args[1:], scale=1.0)
    with pytest.raises(xk.OpTypeError, match="cu_q_lens"):
        ragged_paged_attention(*args[:5], args[5].astype(np.int64), args[6], scale=1.0)


def test_kernel_validates_inputs_itself(rng):
    """The C++ handler re-checks its inputs with the same wording and fails cleanly."""
    x = make_inputs(rng, q_lens=[2, 3], kv_lens=[5, 9], num_q_heads=4, num_kv_heads=2,
                    head_dim=64, block_size=16, dtype="f32")
    fn = load_kernel(ragged_paged_attention, "cpu").function
    out = np.zeros_like(x["queries"])

    def call(y: dict, **attrs) -> None:
        call_handler(fn, args=[Buffer.from_array(np.ascontiguousarray(y[k])) for k in ARGS],
                     rets=_rets(out), attrs=handler_attrs(0.1, **attrs),
                     op_name=ragged_paged_attention.name)

    bad = dict(x, key_cache=np.ascontiguousarray(x["key_cache"][..., :32]),
               value_cache=np.ascontiguousarray(x["value_cache"][..., :32]))
    with pytest.raises(KernelError, match="argument 'key_cache': head_dim 32") as e:
        call(bad)
    assert e.value.code_name == "INVALID_ARGUMENT"
    with pytest.raises(KernelError, match=r"argument 'cu_q_lens'.*Fix:"):
        call(dict(x, cu_q_lens=x["cu_q_lens"][:-1]))
    with pytest.raises(KernelError, match="argument 'num_seqs'"):
        call(dict(x, num_seqs=np.array([1, 2], np.int32)))
    with pytest.raises(KernelError, match="argument 'block_tables'"):
        call(dict(x, block_tables=x["block_tables"][:-1]))
    with pytest.raises(KernelError, match="argument 'layout'"):
        call(x, layout="bogus")
    with pytest.raises(KernelError, match="argument 'sliding_window'"):
        call(x, sliding_window=-2)


def _mutations(x: dict) -> list:
    """(name, edited inputs, attrs, output buffer or None (one like the queries), argument,
    words) for the handler."""
    f16 = {k: (v.astype(np.float16) if k in ARGS[:3] else v) for k, v in x.items()}
    return [
        ("f64 queries", {k: (v.astype(np.float64) if k in ARGS[:3] else v) for k, v in x.items()},
         {}, None, "queries", "dtype f64 is not supported"),
        ("mixed dtypes", dict(x, key_cache=f16["key_cache"], value_cache=f16["value_cache"]),
         {}, None, "key_cache", "share one dtype"),
        ("cache dtypes differ", dict(x, key_cache=f16["key_cache"]), {}, None, "value_cache",
         "dtype f32 differs from key_cache's f16"),
        ("out dtype", x, {}, np.zeros(x["queries"].shape, np.float16), "out",
         "the output's dtype must be the queries'"),
        ("queries rank", dict(x, queries=x["queries"][0]), {}, None, "queries",
         "expected shape [num_tokens"),
        ("cache rank", dict(x, key_cache=x["key_cache"][0], value_cache=x["value_cache"][0]), {},
         None, "key_cache", "rank-4"),
        ("value shape", dict(x, value_cache=x["value_cache"][:-1]), {}, None, "value_cache",
         "differs from key_cache"),
        ("queries head_dim", dict(x, queries=np.ascontiguousarray(x["queries"][..., :32])), {},
         None, "queries", "head_dim 32 is not supported"),
        ("block size", dict(x, key_cache=np.ascontiguousarray(x["key_cache"][:, :8]),
                            value_cache=np.ascontiguousarray(x["value_cache"][:, :8])), {}, None,
         "key_cache", "block_size 8"),
        ("heads", dict(x, queries=np.ascontiguousarray(x["queries"][:, :3])), {}, None,
         "key_cache", "not a multiple"),
        ("kv_lens", dict(x, kv_lens=x["kv_lens"][:, None]), {}, None, "kv_lens",
         "expected shape (max_seqs,)"),
        ("out shape", x, {}, np.zeros((1, 4, 64), x["queries"].dtype), "out",
         "differs from the queries'"),
        ("scale", x, {"scale": float("inf")}, None, "scale", "must be finite"),
        ("softcap", x, {"softcap": -1.0}, None, "softcap", "must be finite and >= 0"),
    ]


def test_kernel_error_messages(rng):
    """Every check of the shared C++ validation that small buffers can reach."""
    x = make_inputs(rng, q_lens=[2, 3], kv_lens=[5, 9], num_q_heads=4, num_kv_heads=2,
                    head_dim=64, block_size=16, dtype="f32")
    fn = load_kernel(ragged_paged_attention, "cpu").function
    for name, y, attrs, out, arg, words in _mutations(x):
        out = np.zeros_like(y["queries"]) if out is None else out
        all_attrs = {**handler_attrs(0.1), **{k: np.float32(v) for k, v in attrs.items()}}
        with pytest.raises(KernelError) as e:
            call_handler(fn, args=[Buffer.from_array(np.ascontiguousarray(y[k])) for k in ARGS],
                         rets=_rets(out), attrs=all_attrs,
                         op_name=ragged_paged_attention.name)
        msg = str(e.value)
        assert e.value.code_name == "INVALID_ARGUMENT", (name, msg)
        assert f"argument '{arg}'" in msg and words in msg and "Fix:" in msg, (name, msg)


@pytest.mark.slow
@requires_nvcc
def test_cuda_kernel_compiles_for_sm80(tmp_path):
    """test_cuda_sources.py builds every shipped op for sm_90; this op also targets A100."""
    kernel = ragged_paged_attention.kernels["cuda"]
    path = builder.build_library(ragged_paged_attention.name, kernel.resolved_sources(),
                                 platform="cuda", cuda_archs=["80"], cache_dir=tmp_path)
    assert path.exists()


def test_random_garbage_metadata_matches_the_oracle(rng):
    """Arbitrary int32 cu_q_lens / kv_lens / num_seqs / block ids: kernel, fallback and
    oracle agree on the clamped semantics (shapes fixed, so the fallback compiles once)."""
    x = make_inputs(rng, q_lens=[3, 5, 1, 7], kv_lens=[20, 5, 64, 40], num_q_heads=4,
                    num_kv_heads=2, head_dim=64, block_size=16, dtype="f32", num_tokens=20,
                    max_seqs=6, poison=False)
    for _ in range(6):
        y = garbage_metadata(rng, x, max_cu=24, max_kv_len=80)
        ref = reference(y, scale=0.1, sliding_window=9)
        for what, out in (("kernel", run_cpu_kernel(y, scale=0.1, sliding_window=9)),
                          ("xla", run_xla(y, scale=0.1, sliding_window=9))):
            check(out, ref, "f32", f"{what}: {y['cu_q_lens']} {y['kv_lens']} {y['num_seqs']}")


# ------------------------------------------------------------------ fp8 KV cache

# Both query dtypes x every head_dim x block size once with fp8 caches; layouts, GQA ratios
# and batch mixes (decode-only, whole prompts q_len = kv_len, chunks, mixed, prime lengths)
# rotate through them.
FP8_MATRIX = [
    (dtype, d, b, ("vllm", "pallas")[i % 2], HEADS[(i // 2) % 3], MIXES[i % len(MIXES)])
    for i, (dtype, d, b) in enumerate(itertools.product(("bf16", "f16"), HEAD_DIMS, BLOCK_SIZES))
] + [(dtype, 64, 64, layout, (8, 2), "long") for dtype in ("bf16", "f16")
     for layout in ("vllm", "pallas")]


def fp8_problem(rng, *, dtype, q_lens, kv_lens, head_dim=64, block_size=16, layout="vllm",
                heads=(8, 2), scales=None, **kw):
    """Random fp8 caches (NaN in every slot no row attends) and random scales; the attrs to
    call with."""
    k_scale, v_scale = scales or (float(rng.uniform(0.005, 0.1)), float(rng.uniform(0.005, 0.1)))
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=heads[0],
                    num_kv_heads=heads[1], head_dim=head_dim, block_size=block_size,
                    dtype=dtype, layout=layout, cache_dtype=FP8, kv_scales=(k_scale, v_scale),
                    **kw)
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    return x, dict(scale=scale, layout=layout, k_scale=k_scale, v_scale=v_scale)


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads,kind", FP8_MATRIX)
def test_fp8_cache_cpu_kernel_matches_float64_of_the_dequantized_cache(
        rng, dtype, head_dim, block_size, layout, heads, kind):
    q_lens, kv_lens = mix(kind, rng)
    x, attrs = fp8_problem(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, head_dim=head_dim,
                           block_size=block_size, layout=layout, heads=heads)
    assert x["key_cache"].dtype.name == "float8_e4m3fn"
    assert np.isnan(x["key_cache"].astype(np.float32)).any(), "unattended slots are poisoned"
    out = run_cpu_kernel(x, **attrs)
    assert out.dtype == x["queries"].dtype
    check(out, reference(x, **attrs), dtype, kind)
    assert np.all(out[owned_rows(x):] == 0), "padding rows must be zeros"


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("kind", ["mixed", "decode"])
def test_fp8_error_is_no_worse_than_the_same_kernel_on_the_dequantized_cache(rng, dtype, layout,
                                                                           kind):
    """Power-of-two scales make the dequantized cache exact in bf16/f16: the fp8 kernel's
    error against float64 is then held to the bf16/f16 kernel's on the same values."""
    q_lens, kv_lens = mix(kind, rng)
    x, attrs = fp8_problem(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, head_dim=128,
                           layout=layout, scales=(2.0**-5, 2.0**-6))
    ref = reference(x, **attrs)
    fp8_err = rel_error(run_cpu_kernel(x, **attrs), ref)
    deq, plain = dequantized(x, attrs, "queries")
    np.testing.assert_array_equal(reference(deq, **plain), ref)
    same_err = rel_error(run_cpu_kernel(deq, **plain), ref)
    assert fp8_err <= same_err * 1.01 + 1e-7, (fp8_err, same_err)
    assert fp8_err <= TOLERANCES[dtype]


def test_fp8_q_len_equal_kv_len_prime_lengths_and_decode_only(rng):
    """Whole prompts (row 0 attends token 0 only: its output is V[0] * v_scale), prime
    q_lens, and a decode-only batch padded to its sequence slots (CUDA's decode path)."""
    x, attrs = fp8_problem(rng, dtype="bf16", q_lens=[33, 1, 64, 17], kv_lens=[33, 1, 64, 17],
                           heads=(4, 2), head_dim=128, extra_blocks=9)
    ref = reference(x, **attrs)
    check(run_cpu_kernel(x, **attrs), ref, "bf16", "q_len = kv_len")
    blk = x["block_tables"][0, 0]
    np.testing.assert_allclose(
        ref[0, 0], x["value_cache"][blk, 0, 0].astype(np.float64) * attrs["v_scale"],
        rtol=1e-12)
    x, attrs = fp8_problem(rng, dtype="f16", q_lens=[2, 3, 5, 7, 11, 13], kv_lens=[
        3, 5, 7, 11, 13, 131], layout="pallas", heads=(6, 3), block_size=32)
    check(run_cpu_kernel(x, **attrs), reference(x, **attrs), "f16", "primes")
    x, attrs = fp8_problem(rng, dtype="bf16", q_lens=[1] * 5, kv_lens=[1, 17, 200, 64, 33],
                           num_tokens=5, max_seqs=5, block_size=32, sliding_window=50)
    attrs["sliding_window"] = 50
    ref = reference(x, **attrs)
    check(run_cpu_kernel(x, **attrs), ref, "bf16", "decode")
    decode = np.asarray(paged_attention(x["queries"], x["key_cache"], x["value_cache"],
                                        x["block_tables"], x["kv_lens"], **attrs), np.float32)
    assert rel_error(decode, ref) <= TOLERANCES["bf16"]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("softcap,window", [(0.0, 0), (7.0, 23)])
def test_fp8_cache_jit_op_and_xla_fallback(rng, dtype, layout, softcap, window):
    q_lens, kv_lens = mix("mixed", rng)
    x, attrs = fp8_problem(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, layout=layout,
                           heads=(6, 3), block_size=32, sliding_window=window)
    attrs.update(softcap=softcap, sliding_window=window)
    ref = reference(x, **attrs)
    args = [jax.device_put(x[k], jax.devices("cpu")[0]) for k in ARGS]
    out = jax.jit(lambda *a: ragged_paged_attention(*a, **attrs))(*args)
    assert out.dtype == x["queries"].dtype
    check(out, ref, dtype, "jit op")
    check(run_xla(x, **attrs), ref, dtype, "xla")
    assert np.all(np.asarray(out, np.float32)[owned_rows(x):] == 0)


def test_fp8_cache_clamped_metadata_and_out_of_range_ids(rng):
    x, attrs = fp8_problem(rng, dtype="bf16", q_lens=[5, 3, 2, 4], kv_lens=[64, 50, 33, 64],
                           heads=(8, 4), poison=False)
    num_blocks = x["key_cache"].shape[0]
    x["block_tables"][0, 1] = -1
    x["block_tables"][1, 0] = num_blocks
    x["block_tables"][3, :] = 2**31 - 1                    # every block bad: zeros
    x["kv_lens"][2] = 1                                    # q_len > kv_len
    ref = reference(x, **attrs)
    rows3 = slice(x["cu_q_lens"][3], x["cu_q_lens"][4])
    assert np.all(ref[rows3] == 0)
    for what, out in (("kernel", run_cpu_kernel(x, **attrs)), ("xla", run_xla(x, **attrs))):
        check(out, ref, "bf16", what)
        np.testing.assert_array_equal(np.asarray(out, np.float32)[ref == 0], 0)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_fp8_cache_in_torch_eager(rng, dtype):
    torch = pytest.importorskip("torch")
    from xla_kernels.frontends.torch import torch_op

    q_lens, kv_lens = mix("chunks", rng)
    x, attrs = fp8_problem(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, layout="pallas",
                           heads=(4, 4))
    tdtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    out = torch_op(ragged_paged_attention)(*(torch_tensor(x[k]) for k in ARGS), **attrs)
    assert out.dtype == tdtype
    check(out.float().numpy(), reference(x, **attrs), dtype, "torch")


FP8_BAD_CALLS = fp8_bad_calls(_specs, "queries")


@pytest.mark.parametrize("name,specs,attrs,arg,words", FP8_BAD_CALLS,
                         ids=[c[0] for c in FP8_BAD_CALLS])
def test_fp8_bad_calls_name_argument_and_fix(name, specs, attrs, arg, words):
    assert_refused(ragged_paged_attention, specs, attrs, arg, words)


def test_fp8_queries_are_refused_by_dtype():
    with pytest.raises(xk.OpTypeError, match=r"argument 'queries': dtype f8e4m3fn is not "
                                             r"supported. Fix: pass one of bf16, f16, f32"):
        ragged_paged_attention.bind(_specs(dtype=FP8), {"scale": 0.1})


@pytest.mark.parametrize("change,arg,words", [
    (dict(dtype=np.float32), "queries", "dtype f32 is not supported with f8e4m3fn caches"),
    (dict(k_scale=0.0), "k_scale", "must be finite and > 0"),
    (dict(v_scale=float("nan")), "v_scale", "must be finite and > 0"),
    (dict(value_cache="bf16"), "value_cache", "dtype bf16 differs from key_cache's f8e4m3fn"),
    (dict(plain_scale=0.5), "k_scale", "scales apply to f8e4m3fn caches only"),
])
def test_fp8_handler_validates_itself(rng, change, arg, words):
    """The C++ handler re-checks dtypes and scales (a hand-written call skips Python)."""
    x, attrs = fp8_problem(rng, dtype="bf16", q_lens=[2, 3], kv_lens=[5, 9], heads=(4, 2))
    if "dtype" in change:
        x["queries"] = x["queries"].astype(change.pop("dtype"))
    if "value_cache" in change:
        x["value_cache"] = x["value_cache"].astype(np.float32).astype(
            x["queries"].dtype)
        change.pop("value_cache")
    if "plain_scale" in change:
        x, attrs = dequantized(x, attrs, "queries")
        attrs["k_scale"] = change.pop("plain_scale")
    attrs.update(change)
    with pytest.raises(KernelError) as e:
        run_cpu_kernel(x, **attrs)
    msg = str(e.value)
    assert e.value.code_name == "INVALID_ARGUMENT", msg
    assert f"argument '{arg}'" in msg and words in msg and "Fix:" in msg, msg
