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
4. **Samples** (greedily, unless the runner was given a
   :class:`~xla_kernels.serving.sampling.Sampling`): a sequence whose step reached the end
   of its known tokens appends the sampled token; a request with all its tokens
   **finishes** and frees its blocks, which the next waiting request can take in the same
   step.

With ``async_scheduling=True`` (an :class:`OverlapRunner`) :meth:`Engine.run` keeps one step
in flight: it schedules, builds, transfers and dispatches step N + 1 while the device runs
step N, and only then waits for step N's tokens. Nothing the scheduler decides depends on a
token's value (requests finish by count), so the steps are the same as without overlap; a
token sampled by step N and consumed by step N + 1 (a decode row) is copied from step N's
device output into step N + 1's ``token_ids`` on the device (:meth:`OverlapRunner.feed`),
and written into the request's output once fetched. (So ``on_step`` may see outputs that
end in ``None``, and the record it gets has no ``step_ms`` yet.)

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
from typing import Any, Protocol

import numpy as np

from xla_kernels.serving.batch import StepBatch, empty_batch
from xla_kernels.serving.blocks import BlockAllocator
from xla_kernels.serving.config import EngineConfig, ServingConfigError


class Runner(Protocol):
    """Runs the model for one step: the next token of each sequence slot [max_num_seqs]."""

    def step(self, batch: StepBatch) -> np.ndarray: ...


class OverlapRunner(Runner, Protocol):
    """A runner whose step splits into asynchronous parts (for ``async_scheduling``):
    ``prepare`` moves a batch to the device, ``feed`` sets ``token_ids[rows[i]] =
    tokens[slots[i]]`` on the device (``tokens``: a launched step's output), ``launch``
    dispatches the step and returns its tokens without waiting, ``fetch`` waits for them."""

    def prepare(self, batch: StepBatch) -> Any: ...

    def feed(self, prepared: Any, rows: list[int], slots: list[int], tokens: Any) -> Any: ...

    def launch(self, prepared: Any) -> Any: ...

    def fetch(self, tokens: Any) -> np.ndarray: ...


@dataclasses.dataclass
class Request:
    """A prompt to continue with ``max_new_tokens`` greedy tokens, arriving before step
    ``arrival``."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0
    output: list[int | None] = dataclasses.field(default_factory=list)  # None: pending
    blocks: list[int] = dataclasses.field(default_factory=list)  # set by hold/release_blocks
    num_computed: int = 0       # tokens whose K/V are in the cache
    # async scheduling: the last output is a placeholder (None) until the step in flight is
    # fetched; pending_slot is its sequence slot in that step's tokens.
    pending_slot: int = -1
    # blocks as int32, made once by hold_blocks (the batch reads it every step)
    block_array: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int32), compare=False, repr=False)

    def hold_blocks(self, blocks: list[int]) -> None:
        """Take ``blocks`` (its cache blocks, in order) and their int32 copy together."""
        self.blocks = blocks
        self.block_array = np.asarray(blocks, np.int32)

    def release_blocks(self) -> list[int]:
        """Drop the blocks (and their copy); returns them, for the allocator."""
        blocks, self.blocks = self.blocks, []
        self.block_array = self.block_array[:0]
        return blocks

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
    host_ms: float              # scheduling and building the batch (async: and dispatching it)
    step_ms: float              # runner.step: transfer, dispatch, device, sync (async: the
                                # wait for this step's tokens, after the next step was
                                # dispatched; 0 in the record on_step sees)

    @property
    def kind(self) -> str:
        return "prefill" if self.prefill_tokens else "decode"


class Engine:
    """Continuous batching of :class:`Request` s on a :class:`Runner` (see the module doc).

    ``allocator`` defaults to a :class:`BlockAllocator` of ``config.num_blocks`` blocks.
    ``async_scheduling`` makes :meth:`run` overlap the host's work for the next step with
    the device's current one (the runner must be an :class:`OverlapRunner`).
    """

    def __init__(self, runner: Runner, config: EngineConfig,
                 allocator: BlockAllocator | None = None, *, async_scheduling: bool = False):
        if async_scheduling and not all(hasattr(runner, m) for m in
                                        ("prepare", "feed", "launch", "fetch")):
            raise ServingConfigError(
                f"async scheduling needs a runner with prepare, feed, launch and fetch; "
                f"{type(runner).__name__} has only step. Fix: use JaxRunner or "
                "TorchaxRunner, or async_scheduling=False.")
        self.runner, self.config = runner, config
        self.async_scheduling = async_scheduling
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
            request.hold_blocks(blocks)
            self.running.append(self.waiting.popleft())

    def _next_arrival(self) -> int:
        """The step after an idle one: nothing runs until the next request arrives, so
        the idle steps up to its arrival are skipped at once rather than one at a time
        (arrivals far apart would otherwise spin for hours)."""
        if self.running or not self.waiting:
            return self.steps + 1
        return max(self.steps + 1, self.waiting[0].arrival)

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

    def _batch(self, chosen: list[tuple[Request, int]]
               ) -> tuple[StepBatch, list[int], list[int]]:
        """The step's batch, and the rows whose token is still on the device (async
        scheduling: a placeholder) with the slots of the step in flight that sampled them."""
        cfg = self.config
        rows = sum(n for _, n in chosen)
        batch = empty_batch(cfg.bucket(rows), cfg.max_num_seqs, cfg.max_blocks_per_seq)
        feed_rows: list[int] = []
        feed_slots: list[int] = []
        bs = cfg.block_size
        start = 0
        for s, (request, n) in enumerate(chosen):
            first = request.num_computed
            last = first + n - 1
            if request.pending_slot >= 0:    # its last token is still on the device
                feed_rows.append(start + n - 1)
                feed_slots.append(request.pending_slot)
                batch.token_ids[start + n - 1] = 0
            else:
                batch.token_ids[start + n - 1] = request.token(last)
            if n == 1:                       # a decode row: plain ints, no small arrays
                batch.positions[start] = first
                batch.slot_mapping[start] = request.blocks[first // bs] * bs + first % bs
            else:
                positions = np.arange(first, first + n, dtype=np.int32)
                batch.token_ids[start:start + n - 1] = [request.token(i)
                                                        for i in range(first, last)]
                batch.positions[start:start + n] = positions
                batch.slot_mapping[start:start + n] = (request.block_array[positions // bs] * bs
                                                       + positions % bs)
            batch.kv_lens[s] = first + n
            batch.block_tables[s, :len(request.blocks)] = request.block_array
            batch.cu_q_lens[s + 1] = start + n
            batch.logits_indices[s] = start + n - 1
            batch.request_ids[s] = request.id
            start += n
        batch.cu_q_lens[len(chosen) + 1:] = start
        batch.num_seqs[0] = len(chosen)
        return batch, feed_rows, feed_slots

    def _plan(self) -> tuple[list[tuple[Request, int]], StepBatch, list[int], list[int]] | None:
        """Admit, schedule and build the next step; ``None`` (and an idle step counted)
        when nothing can run."""
        self._admit()
        chosen = self._schedule()
        if not chosen:
            self.steps = self._next_arrival()
            return None
        return (chosen, *self._batch(chosen))

    def _advance(self, chosen: list[tuple[Request, int]], batch: StepBatch,
                 tokens: np.ndarray | None, host_ms: float, step_ms: float
                 ) -> tuple[StepRecord, list[tuple[Request, int]]]:
        """Book a dispatched step: computed tokens, sampled tokens (``tokens[s]``, or with
        ``tokens=None`` a placeholder per sampling sequence, returned with its slot),
        finished requests (their blocks freed), and the step's record."""
        prefill = decode = finished = 0
        samplers: list[tuple[Request, int]] = []
        for s, (request, n) in enumerate(chosen):
            if request.output:
                decode += 1
            else:
                prefill += n
            request.num_computed += n
            if request.num_computed == request.num_tokens:
                request.output.append(None if tokens is None else int(tokens[s]))
                request.pending_slot = s if tokens is None else -1
                samplers.append((request, s))
            if request.finished:
                self.allocator.free(request.release_blocks())
                self.running.remove(request)
                self.done[request.id] = request
                finished += 1
        record = StepRecord(
            index=self.steps, num_seqs=len(chosen), bucket=len(batch.token_ids),
            prefill_tokens=prefill, decode_tokens=decode,
            context_tokens=int(batch.kv_lens.sum()), sampled=len(samplers), finished=finished,
            host_ms=host_ms, step_ms=step_ms)
        self.records.append(record)
        self.steps += 1
        return record, samplers

    def step(self) -> StepRecord | None:
        """Run one step and wait for its tokens; ``None`` when nothing could run (no
        request has arrived yet)."""
        t0 = time.perf_counter()
        plan = self._plan()
        if plan is None:
            return None
        chosen, batch, _, _ = plan
        t1 = time.perf_counter()
        tokens = self.runner.step(batch)
        t2 = time.perf_counter()
        return self._advance(chosen, batch, tokens, (t1 - t0) * 1e3, (t2 - t1) * 1e3)[0]

    def run(self, requests: Iterable[Request],
            on_step: Callable[[Engine, StepRecord], None] | None = None) -> dict[int, list[int]]:
        """Add ``requests``, step until all finish; returns each request's output tokens."""
        for request in requests:
            self.add(request)
        if self.async_scheduling:
            self._run_overlapped(on_step)
        else:
            while self.has_work():
                record = self.step()
                if record is not None and on_step is not None:
                    on_step(self, record)
        return {i: list(r.output) for i, r in sorted(self.done.items())}

    def _run_overlapped(self, on_step: Callable[[Engine, StepRecord], None] | None) -> None:
        """Step until all finish with one step in flight (see the module doc)."""
        runner: Any = self.runner
        # the step in flight: its device tokens, its sampling (request, slot)s, its record
        in_flight: tuple[Any, list[tuple[Request, int]], int] | None = None
        while self.has_work() or in_flight is not None:
            t0 = time.perf_counter()
            plan = self._plan() if self.has_work() else None
            launched = None
            if plan is not None:
                chosen, batch, feed_rows, feed_slots = plan
                prepared = runner.prepare(batch)
                if feed_rows:
                    assert in_flight is not None, "a pending token with no step in flight"
                    prepared = runner.feed(prepared, feed_rows, feed_slots, in_flight[0])
                tokens = runner.launch(prepared)
            t1 = time.perf_counter()
            if in_flight is not None:
                tokens_in_flight, samplers, index = in_flight
                values = runner.fetch(tokens_in_flight)
                for request, s in samplers:  # their placeholders are still the last outputs
                    request.output[-1] = int(values[s])
                    request.pending_slot = -1
                # the wait belongs to the step it waited for
                self.records[index] = dataclasses.replace(
                    self.records[index], step_ms=(time.perf_counter() - t1) * 1e3)
            if plan is not None:
                record, samplers = self._advance(chosen, batch, None, (t1 - t0) * 1e3, 0.0)
                launched = (tokens, samplers, len(self.records) - 1)
                if on_step is not None:
                    on_step(self, record)
            in_flight = launched


__all__ = ["Engine", "OverlapRunner", "Request", "Runner", "StepRecord"]
