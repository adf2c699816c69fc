"""Random paged-attention problems for tests and benchmarks.

:func:`make_inputs` builds a batch with ragged lengths, shuffled physical blocks, unused
block-table entries filled with out-of-range ids, and (by default) every cache slot that
must not be read poisoned with NaN: unused blocks, the tail of each sequence's last block,
and the slots before a sliding window. A kernel that reads any of them returns NaN.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = make_inputs(rng, num_seqs=3, num_q_heads=8, num_kv_heads=2, head_dim=64,
    ...                 block_size=16, dtype="bf16", seq_lens=[1, 17, 40])
    >>> x["query"].shape, x["key_cache"].shape[1:], x["block_tables"].shape
    ((3, 8, 64), (16, 2, 64), (3, 3))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from xla_kernels import dtypes
from xla_kernels.kernels.paged_cache import quantize_fp8

TOLERANCES = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}
"""Relative Frobenius error allowed against the float64 reference, per query dtype (with fp8
caches too: the reference then reads the dequantized cache, so the cache's own rounding is
not an error of the kernel, and the kernel is held to the bf16/f16 kernel's bound)."""


def rel_error(out: Any, ref: np.ndarray) -> float:
    """``||out - ref|| / ||ref||`` in float64 (NaN anywhere gives NaN).

    Example:
        >>> rel_error(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
        0.0
    """
    out = np.asarray(out).astype(np.float64)
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def random_seq_lens(rng: np.random.Generator, num_seqs: int, max_context: int) -> list[int]:
    """Ragged lengths in [1, max_context]; includes 1 and the capacity when there is room.

    Example:
        >>> lens = random_seq_lens(np.random.default_rng(1), 4, 100)
        >>> min(lens) >= 1 and max(lens) <= 100
        True
    """
    lens = rng.integers(1, max_context + 1, size=num_seqs)
    if num_seqs >= 2:
        lens[0] = 1
        lens[1] = max_context
    return [int(x) for x in rng.permutation(lens)]


def make_inputs(
    rng: np.random.Generator,
    *,
    num_seqs: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: str,
    layout: str = "vllm",
    seq_lens: Sequence[int] | None = None,
    max_context: int | None = None,
    extra_blocks: int = 3,
    sliding_window: int = 0,
    poison: bool = True,
    cache_dtype: str | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> dict[str, np.ndarray]:
    """A random problem as NumPy arrays (keys: query, key_cache, value_cache, block_tables,
    seq_lens).

    ``seq_lens`` default to :func:`random_seq_lens`; ``max_context`` (default: the longest
    length) sets ``max_blocks_per_seq``. Lengths may exceed the capacity or be <= 0 (to
    test clamping); only in-capacity tokens get blocks. ``cache_dtype="f8e4m3fn"`` stores
    standard-normal keys and values quantized with ``kv_scales`` (stored = x / scale,
    saturated), as ``reshape_and_cache`` would; the caches default to ``dtype``.
    """
    np_dtype = dtypes.to_numpy(dtype)
    cache_np_dtype = dtypes.to_numpy(cache_dtype or dtype)
    if seq_lens is None:
        seq_lens = random_seq_lens(rng, num_seqs, max_context or 256)
    lens = np.asarray(seq_lens, np.int64)
    if max_context is None:
        max_context = max(1, int(lens.max()))
    max_blocks = -(-max_context // block_size)
    capacity = max_blocks * block_size
    used = np.clip(lens, 0, capacity)
    blocks_needed = -(-used // block_size)
    num_blocks = int(blocks_needed.sum()) + extra_blocks
    perm = rng.permutation(num_blocks)
    # Unused entries: ids that must never be dereferenced.
    junk = np.array([-1, num_blocks, num_blocks + 7, -(2**31), 2**31 - 1], np.int64)
    tables = rng.choice(junk, size=(num_seqs, max_blocks))
    at = 0
    for s in range(num_seqs):
        n = int(blocks_needed[s])
        tables[s, :n] = perm[at:at + n]
        at += n

    def cache(scale: float) -> np.ndarray:
        shape = ((num_blocks, block_size, num_kv_heads, head_dim) if layout == "vllm"
                 else (num_kv_heads, num_blocks, block_size, head_dim))
        x = rng.standard_normal(shape, np.float32)
        if cache_np_dtype == np_dtype:
            return x.astype(np_dtype)
        return quantize_fp8(x, scale)

    key_cache, value_cache = cache(kv_scales[0]), cache(kv_scales[1])
    if poison:
        attended = np.zeros((num_blocks, block_size), bool)
        for s in range(num_seqs):
            lo = max(0, int(used[s]) - sliding_window) if sliding_window > 0 else 0
            for t in range(lo, int(used[s])):
                attended[tables[s, t // block_size], t % block_size] = True
        for c in (key_cache, value_cache):
            if layout == "vllm":
                c[~attended] = np.nan
            else:
                c[:, ~attended] = np.nan
    query = rng.standard_normal((num_seqs, num_q_heads, head_dim), np.float32).astype(np_dtype)
    return {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_tables": tables.astype(np.int32),
        "seq_lens": lens.astype(np.int32),
    }


def sanitize_cases(platform: str = "gpu") -> None:
    """Small runs of the kernel for compute-sanitizer (memcheck, racecheck): every dtype and
    head_dim, both layouts, GQA and MQA, one and several partitions, out-of-range block ids
    and empty sequences. Raises AssertionError if a result is off.

    Example:
        >>> sanitize_cases("cpu")                                   # doctest: +SKIP
    """
    import jax

    from . import paged_attention, paged_attention_numpy_f64

    device = jax.devices(platform)[0]
    rng = np.random.default_rng(1234)
    names = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")
    cases = [(dtype, d, layout, heads) for dtype in ("bf16", "f16", "f32") for d in (64, 128, 256)
             for layout, heads in (("vllm", (8, 2)), ("pallas", (4, 4)))]
    cases += [("bf16", 128, "vllm", (32, 1)), ("f32", 64, "pallas", (16, 1))]
    cases = [(dtype, None, *rest) for dtype, *rest in cases]
    # fp8 caches: both query dtypes, every head_dim, both layouts, MQA.
    cases += [(dtype, "f8e4m3fn", d, layout, heads) for dtype in ("bf16", "f16")
              for d in (64, 128, 256) for layout, heads in (("vllm", (8, 2)), ("pallas", (4, 4)))]
    cases += [("bf16", "f8e4m3fn", 128, "vllm", (32, 1))]
    for dtype, cache_dtype, d, layout, (hq, hkv) in cases:
        scales = (0.05, 0.02) if cache_dtype else (1.0, 1.0)
        x = make_inputs(rng, num_seqs=3, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                        block_size=16, dtype=dtype, layout=layout, seq_lens=[0, 37, 1200],
                        max_context=1300, cache_dtype=cache_dtype, kv_scales=scales)
        x["block_tables"][2, 3] = -5
        attrs = dict(scale=0.1, layout=layout, k_scale=scales[0], v_scale=scales[1])
        args = [jax.device_put(x[k], device) for k in names]
        out = paged_attention(*args, **attrs)
        ref = paged_attention_numpy_f64(*(x[k] for k in names), **attrs)
        err = rel_error(out, ref)
        assert err <= TOLERANCES[dtype], (dtype, cache_dtype, d, layout, hq, hkv, err)


__all__ = ["TOLERANCES", "make_inputs", "random_seq_lens", "rel_error", "sanitize_cases"]
