"""What the random problems of ``paged_attention`` and ``ragged_paged_attention`` share
(their ``testing`` modules build on it): a paged cache with shuffled physical blocks and
out-of-range ids in the unused block-table entries, NaN in every slot no query attends, the
error measure and its tolerances, and the grid of compute-sanitizer cases.

Example:
    >>> rng = np.random.default_rng(0)
    >>> c = random_paged_cache(rng, kv_lens=[1, 20], table_rows=3, max_context=32,
    ...                        num_kv_heads=2, head_dim=64, block_size=16, dtype="bf16")
    >>> c["key_cache"].shape, c["block_tables"].shape, c["used"].tolist()
    ((6, 16, 2, 64), (3, 2), [1, 20])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from xla_kernels import dtypes
from xla_kernels.kernels.paged_cache import FP8, quantize_fp8

TOLERANCES = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}
"""Relative Frobenius error allowed against the float64 reference, per query dtype (with fp8
caches too: the reference then reads the dequantized cache, so the cache's own rounding is
not an error of the kernel, and the kernel is held to the bf16/f16 kernel's bound)."""

SANITIZE_CASES = [
    *[(dtype, None, d, layout, heads) for dtype in ("bf16", "f16", "f32") for d in (64, 128, 256)
      for layout, heads in (("vllm", (8, 2)), ("pallas", (4, 4)))],
    ("bf16", None, 128, "vllm", (32, 1)), ("f32", None, 64, "pallas", (16, 1)),
    # fp8 caches: both query dtypes, every head_dim, both layouts, MQA.
    *[(dtype, FP8, d, layout, heads) for dtype in ("bf16", "f16") for d in (64, 128, 256)
      for layout, heads in (("vllm", (8, 2)), ("pallas", (4, 4)))],
    ("bf16", FP8, 128, "vllm", (32, 1)),
]
"""The compute-sanitizer grid both ops run: (dtype, cache_dtype, head_dim, layout,
(num_q_heads, num_kv_heads)) for every dtype and head_dim, both layouts, GQA and MQA."""


def rel_error(out: Any, ref: np.ndarray) -> float:
    """``||out - ref|| / ||ref||`` in float64 (NaN anywhere gives NaN).

    Example:
        >>> rel_error(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
        0.0
    """
    out = np.asarray(out).astype(np.float64)
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def random_paged_cache(
    rng: np.random.Generator,
    *,
    kv_lens: Sequence[int],
    table_rows: int,
    max_context: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: str,
    layout: str = "vllm",
    extra_blocks: int = 3,
    cache_dtype: str | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> dict[str, np.ndarray]:
    """A random cache holding ``len(kv_lens)`` sequences (keys: key_cache, value_cache,
    block_tables [table_rows, ceil(max_context / block_size)] int64, used: each length
    clipped to [0, capacity]). Only in-capacity tokens get blocks, shuffled over the cache
    with ``extra_blocks`` unused ones; every other table entry is an out-of-range id.
    ``cache_dtype="f8e4m3fn"`` stores standard-normal keys and values quantized with
    ``kv_scales`` (stored = x / scale, saturated), as ``reshape_and_cache`` would; the caches
    default to ``dtype``."""
    np_dtype = dtypes.to_numpy(dtype)
    cache_np_dtype = dtypes.to_numpy(cache_dtype or dtype)
    max_blocks = -(-max_context // block_size)
    used = np.clip(np.asarray(kv_lens, np.int64), 0, max_blocks * block_size)
    blocks_needed = -(-used // block_size)
    num_blocks = int(blocks_needed.sum()) + extra_blocks
    perm = rng.permutation(num_blocks)
    # Unused entries: ids that must never be dereferenced.
    junk = np.array([-1, num_blocks, num_blocks + 7, -(2**31), 2**31 - 1], np.int64)
    tables = rng.choice(junk, size=(table_rows, max_blocks))
    at = 0
    for s, n in enumerate(blocks_needed.tolist()):
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
    return {"key_cache": key_cache, "value_cache": value_cache, "block_tables": tables,
            "used": used}


def poison_unattended(cache: dict[str, np.ndarray], attended: Sequence[tuple[int, int]], *,
                      layout: str = "vllm") -> None:
    """Write NaN into every slot of ``cache`` (a :func:`random_paged_cache` result) outside
    the positions ``[lo, hi)`` each sequence attends (``attended[s]``): a kernel that reads
    any of them returns NaN."""
    tables, key_cache = cache["block_tables"], cache["key_cache"]
    num_blocks, block_size = (key_cache.shape[:2] if layout == "vllm"
                              else key_cache.shape[1:3])
    mask = np.zeros((num_blocks, block_size), bool)
    for s, (lo, hi) in enumerate(attended):
        for t in range(lo, hi):
            mask[tables[s, t // block_size], t % block_size] = True
    for c in (key_cache, cache["value_cache"]):
        if layout == "vllm":
            c[~mask] = np.nan
        else:
            c[:, ~mask] = np.nan


__all__ = ["SANITIZE_CASES", "TOLERANCES", "poison_unattended", "random_paged_cache",
           "rel_error"]
