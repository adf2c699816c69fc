"""reshape_and_cache on the CPU: every token lands in its slot and nothing else changes,
in every frontend, with the caches updated in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels import dtypes
from xla_kernels.frontends.torch import schema, torch_op
from xla_kernels.kernels.kv_cache import (
    reshape_and_cache,
    reshape_and_cache_numpy,
    reshape_and_cache_xla,
)

SHAPES = {"vllm": lambda blocks, bs, h, d: (blocks, bs, h, d),
          "pallas": lambda blocks, bs, h, d: (h, blocks, bs, d)}


def make(rng, *, tokens=13, heads=3, dim=64, blocks=7, block_size=16, layout="vllm",
         dtype="f32"):
    """Random rows, NaN-filled caches (an untouched slot must stay NaN, bit for bit), and a
    slot mapping with distinct in-range slots, padding (-1) and out-of-range slots."""
    np_dtype = dtypes.to_numpy(dtype)
    key = rng.standard_normal((tokens, heads, dim)).astype(np_dtype)
    value = rng.standard_normal((tokens, heads, dim)).astype(np_dtype)
    shape = SHAPES[layout](blocks, block_size, heads, dim)
    key_cache = np.full(shape, np.nan, np_dtype)
    value_cache = np.full(shape, np.nan, np_dtype)
    capacity = blocks * block_size
    slots = rng.permutation(capacity)[:tokens].astype(np.int32)
    slots[rng.random(tokens) < 0.2] = -1
    slots[rng.random(tokens) < 0.1] = capacity + rng.integers(0, 5)
    return key, value, key_cache, value_cache, slots


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("dim", [64, 40, 3])
def test_jax_writes_each_slot_and_nothing_else(rng, layout, dtype, dim):
    args = make(rng, layout=layout, dtype=dtype, dim=dim)
    want = reshape_and_cache_numpy(*args, layout=layout)
    got = jax.jit(lambda *a: reshape_and_cache(*a, layout=layout))(*args)
    assert same(got[0], want[0]) and same(got[1], want[1])


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
def test_plain_xla_fallback_matches_the_oracle(rng, layout):
    args = make(rng, layout=layout)
    want = reshape_and_cache_numpy(*args, layout=layout)
    got = jax.jit(lambda *a: reshape_and_cache_xla(*a, layout=layout))(*args)
    assert same(got[0], want[0]) and same(got[1], want[1])


def test_no_tokens_and_all_padding_change_nothing(rng):
    key, value, kc, vc, slots = make(rng)
    out = reshape_and_cache(key, value, kc, vc, np.full_like(slots, -1))
    assert same(out[0], kc) and same(out[1], vc)
    out = reshape_and_cache(key[:0], value[:0], kc, vc, slots[:0])
    assert same(out[0], kc)


def test_under_donation_the_caches_are_aliased_and_not_copied(rng):
    key, value, kc, vc, slots = make(rng)
    write = jax.jit(reshape_and_cache, donate_argnums=(2, 3))
    compiled = write.lower(key, value, kc, vc, slots).compile().as_text()
    assert "input_output_alias" in compiled and " copy(" not in compiled
    want = reshape_and_cache_numpy(key, value, kc, vc, slots)
    got = write(jnp.asarray(key), jnp.asarray(value), jnp.asarray(kc), jnp.asarray(vc),
                jnp.asarray(slots))
    assert same(got[0], want[0]) and same(got[1], want[1])


def test_without_donation_the_callers_caches_are_unchanged(rng):
    key, value, kc, vc, slots = make(rng)
    cache = jnp.asarray(kc)
    jax.jit(reshape_and_cache)(key, value, cache, jnp.asarray(vc), slots)
    assert same(cache, kc)


def test_is_one_custom_call_aliasing_both_caches(rng):
    args = make(rng)
    text = jax.jit(reshape_and_cache).lower(*args).as_text("hlo")
    xk.assert_single_custom_call(text, "xla_kernels.reshape_and_cache")
    assert "output_to_operand_aliasing={{0}: (2, {}), {1}: (3, {})}" in text


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
def test_torch_mutates_the_caches_and_returns_nothing(rng, layout):
    key, value, kc, vc, slots = make(rng, layout=layout, dtype="bf16")
    want = reshape_and_cache_numpy(key, value, kc, vc, slots, layout=layout)
    t = [torch.from_numpy(np.asarray(a).view(np.uint16)).view(torch.bfloat16)
         for a in (key, value, kc, vc)]
    op = torch_op(reshape_and_cache)
    assert schema(reshape_and_cache).startswith(
        "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, ")
    assert op(*t, torch.from_numpy(slots), layout=layout) is None
    for tensor, expected in zip(t[2:], want, strict=True):
        assert tensor.view(torch.uint16).numpy().tobytes() == np.asarray(expected).tobytes()


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
def test_torchax_mutates_the_caches_bit_for_bit(rng, layout):
    from xla_kernels.frontends.torchax import import_torchax, register_torchax

    register_torchax(reshape_and_cache)
    env = import_torchax().default_env()
    key, value, kc, vc, slots = make(rng, layout=layout)
    want = reshape_and_cache_numpy(key, value, kc, vc, slots, layout=layout)
    with env:
        t = [torch.from_numpy(a).to("jax") for a in (key, value, kc, vc, slots)]
        assert torch.ops.xla_kernels.reshape_and_cache(*t, layout=layout) is None
        for tensor, expected in zip(t[2:4], want, strict=True):
            assert same(tensor.to("cpu").numpy(), expected)


def test_torch_op_passes_opcheck(rng):
    key, value, kc, vc, slots = make(rng)
    args = [torch.from_numpy(a) for a in (key, value, np.nan_to_num(kc), np.nan_to_num(vc),
                                          slots)]
    torch.library.opcheck(torch_op(reshape_and_cache), args)


@pytest.mark.parametrize("bad, match", [
    (dict(layout="nhd"), r"argument 'layout': unknown layout 'nhd'"),
    (dict(value_dtype="f16"), r"argument 'value': dtype f16 differs from key's f32"),
    (dict(cache_heads=4), r"argument 'key_cache': shape .* has 4 kv heads of size 64, key "
                          r"has 3 of 64. Fix: pass a cache for these heads"),
    (dict(slots=5), r"argument 'slot_mapping': expected shape \(13,\), got \(5,\)"),
])
def test_bad_inputs_name_the_argument_and_the_fix(rng, bad, match):
    key, value, kc, vc, slots = make(rng)
    if "value_dtype" in bad:
        value = value.astype(np.float16)
    if "cache_heads" in bad:
        kc = vc = np.zeros((7, 16, 4, 64), np.float32)
    if "slots" in bad:
        slots = slots[:5]
    with pytest.raises(xk.OpInputError, match="xla_kernels.reshape_and_cache: " + match):
        reshape_and_cache(key, value, kc, vc, slots, layout=bad.get("layout", "vllm"))


# ------------------------------------------------------------------ fp8 caches

FP8 = "f8e4m3fn"
EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 448.0, 464.0, 465.0,
                  -470.0, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 1e-12, 0.3, -2.75, 1.0625],
                 np.float32)


def make_fp8(rng, *, dtype="bf16", scales=(0.05, 0.02), **kw):
    """make() with fp8 caches (NaN-filled: untouched slots must stay NaN, bit for bit), rows
    scaled so they span the e4m3 range after division by the scale, and the edge values
    (+-inf, NaN, beyond 448, subnormals, ties) among the key's elements."""
    key, value, kc, vc, slots = make(rng, dtype="f32", **kw)
    key = key * np.float32(rng.choice([0.01, 1.0, 30.0], size=key.shape))
    flat = key.reshape(-1)
    flat[:EDGES.size] = EDGES[:flat.size] * np.float32(scales[0])
    np_dtype, fp8 = dtypes.to_numpy(dtype), dtypes.to_numpy(FP8)
    with np.errstate(over="ignore"):  # 1e30 is inf in f16: one more edge
        key = key.astype(np_dtype)
    return (key, value.astype(np_dtype), kc.astype(fp8), vc.astype(fp8),
            slots), dict(k_scale=scales[0], v_scale=scales[1])


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("dim", [64, 40, 3])
def test_fp8_cache_writes_quantized_rows_bit_for_bit(rng, layout, dtype, dim):
    args, scales = make_fp8(rng, layout=layout, dtype=dtype, dim=dim)
    want = reshape_and_cache_numpy(*args, layout=layout, **scales)
    got = jax.jit(lambda *a: reshape_and_cache(*a, layout=layout, **scales))(*args)
    assert got[0].dtype == np.dtype(dtypes.to_numpy(FP8))
    assert same(got[0], want[0]) and same(got[1], want[1])


def test_fp8_quantization_rounds_to_nearest_even_and_saturates(rng):
    """The oracle's own rule, spelled out: x / scale, ties to even, +-448 for anything
    beyond (infinities too), NaN stays NaN, below half the smallest subnormal is 0."""
    key = np.array([[[448.0, 500.0, np.inf, -np.inf, np.nan, 2.0**-10, 2.0**-11, 17.0]]],
                   np.float32) * np.float32(0.5)
    cache = np.full((1, 16, 1, 8), np.nan, dtypes.to_numpy(FP8))
    kc, _ = reshape_and_cache(key, key, cache, cache, np.array([3], np.int32), k_scale=0.5,
                              v_scale=0.5)
    row = np.asarray(kc)[0, 3, 0].astype(np.float32)
    np.testing.assert_array_equal(row[[0, 1, 2, 3, 5, 6, 7]],
                                  [448, 448, 448, -448, 0, 0, 16])  # 17 ties to 16
    assert np.isnan(row[4])


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
def test_fp8_plain_xla_fallback_matches_the_oracle(rng, layout):
    args, scales = make_fp8(rng, layout=layout)
    want = reshape_and_cache_numpy(*args, layout=layout, **scales)
    got = jax.jit(lambda *a: reshape_and_cache_xla(*a, layout=layout, **scales))(*args)
    assert same(got[0], want[0]) and same(got[1], want[1])


def test_fp8_torch_mutates_float8_caches(rng):
    (key, value, kc, vc, slots), scales = make_fp8(rng, dtype="f16", layout="pallas")
    want = reshape_and_cache_numpy(key, value, kc, vc, slots, layout="pallas", **scales)
    caches = [torch.from_numpy(c.view(np.uint8).copy()).view(torch.float8_e4m3fn)
              for c in (kc, vc)]
    torch_op(reshape_and_cache)(torch.from_numpy(key), torch.from_numpy(value), *caches,
                                torch.from_numpy(slots), layout="pallas", **scales)
    for tensor, expected in zip(caches, want, strict=True):
        assert tensor.view(torch.uint8).numpy().tobytes() == np.asarray(expected).tobytes()


def test_fp8_written_cache_feeds_paged_attention(rng):
    """reshape_and_cache into fp8 caches, then paged_attention over them: the float64
    attention over the dequantized cache, to the bf16 tolerance."""
    from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
    from xla_kernels.kernels.paged_attention.testing import TOLERANCES, rel_error

    heads, dim, block_size, blocks, tokens = 2, 64, 16, 6, 70
    key = rng.standard_normal((tokens, heads, dim)).astype(dtypes.to_numpy("bf16"))
    value = rng.standard_normal((tokens, heads, dim)).astype(dtypes.to_numpy("bf16"))
    cache = np.full((blocks, block_size, heads, dim), np.nan, dtypes.to_numpy(FP8))
    table = rng.permutation(blocks)[:5].astype(np.int32)
    slots = (table[np.arange(tokens) // block_size] * block_size
             + np.arange(tokens) % block_size).astype(np.int32)
    scales = dict(k_scale=0.01, v_scale=0.02)
    kc, vc = reshape_and_cache(key, value, cache, cache, slots, **scales)
    query = rng.standard_normal((1, 8, dim)).astype(dtypes.to_numpy("bf16"))
    args = (query, kc, vc, table[None], np.array([tokens], np.int32))
    out = paged_attention(*args, scale=0.125, **scales)
    ref = paged_attention_numpy_f64(*args, scale=0.125, **scales)
    assert rel_error(out, ref) <= TOLERANCES["bf16"]
    plain = reshape_and_cache_numpy(key, value, *(np.zeros(cache.shape, key.dtype),) * 2, slots)
    exact = paged_attention_numpy_f64(query, *plain, *args[3:], scale=0.125)
    assert rel_error(out, exact) < 0.1  # e4m3 keeps ~2 significant digits


@pytest.mark.parametrize("bad, match", [
    (dict(key=FP8), r"argument 'key': dtype f8e4m3fn is not supported. Fix: pass one of "
                    r"bf16, f16, f32"),
    (dict(value_cache="bf16"), r"argument 'value_cache': dtype bf16 differs from key_cache's "
                               r"f8e4m3fn. Fix: store both caches in one dtype"),
    (dict(key_cache="f16", value_cache="f16"),
     r"argument 'key_cache': dtype f16 differs from key's bf16. Fix: cast key, value and the "
     r"caches to one dtype, or use f8e4m3fn caches"),
    (dict(k_scale=0.0), r"argument 'k_scale': must be finite and > 0, got 0.0"),
    (dict(v_scale=-1.0), r"argument 'v_scale': must be finite and > 0, got -1.0"),
    (dict(k_scale=float("inf")), r"argument 'k_scale': must be finite and > 0, got inf"),
    (dict(v_scale=float("nan")), r"argument 'v_scale': must be finite and > 0, got nan"),
    (dict(key_cache="bf16", value_cache="bf16", k_scale=2.0),
     r"argument 'k_scale': is 2.0, but the caches are bf16: scales apply to f8e4m3fn caches "
     r"only. Fix: pass k_scale=1.0, or f8e4m3fn caches"),
])
def test_fp8_bad_inputs_name_the_argument_and_the_fix(rng, bad, match):
    (key, value, kc, vc, slots), scales = make_fp8(rng)
    arrays = dict(key=key, value=value, key_cache=kc, value_cache=vc)
    for name in arrays:
        if name in bad:
            arrays[name] = arrays[name].astype(dtypes.to_numpy(bad[name]))
    scales.update({k: v for k, v in bad.items() if k.endswith("_scale")})
    with pytest.raises(xk.OpInputError, match="xla_kernels.reshape_and_cache: " + match):
        reshape_and_cache(*arrays.values(), slots, **scales)


def test_fp8_handler_validates_scales_itself(rng):
    from xla_kernels.runtime.eager import Buffer, KernelError, call_handler
    from xla_kernels.runtime.library import load_kernel

    (key, value, kc, vc, slots), _ = make_fp8(rng)
    fn = load_kernel(reshape_and_cache, "cpu").function
    bufs = [Buffer.from_array(a) for a in (key, value, kc, vc, slots)]
    with pytest.raises(KernelError, match="argument 'v_scale': must be finite and > 0"):
        call_handler(fn, args=bufs, rets=bufs[2:4], op_name=reshape_and_cache.name,
                     attrs={"layout": "vllm", "k_scale": np.float32(1.0),
                            "v_scale": np.float32(0.0)})
