"""One engine step's inputs: a ragged batch of prefill chunks and decode tokens, padded to a
bucket.

Every array is int32 and its shape depends only on the bucket (``num_tokens`` rows) and the
engine's limits (``max_num_seqs`` sequence slots, ``max_blocks_per_seq`` table columns), so
the jitted step compiles once per bucket. Sequence ``s < num_seqs[0]`` owns rows
``cu_q_lens[s] .. cu_q_lens[s + 1] - 1``: its next tokens, at positions ``kv_lens[s] -
q_len ..  kv_lens[s] - 1``, written to the cache slots ``slot_mapping`` names and then
attended (the layout ``ragged_paged_attention`` reads). Padding rows have token 0, position 0
and slot -1 (``reshape_and_cache`` skips it; no sequence owns the row, so attention gives
zeros). The step samples one token per sequence, from row ``logits_indices[s]`` (drawn
with request ``request_ids[s]``'s seed when the loop samples).

Example:
    >>> b = empty_batch(num_tokens=16, max_num_seqs=4, max_blocks_per_seq=8)
    >>> b.token_ids.shape, b.block_tables.shape, int(b.num_seqs[0]), int(b.slot_mapping[0])
    ((16,), (4, 8), 0, -1)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np


class StepBatch(NamedTuple):
    """The arrays of one step (a pytree for JAX and for torch)."""

    token_ids: np.ndarray       # [num_tokens]
    positions: np.ndarray       # [num_tokens]
    slot_mapping: np.ndarray    # [num_tokens], -1 for padding
    kv_lens: np.ndarray         # [max_num_seqs], context length after this step
    block_tables: np.ndarray    # [max_num_seqs, max_blocks_per_seq]
    cu_q_lens: np.ndarray       # [max_num_seqs + 1]
    num_seqs: np.ndarray        # [1]
    logits_indices: np.ndarray  # [max_num_seqs], the row each sequence samples from
    request_ids: np.ndarray     # [max_num_seqs], its request's id (the sampling seed's part)


def empty_batch(num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int) -> StepBatch:
    """A batch of ``num_tokens`` padding rows and no sequences (compiles a bucket)."""
    i32 = np.int32
    return StepBatch(
        token_ids=np.zeros(num_tokens, i32),
        positions=np.zeros(num_tokens, i32),
        slot_mapping=np.full(num_tokens, -1, i32),
        kv_lens=np.zeros(max_num_seqs, i32),
        block_tables=np.zeros((max_num_seqs, max_blocks_per_seq), i32),
        cu_q_lens=np.zeros(max_num_seqs + 1, i32),
        num_seqs=np.zeros(1, i32),
        logits_indices=np.zeros(max_num_seqs, i32),
        request_ids=np.zeros(max_num_seqs, i32),
    )


def feed_tokens(token_ids: Any, rows: Sequence[int], slots: Sequence[int],
                tokens: Any) -> Any:
    """``token_ids`` (a JAX array on the device) with ``token_ids[rows[i]] = tokens[slots[i]]``
    for every i, computed on the device: how async scheduling hands a step's sampled tokens
    (``tokens`` [max_num_seqs], not yet fetched) to the next step's decode rows. ``rows`` and
    ``slots`` (at most one per sequence slot) are padded to ``len(tokens)`` with a row past
    the end, which is dropped, so one small program is compiled per bucket.

    Example:
        >>> import jax.numpy as jnp
        >>> feed_tokens(jnp.zeros(4, jnp.int32), [1], [2], jnp.array([7, 8, 9], jnp.int32)
        ...             ).tolist()
        [0, 9, 0, 0]
    """
    n = len(tokens)
    padded_rows = np.full(n, len(token_ids), np.int32)
    padded_rows[:len(rows)] = rows
    padded_slots = np.zeros(n, np.int32)
    padded_slots[:len(slots)] = slots
    return _feed_program()(token_ids, padded_rows, padded_slots, tokens)


@functools.cache
def _feed_program() -> Any:
    import jax

    return jax.jit(lambda ids, rows, slots, tokens: ids.at[rows].set(tokens[slots],
                                                                     mode="drop"))


__all__ = ["StepBatch", "empty_batch", "feed_tokens"]
