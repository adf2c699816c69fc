"""Reference implementations of ragged paged attention.

* :func:`ragged_paged_attention_xla`: plain jax.numpy (gather each query row's blocks, masked
  einsum, softmax), jit-compatible; the fallback for platforms without a kernel. It maps
  over the query rows in batches of ``row_batch`` rows and gathers
  ``row_batch * max_context * num_kv_heads * head_dim`` elements per cache at a time, so it
  reads the cache once per query row: far more traffic than the kernels.
* :func:`ragged_paged_attention_numpy_f64`: float64 NumPy, a loop per sequence and row,
  written from the op's definition alone: the test oracle.

Both have the op's semantics (``xla_kernels.kernels.ragged_paged_attention``), including
its rules for inconsistent device data (:func:`sequence_bounds`), and read fp8 caches as
the dequantized values (``stored * k_scale``, ``stored * v_scale``).

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((5, 4, 64)).astype(np.float32)      # 5 tokens, 4 q heads
    >>> kc = rng.standard_normal((8, 16, 2, 64)).astype(np.float32)  # vllm layout, 2 kv heads
    >>> kv_lens = np.array([20, 3], np.int32)
    >>> bt = np.array([[0, 1], [2, 3]], np.int32)
    >>> cu = np.array([0, 3, 4], np.int32)                           # q_lens 3 and 1
    >>> n = np.array([2], np.int32)
    >>> ref = ragged_paged_attention_numpy_f64(q, kc, kc, kv_lens, bt, cu, n, scale=0.125)
    >>> out = ragged_paged_attention_xla(q, kc, kc, kv_lens, bt, cu, n, scale=0.125)
    >>> bool(np.allclose(out, ref, atol=1e-5)), float(abs(ref[4]).max())   # row 4: padding
    (True, 0.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xla_kernels import dtypes
from xla_kernels.kernels.paged_cache import FP8, LAYOUTS, cache_dims
from xla_kernels.kernels.paged_reference import attend_f64, masked_attention_xla, read_tokens_f64


def sequence_bounds(cu_q_lens: Any, num_seqs: Any, num_tokens: int) -> list[tuple[int, int]]:
    """The query rows ``[start, end)`` each sequence owns, after the op's clamping rules.

    ``n = clamp(num_seqs[0], 0, max_seqs)``; ``c_j = clamp(max(cu_q_lens[:j + 1]), 0,
    num_tokens)`` for ``j <= n`` (a running maximum, so ranges never overlap and a decreasing
    entry gives an empty sequence); sequence ``s < n`` owns rows ``[c_s, c_{s+1})``.

    Example:
        >>> sequence_bounds([0, 10, 5, 15, 99], [9], 12)
        [(0, 10), (10, 10), (10, 12), (12, 12)]
    """
    cu = [int(x) for x in np.asarray(cu_q_lens).reshape(-1)]
    n = min(max(int(np.asarray(num_seqs).reshape(-1)[0]), 0), len(cu) - 1)
    bounds = []
    running = cu[0]
    prev = min(max(running, 0), num_tokens)
    for s in range(n):
        running = max(running, cu[s + 1])
        end = min(max(running, 0), num_tokens)
        bounds.append((prev, end))
        prev = end
    return bounds


def ragged_paged_attention_numpy_f64(
    queries: Any,
    key_cache: Any,
    value_cache: Any,
    kv_lens: Any,
    block_tables: Any,
    cu_q_lens: Any,
    num_seqs: Any,
    *,
    scale: float,
    softcap: float = 0.0,
    sliding_window: int = 0,
    layout: str = "vllm",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> np.ndarray:
    """Ragged paged attention in float64 NumPy, one sequence and one query row at a time.

    Inputs may be NumPy or JAX arrays of any floating dtype; the result is float64
    [num_tokens, num_q_heads, head_dim]. Only the cache slots a row attends are read, so the
    others may hold NaN. The keys are ``key_cache * k_scale`` and the values
    ``value_cache * v_scale`` (in float64: the dequantized fp8 cache).

    Example:
        >>> q = np.ones((2, 1, 64)); kc = np.ones((2, 16, 1, 64))
        >>> out = ragged_paged_attention_numpy_f64(
        ...     q, kc, kc, np.array([3]), np.array([[1]]), np.array([0, 1]), np.array([1]),
        ...     scale=1.0)
        >>> out[0, 0, :2], out[1, 0, :2]
        (array([1., 1.]), array([0., 0.]))
    """
    q = np.asarray(queries).astype(np.float64)
    lens = np.asarray(kv_lens).astype(np.int64)
    bt = np.asarray(block_tables).astype(np.int64)
    num_tokens = q.shape[0]
    kc, vc = np.asarray(key_cache), np.asarray(value_cache)
    block_size = cache_dims(kc.shape, layout)[1]
    capacity = bt.shape[1] * block_size
    out = np.zeros(q.shape, np.float64)

    def window_start(p: int) -> int:                   # the first position row p attends
        return max(0, p - sliding_window + 1) if sliding_window > 0 else 0

    for s, (start, end) in enumerate(sequence_bounds(cu_q_lens, num_seqs, num_tokens)):
        kv_len = min(max(int(lens[s]), 0), capacity)
        q_len = end - start
        if q_len == 0:
            continue
        # Every position some row of the sequence attends, read once; row i (at position p)
        # attends those in [window_start(p), p].
        first = kv_len - q_len
        t, k, v = read_tokens_f64(kc, vc, bt[s],
                                  np.arange(window_start(max(first, 0)), kv_len),
                                  layout=layout, k_scale=k_scale, v_scale=v_scale)
        for i in range(q_len):
            p = first + i
            rows = (t >= window_start(p)) & (t <= p)
            if rows.any():
                out[start + i] = attend_f64(q[start + i], k[rows], v[rows], scale=scale,
                                            softcap=softcap)
    return out


def ragged_paged_attention_xla(
    queries: Any,
    key_cache: Any,
    value_cache: Any,
    kv_lens: Any,
    block_tables: Any,
    cu_q_lens: Any,
    num_seqs: Any,
    *,
    scale: float,
    softcap: float = 0.0,
    sliding_window: int = 0,
    layout: str = "vllm",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    row_batch: int = 32,
) -> Any:
    """Ragged paged attention in plain jax.numpy (XLA gather + masked einsum), jit-compatible.

    Args:
        queries: [num_tokens, num_q_heads, head_dim].
        key_cache, value_cache: ``"vllm"`` [num_blocks, block_size, num_kv_heads, head_dim]
            or ``"pallas"`` [num_kv_heads, num_blocks, block_size, head_dim].
        kv_lens: int32 [max_seqs]; block_tables: int32 [max_seqs, max_blocks_per_seq];
        cu_q_lens: int32 [max_seqs + 1]; num_seqs: int32 [1].
        scale, softcap, sliding_window, layout, k_scale, v_scale: as in the op (fp8
            caches are dequantized to f32 after the gather).
        row_batch: query rows gathered at once (memory vs. parallelism).

    Returns:
        [num_tokens, num_q_heads, head_dim] in the queries' dtype; logits, softmax and the
        weighted sum in f32.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> q = jnp.ones((4, 2, 64), jnp.bfloat16)
        >>> kc = jnp.ones((4, 16, 1, 64), jnp.bfloat16)
        >>> i32 = lambda *x: jnp.array(x, jnp.int32)
        >>> f = jax.jit(ragged_paged_attention_xla, static_argnames=("scale",))
        >>> f(q, kc, kc, i32(17), i32(0, 1).reshape(1, 2), i32(0, 3), i32(1), scale=0.125).shape
        (4, 2, 64)
    """
    import jax
    import jax.numpy as jnp

    num_tokens, num_q_heads, head_dim = queries.shape
    num_blocks, block_size, num_kv_heads = cache_dims(tuple(key_cache.shape), layout)[:3]
    group = num_q_heads // num_kv_heads
    max_seqs, max_blocks = block_tables.shape
    capacity = max_blocks * block_size
    if num_tokens == 0:
        return jnp.zeros(queries.shape, queries.dtype)

    # Row ownership (sequence_bounds' rule, vectorized).
    cu = jnp.asarray(cu_q_lens, jnp.int32)
    n = jnp.clip(jnp.asarray(num_seqs, jnp.int32).reshape(-1)[0], 0, max_seqs)
    c = jnp.clip(jax.lax.cummax(cu), 0, num_tokens)
    j = jnp.arange(max_seqs + 1)
    c = jnp.where(j <= n, c, c[n])                       # sequences >= n own nothing
    rows = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(c[1:], rows, side="right"), 0, max_seqs - 1)
    owned = (rows >= c[0]) & (rows < c[n])
    q_len = c[seq + 1] - c[seq]
    kv_len = jnp.clip(jnp.asarray(kv_lens, jnp.int32)[seq], 0, capacity)
    pos = kv_len - q_len + (rows - c[seq])               # position of each row

    bt = jnp.asarray(block_tables, jnp.int32)
    kc, vc = jnp.asarray(key_cache), jnp.asarray(value_cache)
    fp8 = np.dtype(kc.dtype) == dtypes.to_numpy(FP8)
    q = jnp.asarray(queries).reshape(num_tokens, num_kv_heads, group, head_dim)
    t = jnp.arange(capacity, dtype=jnp.int32)

    def one_row(x: tuple) -> Any:
        qr, s, p, ok = x                                 # [Hkv, G, D], (), (), ()
        blocks = bt[s]
        block_ok = (blocks >= 0) & (blocks < num_blocks)
        idx = jnp.where(block_ok, blocks, 0)
        mask = ok & (t <= p) & jnp.repeat(block_ok, block_size)
        if sliding_window > 0:
            mask &= t > p - sliding_window
        if layout == "vllm":                             # [capacity, Hkv, D]
            k = kc[idx].reshape(capacity, num_kv_heads, head_dim)
            v = vc[idx].reshape(capacity, num_kv_heads, head_dim)
        else:
            k = kc[:, idx].reshape(num_kv_heads, capacity, head_dim).transpose(1, 0, 2)
            v = vc[:, idx].reshape(num_kv_heads, capacity, head_dim).transpose(1, 0, 2)
        return masked_attention_xla(qr, k, v, mask, mask[:, None, None],
                                    specs=("kgd,tkd->kgt", "kgt,tkd->kgd"), scale=scale,
                                    softcap=softcap, fp8=fp8, k_scale=k_scale, v_scale=v_scale)

    out = jax.lax.map(one_row, (q, seq, pos, owned), batch_size=min(row_batch, num_tokens))
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(queries.dtype)


__all__ = ["LAYOUTS", "ragged_paged_attention_numpy_f64", "ragged_paged_attention_xla",
           "sequence_bounds"]
