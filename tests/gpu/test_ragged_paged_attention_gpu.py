"""ragged_paged_attention's CUDA kernel against the float64 oracle (GPU machine only).

Covers every dtype x head_dim x layout x GQA ratio (1, 4, 32 = MQA) and every dtype x
block_size over the batch mixes of ``testing.mix`` (all decode, one long prefill, many
short chunks, mixed, prime lengths, 1000+ tokens), softcap and sliding windows, whole
prompts (q_len = kv_len), out-of-range block ids, padding rows and unused sequence slots,
inconsistent device data (clamping), agreement with ``paged_attention`` when every q_len is
1, the torch eager path with NaN left in the allocator's free memory, and tiles that split
a sequence's rows in the middle of a GQA group. Caches hold NaN in every slot no row
attends. fp8 caches (f8e4m3fn, bf16/f16 queries): a matrix against float64 of the
dequantized cache, the error held to the bf16/f16 kernel's on the same values, softcap and
windows, the decode path (split contexts, v_scale in the reduce kernel), GQA tiles, and
torch float8 tensors with NaN-filled output and workspace.
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
from xla_kernels.kernels.paged_attention import paged_attention
from xla_kernels.kernels.ragged_paged_attention import (
    decode_workspace_size,
    ragged_paged_attention,
    ragged_paged_attention_numpy_f64,
)
from xla_kernels.kernels.ragged_paged_attention.testing import (
    ARGS,
    TOLERANCES,
    garbage_metadata,
    make_inputs,
    mix,
    rel_error,
)

pytestmark = pytest.mark.gpu


def gpu() -> jax.Device:
    return jax.devices("gpu")[0]


run_jax = jit_runner(ragged_paged_attention, ARGS, gpu)


def reference(x: dict, **attrs) -> np.ndarray:
    return ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), **attrs)


HEADS = [(8, 8), (8, 2), (32, 1)]
# Every dtype x head_dim x GQA ratio x layout, block sizes rotating; then every dtype x
# block size (63 cases: the GPU session's time is limited).
FULL = [(dtype, d, (16, 32, 64)[i % 3], layout, heads) for i, (dtype, d, heads, layout) in
        enumerate(itertools.product(("bf16", "f16", "f32"), (64, 128, 256), HEADS,
                                    ("vllm", "pallas")))]
FULL += [(dtype, 128, b, "vllm", (8, 2)) for dtype in ("bf16", "f16", "f32")
         for b in (16, 32, 64)]


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads", FULL)
def test_cuda_matches_float64(rng, dtype, head_dim, block_size, layout, heads):
    hq, hkv = heads
    kind = ("mixed", "chunks", "decode", "prefill", "primes")[int(rng.integers(0, 5))]
    q_lens, kv_lens = mix(kind, rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=hq, num_kv_heads=hkv,
                    head_dim=head_dim, block_size=block_size, dtype=dtype, layout=layout)
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    out = run_jax(x, scale=scale, layout=layout)
    check(out, reference(x, scale=scale, layout=layout), dtype, kind)
    assert np.all(out[int(x["cu_q_lens"][len(q_lens)]):] == 0), "padding rows must be zeros"


@pytest.mark.parametrize("kind", ["decode", "prefill", "chunks", "mixed", "primes", "long"])
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_every_mix(rng, kind, dtype):
    q_lens, kv_lens = mix(kind, rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=16, num_kv_heads=4,
                    head_dim=128, block_size=16, dtype=dtype)
    check(run_jax(x, scale=0.088), reference(x, scale=0.088), dtype, kind)


@pytest.mark.parametrize("dtype,wgmma", [("bf16", "1"), ("f16", "0"), ("f32", "1")])
def test_more_sequences_than_a_warp(rng, monkeypatch, dtype, wgmma):
    """75 sequences in 82 slots: the CTAs' work search walks three 32-sequence chunks (the
    last one partial, its loads issued a chunk ahead), on the wgmma, mma.sync and f32
    kernels."""
    q_lens = [int(q) for q in rng.choice([1, 1, 1, 2, 5, 17, 40, 130], size=75)]
    kv_lens = [q + int(rng.integers(0, 300)) for q in q_lens]
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=128, block_size=16, dtype=dtype, max_seqs=82)
    if wgmma == "0":
        monkeypatch.setenv("XLA_KERNELS_RAGGED_WGMMA", "0")
    out = run_jax(x, fresh=True, scale=0.1)
    check(out, reference(x, scale=0.1), dtype, "75 sequences")
    assert np.all(out[int(x["cu_q_lens"][len(q_lens)]):] == 0), "padding rows must be zeros"


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("softcap,window", [(5.0, 0), (0.0, 1), (0.0, 31), (0.0, 100),
                                            (30.0, 333), (0.0, 10**9)])
def test_softcap_and_sliding_window(rng, dtype, layout, softcap, window):
    q_lens, kv_lens = mix("mixed", rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=128, block_size=16, dtype=dtype, layout=layout,
                    sliding_window=min(window, 10**6))
    attrs = dict(scale=0.09, softcap=softcap, sliding_window=window, layout=layout)
    check(run_jax(x, **attrs), reference(x, **attrs), dtype, f"{softcap=} {window=}")


@pytest.mark.parametrize("group", [1, 2, 3, 5, 6, 7, 12, 24])
def test_tiles_split_gqa_groups(rng, group):
    """Packed rows (query row x head of the group) cross tile boundaries mid-group."""
    x = make_inputs(rng, q_lens=[37, 1, 11, 64], kv_lens=[90, 20, 11, 300], num_q_heads=group,
                    num_kv_heads=1, head_dim=64, block_size=32, dtype="bf16")
    check(run_jax(x, scale=0.125), reference(x, scale=0.125), "bf16", f"G={group}")


def test_whole_prompts_and_shuffled_tables(rng):
    for dtype in ("bf16", "f32"):
        x = make_inputs(rng, q_lens=[33, 1, 64, 129, 17], kv_lens=[33, 1, 64, 129, 17],
                        num_q_heads=8, num_kv_heads=2, head_dim=128, block_size=16,
                        dtype=dtype, extra_blocks=11)
        check(run_jax(x, scale=0.09), reference(x, scale=0.09), dtype)


def test_out_of_range_block_ids_and_padding(rng):
    x = make_inputs(rng, q_lens=[5, 3, 40, 4], kv_lens=[64, 50, 100, 64], num_q_heads=8,
                    num_kv_heads=4, head_dim=64, block_size=16, dtype="bf16", poison=False,
                    num_tokens=70, max_seqs=9)
    bt = x["block_tables"]
    num_blocks = x["key_cache"].shape[0]
    bt[0, 1] = -1
    bt[1, 0] = num_blocks
    bt[2, 5] = 2**31 - 1
    bt[3, :] = -(2**31)
    ref = reference(x, scale=0.125)
    out = run_jax(x, scale=0.125)
    check(out, ref, "bf16")
    assert np.all(out[ref.reshape(70, -1).any(axis=1) == 0] == 0)


def test_inconsistent_device_data_is_clamped(rng):
    x = make_inputs(rng, q_lens=[4, 6, 3, 5, 2], kv_lens=[9, 40, 30, 20, 33], num_q_heads=8,
                    num_kv_heads=2, head_dim=128, block_size=16, dtype="f16", num_tokens=22,
                    max_seqs=5, poison=False)
    edits = [
        dict(kv_lens=np.array([2, 40, 30, 20, 33], np.int32)),
        dict(cu_q_lens=np.array([0, 4, 10, 7, 18, 20], np.int32)),
        dict(cu_q_lens=np.array([0, 4, 10, 13, 40, 99], np.int32)),
        dict(cu_q_lens=np.array([3, 4, 10, 13, 18, 20], np.int32)),
        dict(cu_q_lens=np.array([-9, 4, 10, 13, 18, 2**31 - 1], np.int32)),
        dict(num_seqs=np.array([77], np.int32)),
        dict(num_seqs=np.array([-3], np.int32)),
        dict(kv_lens=np.array([-5, 40, 10**6, 20, 33], np.int32)),
    ]
    for edit in edits:
        y = dict(x, **edit)
        ref = reference(y, scale=0.125)
        out = run_jax(y, scale=0.125)
        check(out, ref, "f16", str(edit))
        np.testing.assert_array_equal(out[ref == 0], 0)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_agrees_with_paged_attention_when_every_q_len_is_1(rng, dtype):
    lens = [1, 17, 2000, 64, 33, 700]
    x = make_inputs(rng, q_lens=[1] * 6, kv_lens=lens, num_q_heads=32, num_kv_heads=8,
                    head_dim=128, block_size=16, dtype=dtype, num_tokens=6, max_seqs=6)
    ours = run_jax(x, scale=0.088)
    decode = np.asarray(jax.jit(lambda *a: paged_attention(*a, scale=0.088))(
        *(jax.device_put(x[k], gpu()) for k in ("queries", "key_cache", "value_cache",
                                                "block_tables", "kv_lens"))), np.float32)
    assert rel_error(ours, decode.astype(np.float64)) <= TOLERANCES[dtype]
    check(ours, reference(x, scale=0.088), dtype)


@pytest.mark.parametrize("dtype,layout", [("bf16", "vllm"), ("f16", "pallas"), ("f32", "vllm")])
def test_decode_only_batches_take_the_decode_path_exactly(rng, dtype, layout):
    """Every q_len <= 1 and num_tokens <= max_seqs: the device picks paged_attention's
    split-context kernels. Empty sequences, padding rows (poisoned), long contexts split
    over partitions, bad block ids, softcap and window; then one q_len of 2 sends the same
    shapes down the other path."""
    kv_lens = [1, 0, 9000, 64, 33, 0, 2500]
    q_lens = [1, 0, 1, 1, 1, 1, 1]
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=16, num_kv_heads=4,
                    head_dim=128, block_size=16, dtype=dtype, layout=layout, num_tokens=11,
                    max_seqs=12)
    x["block_tables"][2, 100] = -3
    for attrs in ({"scale": 0.088, "layout": layout},
                  {"scale": 0.088, "softcap": 7.0, "sliding_window": 1500, "layout": layout}):
        out = run_jax(x, **attrs)
        check(out, reference(x, **attrs), dtype, f"decode {attrs}")
        assert np.all(out[6:] == 0)
    q_lens[4] = 2
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=16, num_kv_heads=4,
                    head_dim=128, block_size=16, dtype=dtype, layout=layout, num_tokens=11,
                    max_seqs=12)
    check(run_jax(x, scale=0.088, layout=layout), reference(x, scale=0.088, layout=layout), dtype,
          "one q_len of 2")


def test_torch_eager_cuda_with_poisoned_output(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from xla_kernels.frontends.torch import torch_op

    q_lens, kv_lens = mix("mixed", rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=128, block_size=16, dtype="f16")
    op = torch_op(ragged_paged_attention)
    tensors = [torch.from_numpy(x[k]).cuda() for k in ARGS]
    # Leave NaN in the caching allocator's free memory, where the output is likely placed:
    # padding rows must still come back as zeros.
    junk = torch.full(x["queries"].shape, float("nan"), dtype=torch.float16, device="cuda")
    del junk
    got = op(*tensors, scale=0.1)
    torch.cuda.synchronize()
    out = got.float().cpu().numpy()
    check(out, reference(x, scale=0.1), "f16")
    assert np.all(out[int(x["cu_q_lens"][len(q_lens)]):] == 0)


def test_sanitize_cases_pass():
    from xla_kernels.kernels.ragged_paged_attention.testing import sanitize_cases

    sanitize_cases("gpu")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_random_garbage_metadata_matches_the_oracle(rng, dtype):
    """Arbitrary int32 cu_q_lens / kv_lens / num_seqs / block ids: never out of bounds, and
    the clamped semantics of the oracle."""
    x = make_inputs(rng, q_lens=[3, 50, 1, 70], kv_lens=[20, 50, 64, 400], num_q_heads=8,
                    num_kv_heads=2, head_dim=128, block_size=16, dtype=dtype, num_tokens=130,
                    max_seqs=6, poison=False)
    for _ in range(10):
        y = garbage_metadata(rng, x, max_cu=140, max_kv_len=500)
        attrs = dict(scale=0.1, sliding_window=40)
        ref = reference(y, **attrs)
        out = run_jax(y, **attrs)
        check(out, ref, dtype, f"{y['cu_q_lens']} {y['kv_lens']} {y['num_seqs']}")
        np.testing.assert_array_equal(out[ref == 0], 0)


# --------------------------------------------------------------------------- the sm_90a path
# bf16/f16 (head_dim 64/128/256) run the wgmma kernel on an H100 (ragged_paged_attention_sm90.cuh)
# unless XLA_KERNELS_RAGGED_WGMMA=0; scripts/gpu/tests.sh (parts ragged-wgmma, ragged-rest)
# runs this file with XLA_KERNELS_RAGGED_WGMMA=require (a call the wgmma kernel should serve
# fails if it cannot); test_wgmma_and_mma_sync_kernels_agree sets =0 for one call. The
# tests above cover it too; these add long prefills (several 128-row CTAs and 64-token
# tiles per sequence, diagonal and fully-unmasked tiles), GQA 1/4/8, every block size and
# layout, softcap, windows and invalid block ids on long sequences.

WGMMA = [(dtype, d, layout, group, (16, 32, 64)[i % 3]) for i, (dtype, d, layout, group) in
         enumerate(itertools.product(("bf16", "f16"), (64, 128, 256), ("vllm", "pallas"),
                                     (1, 4, 8)))]


@pytest.mark.parametrize("dtype,head_dim,layout,group,block_size", WGMMA)
def test_wgmma_long_prefills(rng, dtype, head_dim, layout, group, block_size):
    # A whole 1000+ prompt, a chunk of a long context, a decode row, a short whole prompt,
    # and a chunk longer than its context (its first rows attend nothing).
    q_lens, kv_lens = [1037, 300, 1, 5, 70], [1037, 1100, 77, 5, 70]
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=2 * group,
                    num_kv_heads=2, head_dim=head_dim, block_size=block_size, dtype=dtype,
                    layout=layout)
    x["kv_lens"][4] = 40
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    out = run_jax(x, scale=scale, layout=layout)
    check(out, reference(x, scale=scale, layout=layout), dtype, f"G={group}")
    assert np.all(out[int(x["cu_q_lens"][len(q_lens)]):] == 0), "padding rows must be zeros"


@pytest.mark.parametrize("softcap,window", [(5.0, 0), (0.0, 1), (0.0, 64), (0.0, 100),
                                            (30.0, 333), (0.0, 700)])
def test_wgmma_softcap_and_window_on_long_prefills(rng, softcap, window):
    x = make_inputs(rng, q_lens=[1200, 257], kv_lens=[1200, 900], num_q_heads=8,
                    num_kv_heads=2, head_dim=128, block_size=32, dtype="bf16",
                    layout="pallas", sliding_window=window)
    attrs = dict(scale=0.09, softcap=softcap, sliding_window=window, layout="pallas")
    check(run_jax(x, **attrs), reference(x, **attrs), "bf16", f"{softcap=} {window=}")


def test_wgmma_invalid_block_ids_in_long_prefills(rng):
    x = make_inputs(rng, q_lens=[600, 130], kv_lens=[1000, 130], num_q_heads=8,
                    num_kv_heads=8, head_dim=128, block_size=16, dtype="f16", poison=False)
    bt = x["block_tables"]
    bt[0, 3] = -1                                 # a hole in the middle of a 64-token tile
    bt[0, 40] = x["key_cache"].shape[0]           # one past the end
    bt[0, 50:53] = 2**31 - 1                      # a whole tile's worth
    bt[1, 0] = -(2**31)
    check(run_jax(x, scale=0.09), reference(x, scale=0.09), "f16", "invalid ids")


@pytest.mark.parametrize("dtype,head_dim", [("bf16", 128), ("f16", 64), ("bf16", 256),
                                             ("f16", 128)])
def test_wgmma_rows_whose_maximum_keeps_rising(rng, dtype, head_dim):
    """Logits that climb tile after tile: a row's reference maximum moves past the
    kernel's slack (O and l are rescaled) at many tiles of a long context, not only at the
    first ones, which is all that random logits exercise."""
    q_lens, kv_lens = [900, 130], [1000, 700]
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=head_dim, block_size=16, dtype=dtype, poison=False)
    np_dtype = x["queries"].dtype
    u = rng.standard_normal(head_dim)
    u /= np.linalg.norm(u)
    # Per 64-token stretch a random climb of 0, 3, 9 or 15 nats of logit (the kernel moves
    # its reference only past 8 in base 2, ~5.5 nats), summed along the context.
    rise = {s: np.cumsum(rng.choice([0.0, 3.0, 9.0, 15.0], size=-(-k // 64)))
            for s, k in enumerate(kv_lens)}
    keys = x["key_cache"].astype(np.float32)
    q = x["queries"].astype(np.float32)
    scale = 1.0 / np.sqrt(head_dim)
    for s, k in enumerate(kv_lens):
        for t in range(k):
            b, off = x["block_tables"][s, t // 16], t % 16
            keys[b, off] = 0.3 * keys[b, off] + u * rise[s][t // 64]
        lo = int(x["cu_q_lens"][s])
        q[lo:lo + q_lens[s]] = 0.3 * q[lo:lo + q_lens[s]] + u / scale
    x["key_cache"], x["queries"] = keys.astype(np_dtype), q.astype(np_dtype)
    check(run_jax(x, scale=scale), reference(x, scale=scale), dtype, f"d={head_dim}")


def test_wgmma_and_mma_sync_kernels_agree(rng, monkeypatch):
    """The same call through both kernels (the switch is read at every launch)."""
    x = make_inputs(rng, q_lens=[777, 64, 3], kv_lens=[900, 64, 500], num_q_heads=16,
                    num_kv_heads=4, head_dim=128, block_size=64, dtype="bf16")
    ref = reference(x, scale=0.088)
    monkeypatch.setenv("XLA_KERNELS_RAGGED_WGMMA", "0")
    old = run_jax(x, fresh=True, scale=0.088)
    monkeypatch.delenv("XLA_KERNELS_RAGGED_WGMMA")
    new = run_jax(x, fresh=True, scale=0.088)
    check(old, ref, "bf16", "mma.sync")
    check(new, ref, "bf16", "wgmma")
    assert rel_error(new, old.astype(np.float64)) <= 2 * TOLERANCES["bf16"]


@pytest.mark.parametrize("dtype,head_dim,window", [("bf16", 128, 0), ("f16", 128, 150),
                                                    ("f16", 64, 0), ("bf16", 64, 90)])
def test_wgmma_128_token_tiles_with_and_without_a_window(rng, dtype, head_dim, window):
    """The 128-token K/V tiles of head_dim 64 and 128 (ping-pong of the consumers, their
    register split); a window gives the two consumer warpgroups different first tiles."""
    x = make_inputs(rng, q_lens=[1100, 200, 1], kv_lens=[1100, 1300, 300], num_q_heads=8,
                    num_kv_heads=2, head_dim=head_dim, block_size=32, dtype=dtype,
                    sliding_window=window)
    attrs = dict(scale=0.1, sliding_window=window)
    check(run_jax(x, fresh=True, **attrs), reference(x, **attrs), dtype, "tile 128")


# ------------------------------------------------------------------ fp8 KV cache

FP8_MIXES = ("mixed", "chunks", "decode", "prefill", "primes")
# Every query dtype x head_dim x block size x layout; GQA ratios and mixes rotate (36 cases).
FP8_FULL = [(dtype, d, b, layout, HEADS[i % 3], FP8_MIXES[i % 5]) for i, (dtype, d, b, layout)
            in enumerate(itertools.product(("bf16", "f16"), (64, 128, 256), (16, 32, 64),
                                           ("vllm", "pallas")))]


fp8_inputs = functools.partial(attention_checks.fp8_inputs, make_inputs)


@pytest.mark.parametrize("dtype,head_dim,layout,group,block_size", WGMMA)
def test_fp8_long_prefills(rng, dtype, head_dim, layout, group, block_size):
    # test_wgmma_long_prefills on fp8 caches (more K/V tiles than stages, every stage reused);
    # a block id hole inside the long prompt.
    q_lens, kv_lens = [1037, 300, 1, 5, 70], [1037, 1100, 77, 5, 70]
    x, scales = fp8_inputs(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens,
                           num_q_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
                           block_size=block_size, layout=layout)
    x["block_tables"][0, 5] = -1
    attrs = dict(scale=float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim), layout=layout, **scales)
    out = run_jax(x, **attrs)
    check(out, reference(x, **attrs), dtype, f"fp8 G={group}")
    assert np.all(out[int(x["cu_q_lens"][len(q_lens)]):] == 0), "padding rows must be zeros"


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads,kind", FP8_FULL)
def test_fp8_cuda_matches_float64_of_the_dequantized_cache(rng, dtype, head_dim, block_size,
                                                           layout, heads, kind):
    hq, hkv = heads
    q_lens, kv_lens = mix(kind, rng)
    x, scales = fp8_inputs(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=hq,
                           num_kv_heads=hkv, head_dim=head_dim, block_size=block_size,
                           layout=layout)
    attrs = dict(scale=float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim), layout=layout, **scales)
    out = run_jax(x, **attrs)
    check(out, reference(x, **attrs), dtype, kind)
    assert np.all(out[int(x["cu_q_lens"][len(q_lens)]):] == 0), "padding rows must be zeros"


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("kind,decode_path", [("mixed", False), ("long", False),
                                              ("prefill", False), ("decode", True)])
def test_fp8_error_no_worse_than_the_bf16_kernel_on_the_dequantized_cache(
        rng, dtype, head_dim, kind, decode_path):
    """Power-of-two scales make the dequantized cache exact in bf16/f16, so the bf16/f16
    kernel runs on the very values the fp8 kernel reads: at the same configuration the fp8
    kernel's error against float64 must not exceed it (up to summation order: 1.2x).
    decode_path pads the decode batch to its sequence slots (paged_attention's kernels)."""
    q_lens, kv_lens = mix(kind, rng)
    kw = dict(num_tokens=len(q_lens), max_seqs=len(q_lens)) if decode_path else {}
    x, scales = fp8_inputs(rng, dtype=dtype, scales=(2.0**-5, 2.0**-6), q_lens=q_lens,
                           kv_lens=kv_lens, num_q_heads=32, num_kv_heads=8, head_dim=head_dim,
                           block_size=16, **kw)
    attrs = dict(scale=head_dim**-0.5, **scales)
    ref = reference(x, **attrs)
    fp8_err = rel_error(run_jax(x, **attrs), ref)
    deq, plain = dequantized(x, attrs, "queries")
    np.testing.assert_array_equal(reference(deq, **plain), ref)
    same_err = rel_error(run_jax(deq, **plain), ref)
    print(f"{kind} d={head_dim}: fp8 {fp8_err:.3g} vs {dtype} {same_err:.3g}")
    assert fp8_err <= 1.2 * same_err + 1e-6, (fp8_err, same_err)
    assert fp8_err <= TOLERANCES[dtype]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("softcap,window", [(5.0, 0), (0.0, 1), (0.0, 31), (30.0, 333)])
def test_fp8_softcap_and_sliding_window(rng, dtype, layout, softcap, window):
    q_lens, kv_lens = mix("mixed", rng)
    x, scales = fp8_inputs(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8,
                           num_kv_heads=2, head_dim=128, block_size=16, layout=layout,
                           sliding_window=window)
    attrs = dict(scale=0.09, softcap=softcap, sliding_window=window, layout=layout, **scales)
    check(run_jax(x, **attrs), reference(x, **attrs), dtype, f"{softcap=} {window=}")


@pytest.mark.parametrize("dtype,layout", [("bf16", "vllm"), ("f16", "pallas")])
def test_fp8_decode_path_and_the_other_path_with_the_same_shapes(rng, dtype, layout):
    """Decode-only, num_tokens <= max_seqs: paged_attention's fp8 kernels with long contexts
    split over partitions (the reduce kernel applies v_scale), empty sequences, padding rows
    and a bad block id; then one q_len of 2 sends the same shapes down the mma kernel."""
    kv_lens = [1, 0, 9000, 64, 33, 0, 2500]
    q_lens = [1, 0, 1, 1, 1, 1, 1]
    kw = dict(num_q_heads=16, num_kv_heads=4, head_dim=128, block_size=16, layout=layout,
              num_tokens=11, max_seqs=12)
    x, scales = fp8_inputs(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, **kw)
    x["block_tables"][2, 100] = -3
    for attrs in ({"scale": 0.088, "layout": layout},
                  {"scale": 0.088, "softcap": 7.0, "sliding_window": 1500, "layout": layout}):
        out = run_jax(x, **attrs, **scales)
        check(out, reference(x, **attrs, **scales), dtype, f"decode {attrs}")
        assert np.all(out[6:] == 0)
    q_lens[4] = 2
    x, scales = fp8_inputs(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, **kw)
    attrs = dict(scale=0.088, layout=layout, **scales)
    check(run_jax(x, **attrs), reference(x, **attrs), dtype, "one q_len of 2")


@pytest.mark.parametrize("group", [1, 3, 7, 24])
def test_fp8_tiles_split_gqa_groups_and_whole_prompts(rng, group):
    x, scales = fp8_inputs(rng, dtype="f16", q_lens=[37, 1, 11, 64], kv_lens=[90, 20, 11, 64],
                           num_q_heads=group, num_kv_heads=1, head_dim=64, block_size=32)
    attrs = dict(scale=0.125, **scales)
    check(run_jax(x, **attrs), reference(x, **attrs), "f16", f"G={group}")


def test_fp8_clamped_metadata_and_out_of_range_ids(rng):
    x, scales = fp8_inputs(rng, dtype="bf16", q_lens=[5, 3, 40, 4], kv_lens=[64, 50, 100, 64],
                           num_q_heads=8, num_kv_heads=4, head_dim=64, block_size=16,
                           poison=False, num_tokens=70, max_seqs=9)
    bt = x["block_tables"]
    bt[0, 1] = -1
    bt[1, 0] = x["key_cache"].shape[0]
    bt[2, 5] = 2**31 - 1
    bt[3, :] = -(2**31)
    x["cu_q_lens"][3] = 6                                  # decreasing: an empty sequence
    attrs = dict(scale=0.125, **scales)
    ref = reference(x, **attrs)
    out = run_jax(x, **attrs)
    check(out, ref, "bf16")
    np.testing.assert_array_equal(out[ref == 0], 0)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp8_wgmma_and_mma_sync_kernels_agree(rng, monkeypatch, head_dim):
    """fp8 caches through both kernels (the wgmma kernel's producer converts a ring of raw
    e4m3 tiles; the mma.sync kernel converts in its own loop): both match float64 of the
    dequantized cache and each other."""
    x, scales = fp8_inputs(rng, dtype="bf16", q_lens=[777, 64, 3, 1],
                           kv_lens=[900, 64, 500, 300], num_q_heads=16, num_kv_heads=4,
                           head_dim=head_dim, block_size=32)
    ref = reference(x, scale=0.088, **scales)
    monkeypatch.setenv("XLA_KERNELS_RAGGED_WGMMA", "0")
    old = run_jax(x, fresh=True, scale=0.088, **scales)
    monkeypatch.delenv("XLA_KERNELS_RAGGED_WGMMA")
    new = run_jax(x, fresh=True, scale=0.088, **scales)
    check(old, ref, "bf16", "fp8 mma.sync")
    check(new, ref, "bf16", "fp8 wgmma")
    assert rel_error(new, old.astype(np.float64)) <= 2 * TOLERANCES["bf16"]


def test_fp8_deterministic(rng):
    q_lens, kv_lens = mix("long", rng)
    x, scales = fp8_inputs(rng, dtype="bf16", q_lens=q_lens, kv_lens=kv_lens, num_q_heads=32,
                           num_kv_heads=8, head_dim=128, block_size=16, poison=False)
    a, b = run_jax(x, scale=0.1, **scales), run_jax(x, scale=0.1, **scales)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("decode", [False, True])
def test_fp8_torch_float8_tensors_with_poisoned_output_and_workspace(rng, dtype, decode):
    """torch float8_e4m3fn CUDA tensors through the torch operator, and the handler writing
    into NaN-filled output and workspace (decode: the workspace holds the decode path's
    partials and tables)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    from xla_kernels.frontends.torch import torch_op

    q_lens, kv_lens = ([1, 1, 1, 0], [5000, 33, 640, 7]) if decode else mix("mixed", rng)
    kw = dict(num_tokens=4, max_seqs=5) if decode else {}
    x, scales = fp8_inputs(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=16,
                           num_kv_heads=4, head_dim=128, block_size=16, **kw)
    ins = [torch_tensor(x[k], "cuda") for k in ARGS]
    ref = reference(x, scale=0.1, **scales)
    got = torch_op(ragged_paged_attention)(*ins, scale=0.1, **scales)
    check(got.float().cpu().numpy(), ref, dtype, "torch op")
    q = x["queries"]
    n = decode_workspace_size(q.shape[0], x["kv_lens"].shape[0], q.shape[1], q.shape[2],
                              x["block_tables"].shape[1], 16)
    got = run_cuda_handler(ragged_paged_attention, ins, n, dict(scale=0.1, **scales))
    check(got, ref, dtype, "eager")
    assert np.all(got[int(x["cu_q_lens"][len(q_lens)]):] == 0)
