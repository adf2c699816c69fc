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
