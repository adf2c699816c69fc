"""Random ragged paged-attention problems for tests and benchmarks.

:func:`make_inputs` builds a batch from per-sequence query and context lengths: padded
query rows, sequence slots beyond ``num_seqs``, shuffled physical blocks, unused block-table
entries filled with out-of-range ids, and (by default) every cache slot no query row attends
poisoned with NaN (unused blocks, the tail of each sequence's last block, slots before every
row's sliding window). A kernel that reads any of them returns NaN.

Example:
    >>> import numpy as np
    >>> x = make_inputs(np.random.default_rng(0), q_lens=[1, 5, 3], kv_lens=[9, 40, 3],
    ...                 num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
    ...                 dtype="bf16", num_tokens=12, max_seqs=4)
    >>> x["queries"].shape, x["cu_q_lens"].tolist(), x["num_seqs"].tolist()
    ((12, 4, 64), [0, 1, 6, 9, 9], [3])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xla_kernels import dtypes
from xla_kernels.kernels.paged_cache import FP8
from xla_kernels.kernels.paged_testing import (
    SANITIZE_CASES,
    TOLERANCES,
    poison_unattended,
    random_paged_cache,
    rel_error,
)

ARGS = ("queries", "key_cache", "value_cache", "kv_lens", "block_tables", "cu_q_lens",
        "num_seqs")
"""The op's inputs, in order (keys of :func:`make_inputs`' result)."""


def mix(kind: str, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(q_lens, kv_lens) of a named batch shape.

    Kinds: ``decode`` (every q_len 1), ``prefill`` (one long prompt, q_len = kv_len),
    ``chunks`` (many short chunks of longer contexts), ``mixed`` (decode + chunked prefill +
    a full prompt), ``primes`` (prime lengths), ``long`` (1000+ query tokens).

    Example:
        >>> mix("prefill", np.random.default_rng(0))
        ([300], [300])
    """
    if kind == "decode":
        kv = [int(x) for x in rng.integers(1, 300, size=7)]
        return [1] * len(kv), kv
    if kind == "prefill":
        return [300], [300]
    if kind == "chunks":
        q = [int(x) for x in rng.integers(1, 24, size=9)]
        return q, [qi + int(rng.integers(0, 200)) for qi in q]
    if kind == "mixed":
        return [1, 1, 37, 1, 64, 5, 1], [250, 1, 100, 77, 64, 5, 190]
    if kind == "primes":
        return [2, 3, 5, 7, 11, 13, 17], [31, 3, 37, 7, 113, 47, 17]
    if kind == "long":
        return [1031, 1, 7], [1100, 513, 7]
    raise ValueError(f"unknown mix {kind!r}")


def make_inputs(
    rng: np.random.Generator,
    *,
    q_lens: Sequence[int],
    kv_lens: Sequence[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: str,
    layout: str = "vllm",
    num_tokens: int | None = None,
    max_seqs: int | None = None,
    max_context: int | None = None,
    extra_blocks: int = 3,
    sliding_window: int = 0,
    poison: bool = True,
    cache_dtype: str | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> dict[str, np.ndarray]:
    """A random problem as NumPy arrays, keyed by :data:`ARGS`.

    ``num_tokens`` (default ``sum(q_lens) + 3``) pads the queries; ``max_seqs`` (default
    ``len(q_lens) + 1``) adds unused sequence slots; ``max_context`` (default the longest
    kv_len) sets ``max_blocks_per_seq``. The padded query rows hold random values (the op
    must return zeros there). ``q_len <= kv_len`` is expected; the op's clamping of other
    values is tested by editing the arrays afterwards. ``cache_dtype="f8e4m3fn"`` stores
    standard-normal keys and values quantized with ``kv_scales`` (stored = x / scale,
    saturated), as ``reshape_and_cache`` would; the caches default to ``dtype``.
    """
    q_lens = [int(x) for x in q_lens]
    kv = np.asarray(kv_lens, np.int64)
    n = len(q_lens)
    num_tokens = sum(q_lens) + 3 if num_tokens is None else num_tokens
    max_seqs = n + 1 if max_seqs is None else max_seqs
    if max_context is None:
        max_context = max(1, int(kv.max()) if n else 1)
    cache = random_paged_cache(rng, kv_lens=kv, table_rows=max_seqs, max_context=max_context,
                               num_kv_heads=num_kv_heads, head_dim=head_dim,
                               block_size=block_size, dtype=dtype, layout=layout,
                               extra_blocks=extra_blocks, cache_dtype=cache_dtype,
                               kv_scales=kv_scales)
    if poison:
        attended = []
        for used, q_len in zip(cache["used"].tolist(), q_lens, strict=True):
            first = used - q_len                         # position of the first query row
            attended.append((max(0, first - sliding_window + 1) if sliding_window > 0 else 0,
                             used))
        poison_unattended(cache, attended, layout=layout)
    queries = rng.standard_normal((num_tokens, num_q_heads, head_dim), np.float32)
    cu = np.zeros(max_seqs + 1, np.int64)
    cu[1:n + 1] = np.cumsum(q_lens)
    cu[n + 1:] = cu[n]
    lens = np.zeros(max_seqs, np.int64)
    lens[:n] = kv
    return {
        "queries": queries.astype(dtypes.to_numpy(dtype)),
        "key_cache": cache["key_cache"],
        "value_cache": cache["value_cache"],
        "kv_lens": lens.astype(np.int32),
        "block_tables": cache["block_tables"].astype(np.int32),
        "cu_q_lens": cu.astype(np.int32),
        "num_seqs": np.array([n], np.int32),
    }


def garbage_metadata(rng: np.random.Generator, x: dict[str, np.ndarray], *, max_cu: int,
                     max_kv_len: int) -> dict[str, np.ndarray]:
    """``x`` (a :func:`make_inputs` problem, vllm layout) with arbitrary int32 metadata of the
    same shapes, for the op's rules on inconsistent device data: cu_q_lens sorted in
    [-3, max_cu) but for one descent, kv_lens in [-5, max_kv_len), num_seqs in
    [-1, max_seqs + 3), block ids in [-2, num_blocks + 2).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> x = make_inputs(rng, q_lens=[3, 5], kv_lens=[20, 5], num_q_heads=2,
        ...                 num_kv_heads=1, head_dim=64, block_size=16, dtype="f32")
        >>> y = garbage_metadata(rng, x, max_cu=14, max_kv_len=40)
        >>> {k: y[k].shape == x[k].shape for k in ("cu_q_lens", "kv_lens", "block_tables")}
        {'cu_q_lens': True, 'kv_lens': True, 'block_tables': True}
    """
    max_seqs = x["kv_lens"].shape[0]
    num_blocks = x["key_cache"].shape[0]
    y = dict(x)
    y["cu_q_lens"] = np.sort(rng.integers(-3, max_cu, size=max_seqs + 1)).astype(np.int32)
    swap = rng.integers(0, max_seqs)
    y["cu_q_lens"][[swap, swap + 1]] = y["cu_q_lens"][[swap + 1, swap]]  # one descent
    y["kv_lens"] = rng.integers(-5, max_kv_len, size=max_seqs).astype(np.int32)
    y["num_seqs"] = rng.integers(-1, max_seqs + 3, size=1).astype(np.int32)
    y["block_tables"] = rng.integers(-2, num_blocks + 2, size=x["block_tables"].shape
                                     ).astype(np.int32)
    return y


def sanitize_cases(platform: str = "gpu") -> None:
    """Small runs of the kernel for compute-sanitizer (memcheck, racecheck): every dtype and
    head_dim, both layouts, GQA and MQA, decode rows, prefill tiles, padding rows,
    out-of-range block ids and inconsistent cu_q_lens; decode-only batches (the CUDA decode
    path) with empty sequences, padding rows and split contexts; fp8 caches (bf16 and f16
    queries, every head_dim, both layouts, MQA) on both paths; 40 sequences; long prefills.
    Raises AssertionError if a result is off.

    Example:
        >>> sanitize_cases("cpu")                                   # doctest: +SKIP
    """
    import jax

    from . import ragged_paged_attention, ragged_paged_attention_numpy_f64

    device = jax.devices(platform)[0]
    rng = np.random.default_rng(4321)
    for dtype, cache_dtype, d, layout, (hq, hkv) in SANITIZE_CASES:
        scales = (0.05, 0.02) if cache_dtype else (1.0, 1.0)
        kw = dict(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=16, dtype=dtype,
                  layout=layout, max_seqs=6, cache_dtype=cache_dtype, kv_scales=scales)
        base = dict(scale=0.1, layout=layout, k_scale=scales[0], v_scale=scales[1])
        what = (dtype, cache_dtype, d, layout, hq, hkv)
        x = make_inputs(rng, q_lens=[1, 70, 3, 0], kv_lens=[37, 200, 3, 9], num_tokens=80, **kw)
        x["block_tables"][1, 3] = -5
        args = [jax.device_put(x[k], device) for k in ARGS]
        out = ragged_paged_attention(*args, sliding_window=50, **base)
        ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), sliding_window=50, **base)
        err = rel_error(out, ref)
        assert err <= TOLERANCES[dtype], (*what, err)
        x = make_inputs(rng, q_lens=[1, 0, 1, 1], kv_lens=[37, 9, 700, 0], num_tokens=6,
                        **kw)                                        # decode only
        x["block_tables"][2, 7] = 10**6
        args = [jax.device_put(x[k], device) for k in ARGS]
        for window in (0, 50):
            out = ragged_paged_attention(*args, sliding_window=window, **base)
            ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS),
                                                   sliding_window=window, **base)
            err = rel_error(out, ref)
            assert err <= TOLERANCES[dtype], ("decode", *what, window, err)
        x = make_inputs(rng, q_lens=[1, 70, 3, 0], kv_lens=[37, 200, 3, 9], num_tokens=80,
                        poison=False, **kw)
        x["cu_q_lens"][2] = 5                            # decreasing: clamped, never out of bounds
        x["kv_lens"][2] = 1                              # q_len > kv_len
        x["num_seqs"][0] = 99
        out = ragged_paged_attention(*[jax.device_put(x[k], device) for k in ARGS], **base)
        ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), **base)
        err = rel_error(out, ref)
        assert err <= TOLERANCES[dtype], ("clamped", *what, err)
    # More sequences than a warp's lanes: the work search's chunks (loaded a chunk ahead).
    for dtype, d in (("bf16", 128), ("f32", 64)):
        q_lens = [1, 3, 1, 1, 20, 1, 2, 1] * 5
        x = make_inputs(rng, q_lens=q_lens, kv_lens=[q + 30 for q in q_lens], num_q_heads=4,
                        num_kv_heads=2, head_dim=d, block_size=16, dtype=dtype, max_seqs=45)
        out = ragged_paged_attention(*[jax.device_put(x[k], device) for k in ARGS], scale=0.1)
        ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), scale=0.1)
        err = rel_error(out, ref)
        assert err <= TOLERANCES[dtype], ("40 sequences", dtype, d, err)
    # Long prefills: more K/V tiles than the Hopper kernel's stages, so every stage is
    # reused (its barriers go through several phases); a masked block inside the context;
    # fp8 caches too.
    long_cases = (("bf16", None, 128, "vllm", (8, 2)), ("f16", None, 64, "pallas", (4, 4)),
                  ("bf16", None, 256, "pallas", (8, 2)), ("bf16", FP8, 128, "pallas", (8, 2)),
                  ("f16", FP8, 64, "vllm", (4, 4)), ("bf16", FP8, 256, "vllm", (8, 2)))
    for dtype, cache_dtype, d, layout, (hq, hkv) in long_cases:
        scales = (0.05, 0.02) if cache_dtype else (1.0, 1.0)
        x = make_inputs(rng, q_lens=[300, 5], kv_lens=[1100, 500], num_tokens=320,
                        num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=16,
                        dtype=dtype, layout=layout, max_seqs=3, cache_dtype=cache_dtype,
                        kv_scales=scales)
        x["block_tables"][0, 20] = -1
        base = dict(scale=0.1, layout=layout, k_scale=scales[0], v_scale=scales[1])
        out = ragged_paged_attention(*[jax.device_put(x[k], device) for k in ARGS], **base)
        ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), **base)
        err = rel_error(out, ref)
        assert err <= TOLERANCES[dtype], ("long prefill", dtype, cache_dtype, d, layout, err)


def sanitize_fused_cases(platform: str = "gpu") -> None:
    """Small runs on the fused K/V cache and on 128- and 256-token blocks, for
    compute-sanitizer: the fused write (bf16, fp8) and attention on every kernel path
    (decode path, mixed, a long prefill; bf16, f16 fp8, f32). Raises AssertionError if a
    result is off.

    Example:
        >>> sanitize_fused_cases("cpu")                             # doctest: +SKIP
    """
    import jax

    from xla_kernels.kernels.kv_cache import (
        reshape_and_cache_fused,
        reshape_and_cache_fused_numpy,
    )
    from xla_kernels.kernels.paged_cache import join_fused

    from . import ragged_paged_attention_fused, ragged_paged_attention_numpy_f64

    device = jax.devices(platform)[0]
    rng = np.random.default_rng(8765)
    for dtype, cache_dtype in (("bf16", None), ("f32", FP8)):
        key = rng.standard_normal((9, 2, 128)).astype(dtypes.to_numpy(dtype))
        kv = np.zeros((4, 16, 4, 128), dtypes.to_numpy(cache_dtype or dtype))
        slots = np.array([0, 63, -1, 64, 5, 17, 30, 31, 2], np.int32)
        scales = dict(k_scale=0.05, v_scale=0.5) if cache_dtype else {}
        got = reshape_and_cache_fused(*(jax.device_put(a, device) for a in (key, -key, kv,
                                                                             slots)), **scales)
        want = reshape_and_cache_fused_numpy(key, -key, kv, slots, **scales)
        assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8)), dtype
    cases = [("bf16", None, 16, [1, 1, 0, 1], [37, 700, 9, 1], 4),     # decode path
             ("f16", FP8, 128, [1, 1, 0, 1], [37, 700, 9, 1], 4),
             ("bf16", None, 128, [1, 70, 3, 0], [37, 200, 3, 9], 80),
             ("f32", None, 256, [1, 70, 3, 0], [37, 600, 3, 9], 80),
             ("bf16", None, 256, [300, 5], [1100, 500], 320),            # wgmma prefill
             ("bf16", FP8, 128, [300, 5], [1100, 500], 320)]
    for dtype, cache_dtype, block, q_lens, kv_lens, rows in cases:
        scales = (0.05, 0.02) if cache_dtype else (1.0, 1.0)
        x = make_inputs(rng, q_lens=q_lens, kv_lens=kv_lens, num_tokens=rows, num_q_heads=8,
                        num_kv_heads=2, head_dim=128, block_size=block, dtype=dtype,
                        max_seqs=len(q_lens) + 1, cache_dtype=cache_dtype, kv_scales=scales)
        fused = join_fused(x["key_cache"], x["value_cache"])
        base = dict(scale=0.1, k_scale=scales[0], v_scale=scales[1])
        out = ragged_paged_attention_fused(
            *(jax.device_put(a, device) for a in (x["queries"], fused,
                                                   *(x[k] for k in ARGS[3:]))), **base)
        ref = ragged_paged_attention_numpy_f64(*(x[k] for k in ARGS), **base)
        err = rel_error(out, ref)
        assert err <= TOLERANCES[dtype], ("fused", dtype, cache_dtype, block, q_lens, err)


__all__ = ["ARGS", "TOLERANCES", "garbage_metadata", "make_inputs", "mix", "rel_error",
           "sanitize_cases", "sanitize_fused_cases"]
