"""Workspace sizing for the CUDA paged-attention kernel (flash-decoding partials).

The kernel splits a sequence's context into at most :func:`max_partitions` partitions; each
(sequence, query head, partition) keeps an unnormalized f32 accumulator of ``head_dim``
values plus the running max ``m`` and sum ``l``. How many partitions are actually used is
decided on the device from the real ``seq_lens``; the workspace is sized for the most the
kernel may use, from static shapes only. The constants are read from
``paged_attention_limits.h``, their one definition; a test holds these functions to the
header's ``WorkspaceElems`` (exported by the CPU kernel library), and the CUDA handler
rejects a smaller workspace.

Example:
    >>> max_partitions(num_seqs=32, max_context=2048)
    32
    >>> workspace_size(num_seqs=32, num_q_heads=32, head_dim=128, max_context=2048)
    4259840
    >>> workspace_size(num_seqs=4, num_q_heads=8, head_dim=128, max_context=64)
    1
"""

from __future__ import annotations

from pathlib import Path

from xla_kernels.kernel_kit import read_constants

LIMITS_HEADER = Path(__file__).with_name("paged_attention_limits.h")
LIMITS = read_constants(LIMITS_HEADER)

PART_MIN: int = LIMITS["kPartMin"]  # type: ignore[assignment]
"""Fewest tokens in a partition (before rounding up to the kernel's tile)."""
MAX_PARTS: int = LIMITS["kMaxParts"]  # type: ignore[assignment]
"""Most partitions per sequence."""
PART_BUDGET: int = LIMITS["kPartBudget"]  # type: ignore[assignment]
"""Most (sequence, partition) pairs over the whole batch."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def max_partitions(num_seqs: int, max_context: int) -> int:
    """Most partitions per sequence the kernel may use for this batch size and capacity.

    ``max_context`` is ``max_blocks_per_seq * block_size`` (the static capacity).

    Example:
        >>> max_partitions(1, 32768), max_partitions(128, 32768), max_partitions(8, 100)
        (64, 16, 2)
    """
    if num_seqs <= 0 or max_context <= 0:
        return 1
    parts = min(_cdiv(max_context, PART_MIN), MAX_PARTS, _cdiv(PART_BUDGET, num_seqs))
    return max(1, parts)


def workspace_size(num_seqs: int, num_q_heads: int, head_dim: int, max_context: int) -> int:
    """Number of f32 elements of workspace the CUDA kernel needs (1 when it needs none).

    Args:
        num_seqs: sequences in the batch (``query.shape[0]``).
        num_q_heads: query heads (``query.shape[1]``).
        head_dim: 64, 128 or 256.
        max_context: ``block_tables.shape[1] * block_size``.

    Example:
        >>> workspace_size(8, 32, 128, 32768)
        2129920
    """
    parts = max_partitions(num_seqs, max_context)
    if parts <= 1:
        return 1
    return num_seqs * num_q_heads * parts * (head_dim + 2)


__all__ = ["LIMITS", "LIMITS_HEADER", "MAX_PARTS", "PART_BUDGET", "PART_MIN", "max_partitions",
           "workspace_size"]
