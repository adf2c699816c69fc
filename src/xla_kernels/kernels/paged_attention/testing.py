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

import numpy as np

from xla_kernels import dtypes
from xla_kernels.kernels.paged_testing import (
    SANITIZE_CASES,
    TOLERANCES,
    poison_unattended,
    random_paged_cache,
    rel_error,
)


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
    if seq_lens is None:
        seq_lens = random_seq_lens(rng, num_seqs, max_context or 256)
    lens = np.asarray(seq_lens, np.int64)
    if max_context is None:
        max_context = max(1, int(lens.max()))
    cache = random_paged_cache(rng, kv_lens=lens, table_rows=num_seqs, max_context=max_context,
                               num_kv_heads=num_kv_heads, head_dim=head_dim,
                               block_size=block_size, dtype=dtype, layout=layout,
                               extra_blocks=extra_blocks, cache_dtype=cache_dtype,
                               kv_scales=kv_scales)
    if poison:
        poison_unattended(cache, [(max(0, n - sliding_window) if sliding_window > 0 else 0, n)
                                  for n in cache["used"].tolist()], layout=layout)
    query = rng.standard_normal((num_seqs, num_q_heads, head_dim), np.float32)
    return {
        "query": query.astype(dtypes.to_numpy(dtype)),
        "key_cache": cache["key_cache"],
        "value_cache": cache["value_cache"],
        "block_tables": cache["block_tables"].astype(np.int32),
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
    for dtype, cache_dtype, d, layout, (hq, hkv) in SANITIZE_CASES:
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
