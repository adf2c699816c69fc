"""The block allocator: hands out cache blocks and takes them back.

Each layer's KV cache is a pool of ``num_blocks`` blocks of ``block_size`` tokens; a
sequence owns a list of block ids (its block table row), the same ids in every layer.
Freed blocks go back on top of the free list, so the next request reuses them first.
``shuffle_seed`` hands blocks out in a random order instead of 0, 1, 2, ...: a paged engine
must give the same tokens whatever physical blocks it gets (tests use it to catch an engine
that silently assumes contiguous blocks).

When the pool is short, :meth:`BlockAllocator.allocate` returns ``None`` and takes nothing:
the engine then leaves the request waiting (see :mod:`xla_kernels.serving.engine`).

Example:
    >>> alloc = BlockAllocator(4)
    >>> a = alloc.allocate(3); a
    [0, 1, 2]
    >>> alloc.allocate(2) is None, alloc.num_free
    (True, 1)
    >>> alloc.free(a); alloc.allocate(2)
    [2, 1]
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class BlockAllocator:
    """A free list of block ids ``0 .. num_blocks - 1``."""

    def __init__(self, num_blocks: int, *, shuffle_seed: int | None = None):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        order = list(range(num_blocks))
        if shuffle_seed is not None:
            np.random.default_rng(shuffle_seed).shuffle(order)
        self.num_blocks = num_blocks
        self._free = order[::-1]                 # the end of the list is handed out first
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` block ids, or ``None`` (taking nothing) if fewer are free."""
        if count > len(self._free):
            return None
        blocks = [self._free.pop() for _ in range(count)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        """Give blocks back; freeing a block that is not allocated raises ``ValueError``."""
        for block in blocks:
            if block not in self._used:
                raise ValueError(f"block {block} is not allocated (freed twice?)")
            self._used.remove(block)
            self._free.append(block)


__all__ = ["BlockAllocator"]
