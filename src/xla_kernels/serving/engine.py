"""The engine: continuous batching over a paged KV cache, one ragged batch per step.

Each :meth:`Engine.step`:

1. **Admits** arrived requests (first come, first served) while fewer than
   ``max_num_seqs`` run and the :class:`~xla_kernels.serving.blocks.BlockAllocator` can
   reserve every block the request will ever need (prompt + outputs). A request that does
   not fit waits, and so do the ones behind it: nothing is preempted, and a running request
   can never run out of blocks mid-way (the cost: blocks reserved for outputs not yet
   generated sit idle).
2. **Schedules** at most ``token_budget`` query rows: one decode token per running request
   whose prompt is done, then prefill chunks of the others in admission order (a long
   prompt is split over several steps: chunked prefill).
3. **Builds** the :class:`~xla_kernels.serving.batch.StepBatch`, padded to the smallest
   bucket that holds the rows, and calls the runner (one jitted, cache-donating program
   per bucket).
4. **Samples** greedily: a sequence whose step reached the end of its known tokens appends
   the sampled token; a request with all its tokens **finishes** and frees its blocks, which
   the next waiting request can take in the same step.

Example:
    >>> from xla_kernels.serving.config import EngineConfig
    >>> class Echo:                                   # a runner that always samples 7
    ...     def step(self, batch):
    ...         return np.full(batch.kv_lens.shape, 7, np.int32)
    >>> engine = Engine(Echo(), EngineConfig(num_blocks=4, max_num_seqs=2, token_budget=16))
    >>> engine.run([Request(0, [1, 2, 3], 2), Request(1, [4] * 20, 3)])
    {0: [7, 7], 1: [7, 7, 7]}
    >>> [(s.prefill_tokens, s.decode_tokens) for s in engine.records]
    [(16, 0), (7, 1), (0, 1), (0, 1)]
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from xla_kernels.serving.batch import StepBatch, empty_batch
from xla_kernels.serving.blocks import BlockAllocator
from xla_kernels.serving.config import EngineConfig, ServingConfigError


class Runner(Protocol):
    """Runs the model for one step: the next token of each sequence slot [max_num_seqs]."""

    def step(self, batch: StepBatch) -> np.ndarray: ...


@dataclasses.dataclass
class Request:
    """A prompt to continue with ``max_new_tokens`` greedy tokens, arriving before step
    ``arrival``."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0
    output: list[int] = dataclasses.field(default_factory=list)
    blocks: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0       # tokens whose K/V are in the cache

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def token(self, index: int) -> int:
        return self.prompt[index] if index < len(self.prompt) \
            else self.output[index - len(self.prompt)]

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens

    def blocks_needed(self, block_size: int) -> int:
        """Blocks for every token whose K/V is ever written (all but the last output)."""
        return math.ceil((len(self.prompt) + self.max_new_tokens - 1) / block_size)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one step did and how long it took (milliseconds)."""

    index: int
    num_seqs: int
    bucket: int
    prefill_tokens: int
    decode_tokens: int
    context_tokens: int         # sum of the sequences' kv_lens after the step
    sampled: int                # tokens appended to outputs
    finished: int               # requests that finished
    host_ms: float              # scheduling and building the batch
    step_ms: float              # runner.step: transfer, dispatch, device, sync

    @property
    def kind(self) -> str:
        return "prefill" if self.prefill_tokens else "decode"


class Engine:
    """Continuous batching of :class:`Request` s on a :class:`Runner` (see the module doc).

    ``allocator`` defaults to a :class:`BlockAllocator` of ``config.num_blocks`` blocks.
    """

    def __init__(self, runner: Runner, config: EngineConfig,
                 allocator: BlockAllocator | None = None):
        self.runner, self.config = runner, config
        self.allocator = allocator or BlockAllocator(config.num_blocks)
        if self.allocator.num_blocks > config.num_blocks:
            raise ServingConfigError(
                f"the allocator hands out {self.allocator.num_blocks} blocks but the caches "
                f"hold {config.num_blocks}. Fix: give both the same num_blocks.")
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.done: dict[int, Request] = {}
        self.records: list[StepRecord] = []
        self.steps = 0

    def add(self, request: Request) -> None:
        """Queue a request; raises :class:`ServingConfigError` if it can never fit."""
        total = len(request.prompt) + request.max_new_tokens
        if not request.prompt or request.max_new_tokens < 1:
            raise ServingConfigError(f"request {request.id}: needs a prompt and at least one "
                                     "new token. Fix: pass a non-empty prompt and "
                                     "max_new_tokens >= 1.")
        if total > self.config.max_model_len:
            raise ServingConfigError(
                f"request {request.id}: prompt + new tokens = {total} exceeds max_model_len "
                f"{self.config.max_model_len}. Fix: raise max_model_len or shorten it.")
        if request.blocks_needed(self.config.block_size) > self.allocator.num_blocks:
            raise ServingConfigError(
                f"request {request.id}: needs {request.blocks_needed(self.config.block_size)}"
                f" blocks, the cache has {self.allocator.num_blocks}. Fix: raise num_blocks.")
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while (self.waiting and self.waiting[0].arrival <= self.steps
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[0]
            blocks = self.allocator.allocate(request.blocks_needed(self.config.block_size))
            if blocks is None:
                return                       # waits for blocks; first come, first served
            request.blocks = blocks
            self.running.append(self.waiting.popleft())

    def _schedule(self) -> list[tuple[Request, int]]:
        """(request, query rows) for this step: decodes first, then prefill chunks."""
        budget = self.config.token_budget
        decodes = [r for r in self.running if r.output]
        prefills = [r for r in self.running if not r.output]
        chosen = []
        for request in decodes + prefills:
            rows = min(request.num_tokens - request.num_computed, budget)
            if rows == 0:
                break
            chosen.append((request, rows))
            budget -= rows
        return chosen

    def _batch(self, chosen: list[tuple[Request, int]]) -> StepBatch:
        cfg = self.config
        rows = sum(n for _, n in chosen)
        batch = empty_batch(cfg.bucket(rows), cfg.max_num_seqs, cfg.max_blocks_per_seq)
        start = 0
        for s, (request, n) in enumerate(chosen):
            first = request.num_computed
            positions = np.arange(first, first + n, dtype=np.int32)
            table = np.asarray(request.blocks, np.int32)
            batch.token_ids[start:start + n] = [request.token(i) for i in range(first, first + n)]
            batch.positions[start:start + n] = positions
            batch.slot_mapping[start:start + n] = (table[positions // cfg.block_size]
                                                   * cfg.block_size
                                                   + positions % cfg.block_size)
            batch.kv_lens[s] = first + n
            batch.block_tables[s, :len(table)] = table
            batch.cu_q_lens[s + 1] = start + n
            batch.logits_indices[s] = start + n - 1
            start += n
        batch.cu_q_lens[len(chosen) + 1:] = start
        batch.num_seqs[0] = len(chosen)
        return batch

    def step(self) -> StepRecord | None:
        """Run one step; ``None`` when nothing could run (no request has arrived yet)."""
        t0 = time.perf_counter()
        self._admit()
        chosen = self._schedule()
        if not chosen:
            self.steps += 1
            return None
        batch = self._batch(chosen)
        t1 = time.perf_counter()
        tokens = self.runner.step(batch)
        t2 = time.perf_counter()
        prefill = decode = sampled = finished = 0
        for s, (request, n) in enumerate(chosen):
            if request.output:
                decode += 1
            else:
                prefill += n
            request.num_computed += n
            if request.num_computed == request.num_tokens:
                request.output.append(int(tokens[s]))
                sampled += 1
            if request.finished:
                self.allocator.free(request.blocks)
                request.blocks = []
                self.running.remove(request)
                self.done[request.id] = request
                finished += 1
        record = StepRecord(
            index=self.steps, num_seqs=len(chosen), bucket=len(batch.token_ids),
            prefill_tokens=prefill, decode_tokens=decode,
            context_tokens=int(batch.kv_lens.sum()), sampled=sampled, finished=finished,
            host_ms=(t1 - t0) * 1e3, step_ms=(t2 - t1) * 1e3)
        self.records.append(record)
        self.steps += 1
        return record

    def run(self, requests: Iterable[Request],
            on_step: Callable[[Engine, StepRecord], None] | None = None) -> dict[int, list[int]]:
        """Add ``requests``, step until all finish; returns each request's output tokens."""
        for request in requests:
            self.add(request)
        while self.has_work():
            record = self.step()
            if record is not None and on_step is not None:
                on_step(self, record)
        return {i: list(r.output) for i, r in sorted(self.done.items())}


__all__ = ["Engine", "Request", "Runner", "StepRecord"]
