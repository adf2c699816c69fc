"""attend(): the fused K/V cache written and attended through xla-kernels' ops, against a
float64 NumPy reference written from tpu-inference's layout and the attention definition."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_kernels.vllm import attention


def _batch(rng, page_size, *, q_lens, ctx_lens, max_seqs=4, padded=16, kv_heads=2, q_heads=4,
           head_dim=64):
    """A mixed batch: sequence s has ctx_lens[s] tokens, its last q_lens[s] new this step."""
    pages_per_seq = -(-max(ctx_lens) // page_size)
    total_pages = max_seqs * pages_per_seq + 3
    perm = rng.permutation(total_pages)[: max_seqs * pages_per_seq].astype(np.int32)
    n = len(q_lens)
    seq_lens = np.zeros(max_seqs, np.int32)
    seq_lens[:n] = ctx_lens
    cu = np.zeros(max_seqs + 1, np.int32)
    cu[1 : n + 1] = np.cumsum(q_lens)
    cu[n + 1 :] = cu[n]
    md = attention.Metadata(jnp.asarray(seq_lens), jnp.asarray(perm), jnp.asarray(cu),
                            jnp.asarray(np.array([0, 0, n], np.int32)))
    shape = attention.kv_cache_shape(total_pages, page_size, kv_heads, head_dim, jnp.float32)
    cache = rng.standard_normal(shape).astype(np.float32)
    q = rng.standard_normal((padded, q_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((padded, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((padded, kv_heads, head_dim)).astype(np.float32)
    return cache, q, k, v, md


def _reference(cache, q, k, v, md, page_size, scale):
    cache = cache.astype(np.float64).copy()
    pages, _, merged, packing, dim = cache.shape
    flat = cache.reshape(pages, page_size, merged * packing, dim)
    seq_lens, table, cu = (np.asarray(x) for x in md[:3])
    n = int(md.request_distribution[2])
    table = table.reshape(len(seq_lens), -1)
    kv_heads, group = k.shape[1], q.shape[1] // k.shape[1]
    out = np.zeros(q.shape, np.float64)
    for s in range(n):
        q_len = cu[s + 1] - cu[s]
        for i in range(q_len):
            pos = seq_lens[s] - q_len + i
            page, off = table[s, pos // page_size], pos % page_size
            flat[page, off, 0 : 2 * kv_heads : 2] = k[cu[s] + i]
            flat[page, off, 1 : 2 * kv_heads : 2] = v[cu[s] + i]
    for s in range(n):
        q_len = cu[s + 1] - cu[s]
        ctx = np.arange(seq_lens[s])
        slots = flat[table[s, ctx // page_size], ctx % page_size]   # [ctx, 2*kv, dim]
        for i in range(q_len):
            pos = seq_lens[s] - q_len + i
            for h in range(q.shape[1]):
                keys = slots[: pos + 1, 2 * (h // group)]
                vals = slots[: pos + 1, 2 * (h // group) + 1]
                logits = keys @ q[cu[s] + i, h] * scale
                w = np.exp(logits - logits.max())
                out[cu[s] + i, h] = (w / w.sum()) @ vals
    return flat.reshape(cache.shape), out


@pytest.mark.parametrize("page_size", [16, 64, 128])
def test_attend_matches_reference(page_size):
    rng = np.random.default_rng(page_size)
    cache, q, k, v, md = _batch(rng, page_size, q_lens=[5, 1, 3], ctx_lens=[5, 70, 130])
    scale = 64 ** -0.5
    got_cache, got = jax.jit(lambda c, *a: attention.attend(c, *a, scale=scale))(
        jnp.asarray(cache), q, k, v, md)
    want_cache, want = _reference(cache, q, k, v, md, page_size, scale)
    np.testing.assert_allclose(np.asarray(got), want.astype(np.float32), atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(np.asarray(got_cache), want_cache.astype(np.float32))
    assert not np.asarray(got[9:]).any(), "padding rows are zeros"


def test_no_update_leaves_the_cache():
    rng = np.random.default_rng(1)
    cache, q, k, v, md = _batch(rng, 64, q_lens=[1, 1], ctx_lens=[9, 33])
    got_cache, _ = attention.attend(jnp.asarray(cache), q, k, v, md, scale=0.1,
                                    update_kv_cache=False)
    np.testing.assert_array_equal(np.asarray(got_cache), cache)


def test_slot_mapping_marks_padding_rows():
    md = attention.Metadata(jnp.array([3, 17, 0], jnp.int32), jnp.arange(6, dtype=jnp.int32),
                            jnp.array([0, 3, 4, 4], jnp.int32), jnp.array([1, 1, 2], jnp.int32))
    slots = attention.slot_mapping(md, 6, page_size=16)
    # seq 0: positions 0..2 in page 0; seq 1: position 16 is page 1 of its row (page id 3).
    assert np.asarray(slots).tolist() == [0, 1, 2, 3 * 16 + 0, -1, -1]


def test_page_size_our_ops_cannot_split_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        attention.sub_block_size(24)


@pytest.mark.parametrize("page_size", [64, 256])
def test_donated_cache_is_updated_in_place_without_a_copy(page_size):
    """The runner donates the cache: the compiled step aliases it to the result and holds
    no copy of anything cache-sized (the fused-cache ops read and write it where it lies)."""
    rng = np.random.default_rng(3)
    cache, q, k, v, md = _batch(rng, page_size, q_lens=[5, 1], ctx_lens=[5, 300])
    step = jax.jit(lambda c, *a: attention.attend(c, *a, scale=0.125), donate_argnums=(0,))
    text = step.lower(jnp.asarray(cache), q, k, v, md).compile().as_text()
    assert "input_output_alias={ {0}: (0, {}" in text
    cache_elems = int(np.prod(cache.shape))
    copies = [line for line in text.splitlines()
              if re.search(r"= f32\[[\d,]+\]\{[\d,]*\} copy\(", line)
              and np.prod([int(x) for x in re.search(r"f32\[([\d,]+)\]", line)[1].split(",")])
              >= cache_elems]
    assert not copies, copies
