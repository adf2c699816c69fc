"""The fused K/V cache and block sizes 128 / 256 on the GPU (GPU machine only).

``ragged_paged_attention_fused`` must give, bit for bit, what ``ragged_paged_attention``
gives on the two caches the fused one holds (same kernels, other strides), on every kernel
path: the decode path (num_tokens <= max_seqs, every q_len 1), mma.sync, the Hopper wgmma
prefill kernel, fp8 caches. Block sizes 128 and 256 (tpu-inference's page sizes) against
the float64 oracle in the ragged and paged decode kernels. ``reshape_and_cache_fused``
against its NumPy oracle, NaN left in every slot it must not touch. Caches hold NaN in
every slot no row attends.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_kernels import dtypes
from xla_kernels.kernels.kv_cache import reshape_and_cache_fused, reshape_and_cache_fused_numpy
from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
from xla_kernels.kernels.paged_attention import testing as paged_testing
from xla_kernels.kernels.paged_cache import FP8, join_fused
from xla_kernels.kernels.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_fused,
    ragged_paged_attention_numpy_f64,
)
from xla_kernels.kernels.ragged_paged_attention.testing import (
    ARGS,
    TOLERANCES,
    make_inputs,
    mix,
    rel_error,
)

pytestmark = pytest.mark.gpu
FUSED_ARGS = ("queries", "kv_cache", *ARGS[3:])


def on_gpu(op, x: dict, args, **attrs) -> np.ndarray:
    gpu = jax.devices("gpu")[0]
    out = jax.jit(lambda *a: op(*a, **attrs))(*(jax.device_put(x[k], gpu) for k in args))
    return np.asarray(out.astype(jnp.float32))


CASES = [("decode", "bf16", None, 128, 16), ("decode", "f16", FP8, 128, 32),
         ("mixed", "bf16", None, 128, 16), ("mixed", "f16", None, 64, 64),
         ("long", "bf16", None, 128, 32), ("long", "f16", None, 256, 16),
         ("chunks", "f32", None, 128, 16), ("long", "bf16", FP8, 128, 16),
         ("primes", "bf16", FP8, 64, 32), ("prefill", "bf16", None, 128, 128)]


@pytest.mark.parametrize("kind,dtype,cache_dtype,head_dim,block_size", CASES)
def test_fused_cache_gives_what_the_two_caches_give_bit_for_bit(rng, kind, dtype, cache_dtype,
                                                                head_dim, block_size):
    q_lens, kv_lens = mix(kind, rng)
    scales = (0.05, 0.3) if cache_dtype == FP8 else (1.0, 1.0)
    # A decode batch pads its rows to at most its sequence slots: the decode path.
    rows = dict(num_tokens=len(q_lens)) if kind == "decode" else {}
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=head_dim, block_size=block_size, dtype=dtype,
                    cache_dtype=cache_dtype, kv_scales=scales, **rows)
    x["kv_cache"] = join_fused(x["key_cache"], x["value_cache"])
    attrs = dict(scale=0.1, softcap=0.0 if kind != "mixed" else 8.0, k_scale=scales[0],
                 v_scale=scales[1])
    fused = on_gpu(ragged_paged_attention_fused, x, FUSED_ARGS, **attrs)
    separate = on_gpu(ragged_paged_attention, x, ARGS, **attrs)
    np.testing.assert_array_equal(fused, separate)
    four = x["kv_cache"]  # tpu-inference's packed 5-D form: the same memory
    x["kv_cache"] = four.reshape(*four.shape[:2], four.shape[2] // 2, 2, four.shape[3])
    np.testing.assert_array_equal(on_gpu(ragged_paged_attention_fused, x, FUSED_ARGS, **attrs),
                                  separate)
    # The same two-cache oracle the ragged tests use, on the values the fused cache holds.
    ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), **attrs)
    assert not np.isnan(fused).any()
    assert rel_error(fused, ref) <= TOLERANCES[dtype]


@pytest.mark.parametrize("block_size", [128, 256])
@pytest.mark.parametrize("kind", ["decode", "mixed", "long", "chunks"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_ragged_block_sizes_128_and_256_match_float64(rng, block_size, kind, dtype):
    q_lens, kv_lens = mix(kind, rng)
    rows = dict(num_tokens=len(q_lens)) if kind == "decode" else {}
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=8, num_kv_heads=2,
                    head_dim=128, block_size=block_size, dtype=dtype, sliding_window=0, **rows)
    out = on_gpu(ragged_paged_attention, x, ARGS, scale=0.09)
    ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), scale=0.09)
    assert not np.isnan(out).any()
    assert rel_error(out, ref) <= TOLERANCES[dtype]


@pytest.mark.parametrize("block_size", [128, 256])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("num_seqs", [3, 40])
def test_paged_block_sizes_128_and_256_match_float64(rng, block_size, layout, num_seqs):
    x = paged_testing.make_inputs(rng, num_seqs=num_seqs, num_q_heads=8, num_kv_heads=2,
                                  head_dim=128, block_size=block_size, dtype="bf16",
                                  layout=layout, max_context=3000)
    args = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")
    out = on_gpu(paged_attention, x, args, scale=0.09, layout=layout)
    ref = paged_attention_numpy_f64(*(x[k] for k in args), scale=0.09, layout=layout)
    assert not np.isnan(out).any()
    assert rel_error(out, ref) <= paged_testing.TOLERANCES["bf16"]


@pytest.mark.parametrize("dtype,cache_dtype", [("bf16", None), ("f32", None), ("bf16", FP8),
                                               ("f16", FP8)])
def test_write_into_the_fused_cache_matches_the_oracle(rng, dtype, cache_dtype):
    np_dtype = dtypes.to_numpy(dtype)
    tokens, heads, dim, blocks, block_size = 300, 8, 128, 40, 16
    key = rng.standard_normal((tokens, heads, dim)).astype(np_dtype)
    value = rng.standard_normal((tokens, heads, dim)).astype(np_dtype)
    kv = np.full((blocks, block_size, 2 * heads, dim), np.nan, np.float32).astype(
        dtypes.to_numpy(cache_dtype or dtype))
    slots = rng.permutation(blocks * block_size)[:tokens].astype(np.int32)
    slots[:3] = (-1, blocks * block_size, -7)
    scales = dict(k_scale=0.25, v_scale=2.0) if cache_dtype == FP8 else {}
    gpu = jax.devices("gpu")[0]
    write = jax.jit(lambda *a: reshape_and_cache_fused(*a, **scales), donate_argnums=(2,))
    got = np.asarray(write(*(jax.device_put(a, gpu) for a in (key, value, kv, slots))))
    want = reshape_and_cache_fused_numpy(key, value, kv, slots, **scales)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
