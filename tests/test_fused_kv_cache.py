"""The fused K/V cache (tpu-inference's layout: one array [num_blocks, block_size,
2 * num_kv_heads, head_dim], head h's key at 2h and its value at 2h + 1), on the CPU:
``reshape_and_cache_fused`` writes into it in place and ``ragged_paged_attention_fused``
reads it where it lies, against float64 oracles written on the layout's definition, with
NaN in every slot no row attends and NaN outputs before each eager call."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels import dtypes
from xla_kernels.kernels.kv_cache import (
    reshape_and_cache,
    reshape_and_cache_fused,
    reshape_and_cache_fused_numpy,
)
from xla_kernels.kernels.paged_cache import FP8, join_fused, split_fused
from xla_kernels.kernels.ragged_paged_attention import (
    BLOCK_SIZES,
    HEAD_DIMS,
    ragged_paged_attention,
    ragged_paged_attention_fused,
    ragged_paged_attention_fused_numpy_f64,
)
from xla_kernels.kernels.ragged_paged_attention.testing import (
    ARGS,
    TOLERANCES,
    make_inputs,
    mix,
    rel_error,
)

CPU = jax.devices("cpu")[0]
FUSED_ARGS = ("queries", "kv_cache", *ARGS[3:])


def fused_problem(rng, *, kind="mixed", dtype="bf16", head_dim=64, block_size=16,
                  heads=(8, 2), cache_dtype=None, kv_scales=(1.0, 1.0), **kwargs) -> dict:
    q_lens, kv_lens = mix(kind, rng)
    x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_q_heads=heads[0],
                    num_kv_heads=heads[1], head_dim=head_dim, block_size=block_size,
                    dtype=dtype, cache_dtype=cache_dtype, kv_scales=kv_scales, **kwargs)
    x["kv_cache"] = join_fused(x["key_cache"], x["value_cache"])
    return x


def attend(op, x: dict, args, **attrs) -> np.ndarray:
    f = jax.jit(lambda *a: op(*a, **attrs))
    return np.asarray(f(*(jax.device_put(x[k], CPU) for k in args)).astype(jnp.float32))


MATRIX = [(dtype, d, b, heads, kind) for (dtype, d, b), heads, kind in zip(
    itertools.product(("bf16", "f16", "f32"), HEAD_DIMS, BLOCK_SIZES),
    itertools.cycle([(8, 8), (8, 2), (4, 1)]),
    itertools.cycle(["mixed", "decode", "chunks", "primes", "prefill"]), strict=False)]


@pytest.mark.parametrize("dtype,head_dim,block_size,heads,kind", MATRIX[::3] + MATRIX[1::7])
def test_attention_on_the_fused_cache_matches_float64(rng, dtype, head_dim, block_size, heads,
                                                      kind):
    x = fused_problem(rng, kind=kind, dtype=dtype, head_dim=head_dim, block_size=block_size,
                      heads=heads)
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    out = attend(ragged_paged_attention_fused, x, FUSED_ARGS, scale=scale)
    ref = ragged_paged_attention_fused_numpy_f64(*(x[k] for k in FUSED_ARGS), scale=scale)
    assert not np.isnan(out).any(), "a slot no row attends (NaN) was read"
    assert rel_error(out, ref) <= TOLERANCES[dtype]


@pytest.mark.parametrize("cache_dtype,softcap,window", [("bf16", 0.0, 0), ("bf16", 9.0, 37),
                                                         (FP8, 0.0, 0), (FP8, 5.0, 20)])
def test_fused_cache_gives_what_the_two_caches_give_bit_for_bit(rng, cache_dtype, softcap,
                                                                window):
    scales = (0.05, 0.3) if cache_dtype == FP8 else (1.0, 1.0)
    x = fused_problem(rng, kind="mixed", cache_dtype=cache_dtype, kv_scales=scales,
                      sliding_window=window)
    attrs = dict(scale=0.11, softcap=softcap, sliding_window=window, k_scale=scales[0],
                 v_scale=scales[1])
    fused = attend(ragged_paged_attention_fused, x, FUSED_ARGS, **attrs)
    separate = attend(ragged_paged_attention, x, ARGS, **attrs)
    np.testing.assert_array_equal(fused, separate)


@pytest.mark.parametrize("block_size", [128, 256])
def test_block_sizes_128_and_256_in_both_layouts(rng, block_size):
    x = fused_problem(rng, kind="mixed", block_size=block_size, head_dim=128)
    ref = ragged_paged_attention_fused_numpy_f64(*(x[k] for k in FUSED_ARGS), scale=0.09)
    assert rel_error(attend(ragged_paged_attention_fused, x, FUSED_ARGS, scale=0.09),
                     ref) <= TOLERANCES["bf16"]
    assert rel_error(attend(ragged_paged_attention, x, ARGS, scale=0.09),
                     ref) <= TOLERANCES["bf16"]


def test_packed_5d_cache_gives_what_the_4d_cache_gives(rng):
    """tpu-inference's packed [blocks, block_size, merged, packing, head_dim] cache is the
    same memory as the 4-D fused layout: both ops take it as it is."""
    x = fused_problem(rng, kind="mixed", heads=(8, 2))
    four = x["kv_cache"]
    x["kv_cache"] = four.reshape(*four.shape[:2], 2, 2, four.shape[-1])
    packed = attend(ragged_paged_attention_fused, x, FUSED_ARGS, scale=0.1)
    x["kv_cache"] = four
    np.testing.assert_array_equal(packed, attend(ragged_paged_attention_fused, x, FUSED_ARGS,
                                                 scale=0.1))
    key, value, kv, slots = write_problem(rng, heads=2)
    got = jax.jit(reshape_and_cache_fused)(key, value, kv.reshape(*kv.shape[:2], 2, 2, -1),
                                           slots)
    assert got.shape == (*kv.shape[:2], 2, 2, kv.shape[-1])
    want = reshape_and_cache_fused_numpy(key, value, kv, slots)
    np.testing.assert_array_equal(np.asarray(got).reshape(want.shape).view(np.uint16),
                                  want.view(np.uint16))


def write_problem(rng, *, dtype="bf16", cache_dtype=None, tokens=11, heads=2, dim=64,
                  blocks=5, block_size=16):
    np_dtype = dtypes.to_numpy(dtype)
    key = rng.standard_normal((tokens, heads, dim)).astype(np_dtype)
    value = rng.standard_normal((tokens, heads, dim)).astype(np_dtype)
    # NaN everywhere: a slot the write must not touch stays NaN, bit for bit.
    kv = np.full((blocks, block_size, 2 * heads, dim), np.nan, np.float32).astype(
        dtypes.to_numpy(cache_dtype or dtype))
    capacity = blocks * block_size
    slots = rng.permutation(capacity)[:tokens].astype(np.int32)
    slots[:2] = (-1, capacity + 3)  # padding and out of range: skipped
    return key, value, kv, slots


@pytest.mark.parametrize("dtype,cache_dtype", [("bf16", None), ("f16", None), ("f32", None),
                                               ("bf16", FP8), ("f32", FP8)])
def test_write_into_the_fused_cache_matches_the_oracle(rng, dtype, cache_dtype):
    key, value, kv, slots = write_problem(rng, dtype=dtype, cache_dtype=cache_dtype)
    scales = dict(k_scale=0.25, v_scale=2.0) if cache_dtype == FP8 else {}
    write = jax.jit(lambda *a: reshape_and_cache_fused(*a, **scales), donate_argnums=(2,))
    got = np.asarray(write(key, value, jnp.asarray(kv), slots))
    want = reshape_and_cache_fused_numpy(key, value, kv, slots, **scales)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_write_lands_where_the_separate_caches_would(rng):
    key, value, kv, slots = write_problem(rng)
    k_cache, v_cache = (np.asarray(c) for c in split_fused(kv))
    fused = jax.jit(reshape_and_cache_fused)(key, value, kv, slots)
    separate = jax.jit(reshape_and_cache)(key, value, k_cache, v_cache, slots)
    np.testing.assert_array_equal(np.asarray(fused).view(np.uint16),
                                  join_fused(*separate).view(np.uint16))


def test_write_then_attend_in_one_program_aliases_the_donated_cache(rng):
    """The serving step's shape: new tokens written, then attended, the cache donated; the
    compiled program updates it in place (no copy of the cache)."""
    x = fused_problem(rng, kind="decode", poison=False)
    rows = x["queries"].shape[0]
    k = rng.standard_normal((rows, 2, 64)).astype(np.float32).astype(x["kv_cache"].dtype)
    slots = np.full(rows, -1, np.int32)

    def step(kv, q, k, slots, *md):
        kv = reshape_and_cache_fused(k, k, kv, slots)
        return kv, ragged_paged_attention_fused(q, kv, *md, scale=0.1)

    compiled = jax.jit(step, donate_argnums=(0,)).lower(
        x["kv_cache"], x["queries"], k, slots, *(x[a] for a in ARGS[3:])).compile()
    text = compiled.as_text()
    assert re.search(r"input_output_alias=\{ \{0\}: \(0, \{\}", text), text[:2000]
    _, out = compiled(jnp.asarray(x["kv_cache"]), x["queries"], k, slots,
                      *(x[a] for a in ARGS[3:]))
    ref = ragged_paged_attention_fused_numpy_f64(*(x[a] for a in FUSED_ARGS), scale=0.1)
    assert rel_error(out, ref) <= TOLERANCES["bf16"]


def test_ops_in_torch_eager_write_in_place_and_attend(rng):
    import torch

    from xla_kernels.frontends.torch import torch_op

    x = fused_problem(rng, kind="chunks", dtype="f32")
    key, value, _, slots = write_problem(rng, dtype="f32", heads=2, blocks=1)
    kv = torch.from_numpy(x["kv_cache"].copy())
    before = kv.clone()
    slots = np.minimum(slots, 5)  # slots 0..5 of block 0; padding stays -1
    torch_op(reshape_and_cache_fused)(torch.from_numpy(key), torch.from_numpy(value), kv,
                                      torch.from_numpy(slots))
    want = reshape_and_cache_fused_numpy(key, value, before.numpy(), slots)
    np.testing.assert_array_equal(kv.numpy(), want)
    out = torch_op(ragged_paged_attention_fused)(
        torch.from_numpy(x["queries"]), kv, *(torch.from_numpy(x[a]) for a in ARGS[3:]),
        scale=0.2)
    ref = ragged_paged_attention_fused_numpy_f64(x["queries"], want, *(x[a] for a in ARGS[3:]),
                                                 scale=0.2)
    assert rel_error(out.numpy(), ref) <= TOLERANCES["f32"]


def _specs(kv=(10, 16, 4, 64), q=(6, 8, 64), dtype="bf16", kv_dtype=None):
    return [xk.Spec(q, dtype), xk.Spec(kv, kv_dtype or dtype), xk.Spec((3,), "i32"),
            xk.Spec((3, 4), "i32"), xk.Spec((4,), "i32"), xk.Spec((1,), "i32")]


@pytest.mark.parametrize("specs,words", [
    (_specs(kv=(10, 16, 5, 64)), "2 * num_kv_heads"),
    (_specs(kv=(10, 16, 4, 128)), "head_dim 128"),
    (_specs(kv=(10, 16, 6, 64)), "not a multiple of num_kv_heads 3"),
    (_specs(kv=(10, 48, 4, 64)), "block_size 48"),
    (_specs(kv_dtype="f16"), "dtype f16"),
])
def test_attention_bad_cache_names_kv_cache_and_the_fix(specs, words):
    with pytest.raises(xk.OpInputError, match="argument 'kv_cache'") as e:
        ragged_paged_attention_fused.bind(specs, {"scale": 0.1})
    assert words in str(e.value) and "Fix:" in str(e.value)


@pytest.mark.parametrize("kv,key,words", [((4, 16, 3, 64), (2, 1, 64), "2 * num_kv_heads"),
                                          ((4, 16, 4, 64), (2, 3, 64), "2 kv heads"),
                                          ((4, 16, 4, 32), (2, 2, 64), "of size 32")])
def test_write_bad_cache_names_kv_cache_and_the_fix(kv, key, words):
    specs = [xk.Spec(key, "bf16"), xk.Spec(key, "bf16"), xk.Spec(kv, "bf16"),
             xk.Spec((key[0],), "i32")]
    with pytest.raises(xk.OpInputError, match="argument 'kv_cache'") as e:
        reshape_and_cache_fused.bind(specs, {})
    assert words in str(e.value) and "Fix:" in str(e.value)


def test_separate_cache_ops_refuse_the_fused_layout_name():
    specs = _specs()
    specs[1:1] = [specs[1]]  # key_cache, value_cache
    with pytest.raises(xk.OpInputError, match=r"argument 'layout'.*unknown layout 'fused'"):
        ragged_paged_attention.bind(specs, {"scale": 0.1, "layout": "fused"})
