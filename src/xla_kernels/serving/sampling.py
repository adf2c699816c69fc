"""How the serving loop picks each sequence's next token: greedy (argmax, the default), or
drawn by the library's ``sample`` op with one temperature, top-k, top-p and min-p for every
request.

Request ``i`` draws with seed ``seed + i`` at offset = its context length after the step
(the position of the token drawn), so its tokens depend on its own logits and nothing
else: the same with or without async scheduling, whatever else runs in the batch.

Example:
    >>> Sampling().greedy, Sampling(temperature=0.7, top_p=0.9).greedy
    (True, False)
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Sampling:
    """One sampling setting for every request; ``temperature`` 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0          # 0: off
    top_p: float = 1.0      # 1: off
    min_p: float = 0.0      # 0: off
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return not self.temperature > 0


def sample_jax(logits: Any, sampling: Sampling, batch: Any) -> Any:
    """The tokens (int32 [rows]) of ``logits`` [rows, vocab] for a :class:`StepBatch` whose
    ``request_ids`` and ``kv_lens`` give each row's seed and offset."""
    import jax.numpy as jnp

    from xla_kernels.kernels.sampling import sample

    rows = logits.shape[0]
    return sample(logits, *_per_row(jnp, rows, sampling),
                  batch.request_ids.astype(jnp.uint32) + jnp.uint32(sampling.seed),
                  batch.kv_lens)


def sample_torch(logits: Any, sampling: Sampling, batch: Any) -> Any:
    """:func:`sample_jax` through the torch operator (``torch.ops.xla_kernels.sample``)."""
    import torch

    rows = logits.shape[0]
    seeds = batch.request_ids + _wrapped(sampling.seed)  # int32 bits of seed + id mod 2^32
    return torch.ops.xla_kernels.sample(logits, *_per_row(torch, rows, sampling, logits.device),
                                        seeds, batch.kv_lens)


def _per_row(xp: Any, rows: int, s: Sampling, device: Any = None) -> list[Any]:
    extra = {} if device is None else {"device": device}
    return [xp.full((rows,), s.temperature, dtype=xp.float32, **extra),
            xp.full((rows,), s.top_k, dtype=xp.int32, **extra),
            xp.full((rows,), s.top_p, dtype=xp.float32, **extra),
            xp.full((rows,), s.min_p, dtype=xp.float32, **extra)]


def _wrapped(seed: int) -> int:
    """``seed`` (0 .. 2^32 - 1) as the int32 with the same bits."""
    return seed - 2**32 if seed >= 2**31 else seed


__all__ = ["Sampling", "sample_jax", "sample_torch"]
