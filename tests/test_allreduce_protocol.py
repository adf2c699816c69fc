"""The all-reduce protocol (kernels/allreduce/protocol.h) run by CPU processes on shared
memory: what the CUDA kernel of issue 53 must do, checked where no GPU is.

Ranks are worker processes (one pool for the module) or, for the property test, threads;
each call's inputs come from a seed, so the parent rebuilds them for the references.
"""

from __future__ import annotations

import contextlib
import doctest
import multiprocessing
import os
import threading
import time
import uuid
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_kernels.kernels.allreduce import reference, simulation
from xla_kernels.kernels.allreduce.simulation import (
    AllReduceError,
    Communicator,
    PeerTimeoutError,
    plan,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
CAPACITY = 1 << 16
WORKERS = 4


@dataclass(frozen=True)
class Spec:
    """One call: a plain all-reduce of ``shape`` (fused=False) or the fused one of
    ``shape = (rows, hidden)``."""

    shape: tuple[int, ...]
    dtype: np.dtype
    mode: str
    fused: bool
    seed: int
    eps: float = 1e-6


def inputs(spec: Spec, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x of this rank, residual, weight): residual and weight are the same on every rank."""
    x = np.random.default_rng([spec.seed, rank]).standard_normal(spec.shape)
    shared = np.random.default_rng([spec.seed, 1 << 20])
    residual = shared.standard_normal(spec.shape)
    weight = 1 + 0.1 * shared.standard_normal(spec.shape[-1:])
    return x.astype(spec.dtype), residual.astype(spec.dtype), weight.astype(spec.dtype)


def call(comm: Communicator, spec: Spec) -> tuple[np.ndarray, ...]:
    x, residual, weight = inputs(spec, comm.rank)
    if spec.fused:
        return comm.all_reduce_add_rms_norm(x, residual, weight, eps=spec.eps, mode=spec.mode)
    return (comm.all_reduce(x, mode=spec.mode),)


def check(spec: Spec, ranks: int, results: list[tuple[np.ndarray, ...]]) -> None:
    """Every rank has the same bits, and they are the float64 reference's within the dtype."""
    for r, got in enumerate(results[1:], 1):
        for a, b in zip(results[0], got, strict=True):
            assert a.tobytes() == b.tobytes(), f"rank {r} differs from rank 0 on {spec}"
    xs = [inputs(spec, r)[0] for r in range(ranks)]
    if spec.fused:
        _, residual, weight = inputs(spec, 0)
        want = reference.all_reduce_add_rms_norm_numpy_f64(xs, residual, weight, eps=spec.eps)
        tol = 1e-5 if spec.dtype == F32 else 2 ** -6
        for got, ref in zip(results[0], want, strict=True):
            np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol,
                                       err_msg=str(spec))
    else:
        ref = reference.all_reduce_numpy_f64(xs)
        scale = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
        ulp = ranks * 2.0 ** -24 if spec.dtype == F32 else 2.0 ** -8
        err = np.abs(results[0][0].astype(np.float64) - ref)
        assert np.all(err <= ulp * scale), (spec, float(np.max(err / np.maximum(scale, 1e-30))))


# --- the worker processes --------------------------------------------------------------------


def _serve(conn) -> None:
    """A worker: opens groups, runs calls, answers results or the error it raised."""
    groups: dict[str, Communicator] = {}
    while True:
        command, *args = conn.recv()
        try:
            if command == "exit":
                return
            if command == "open":
                group, rank, ranks, options = args
                groups[group] = Communicator(group, rank, ranks, capacity=CAPACITY, **options)
                conn.send(None)
            elif command == "run":
                group, specs = args
                conn.send([call(groups[group], s) for s in specs])
            elif command == "close":
                groups.pop(args[0]).close()
                conn.send(None)
        except Exception as e:  # the parent checks which error, and its words
            conn.send(e)


class Pool:
    def __init__(self, n: int):
        context = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for _ in range(n):
            parent, child = context.Pipe()
            proc = context.Process(target=_serve, args=(child,), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def ask(self, workers, *command, timeout: float = 60.0) -> list:
        for w in workers:
            self.conns[w].send(command)
        answers = []
        for w in workers:
            assert self.conns[w].poll(timeout), f"worker {w} did not answer {command[0]!r}"
            answers.append(self.conns[w].recv())
        return answers

    @contextlib.contextmanager
    def group(self, ranks: int, **options):
        """A group of workers 0..ranks-1, closed (workspaces removed) even when a test fails."""
        name = self._open(ranks, options)
        try:
            yield name
        finally:
            self.ask(range(ranks), "close", name)

    def _open(self, ranks: int, options: dict) -> str:
        name = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}"
        for r in range(ranks):  # each worker is told its own rank
            self.conns[r].send(("open", name, r, ranks, options))
        for r in range(ranks):
            answer = self.conns[r].recv()
            assert answer is None, answer
        return name


@pytest.fixture(scope="module")
def pool():
    simulation.library()  # built once here, not by four workers at once
    workers = Pool(WORKERS)
    yield workers
    for conn in workers.conns:
        conn.send(("exit",))
    for proc in workers.procs:
        proc.join(10)


def odd_calls(seed: int) -> list[Spec]:
    """Plain and fused calls, f32 and bf16, one-shot and two-shot, odd sizes, back to back."""
    specs = []
    for i, (shape, fused) in enumerate([((1,), False), ((3,), False), ((17,), False),
                                        ((1001,), False), ((4099,), False), ((5, 7), False),
                                        ((1, 37), True), ((3, 37), True), ((7, 130), True),
                                        ((13, 64), True)]):
        for dtype in (F32, BF16):
            for mode in ("oneshot", "twoshot"):
                specs.append(Spec(shape, dtype, mode, fused, seed=seed * 1000 + i))
    return specs


# --- tests -----------------------------------------------------------------------------------


def test_plan_takes_oneshot_for_two_ranks_twoshot_for_large_messages_of_more_ranks():
    assert plan(1 << 16, 2, 1 << 20) == "oneshot"
    assert plan(1 << 20, 2, 1 << 20) == "oneshot"
    assert plan(simulation.ONE_SHOT_MAX_BYTES, 4, 1 << 20) == "oneshot"
    assert plan(simulation.ONE_SHOT_MAX_BYTES + 1, 4, 1 << 20) == "twoshot"


def test_plan_falls_back_above_the_capacity_or_outside_two_to_eight_ranks():
    assert plan((1 << 20) + 1, 2, 1 << 20) == "fallback"
    assert plan(64, 1, 1 << 20) == "fallback"
    assert plan(64, 9, 1 << 20) == "fallback"


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_agree_bitwise_and_match_the_f64_reference_over_many_calls(pool, ranks):
    specs = odd_calls(ranks) * 2  # 80 calls on one workspace: the epochs never reset
    with pool.group(ranks) as group:
        results = pool.ask(range(ranks), "run", group, specs)
    for answer in results:
        assert not isinstance(answer, BaseException), answer
    for i, spec in enumerate(specs):
        check(spec, ranks, [results[r][i] for r in range(ranks)])


def test_oneshot_and_twoshot_give_the_same_bits(pool):
    specs = [Spec(shape, dtype, mode, fused, seed=7)
             for shape, fused in (((999,), False), ((9, 33), True))
             for dtype in (F32, BF16) for mode in ("oneshot", "twoshot")]
    with pool.group(4) as group:
        (results, *_) = pool.ask(range(4), "run", group, specs)
    for one, two in zip(results[0::2], results[1::2], strict=True):
        assert [a.tobytes() for a in one] == [b.tobytes() for b in two]


def test_a_rank_that_never_calls_makes_the_others_fail_naming_it(pool):
    with pool.group(4, timeout_s=0.5) as group:
        warmup = [Spec((100,), F32, "twoshot", False, seed=1),
                  Spec((2, 50), BF16, "oneshot", True, seed=2)]
        answers = pool.ask(range(4), "run", group, warmup)
        assert not any(isinstance(a, BaseException) for a in answers)
        start = time.monotonic()
        errors = pool.ask(range(3), "run", group, [Spec((100,), F32, "oneshot", False, seed=3)])
        assert time.monotonic() - start < 10
        for rank, error in enumerate(errors):
            assert isinstance(error, PeerTimeoutError), error
            assert error.missing == (3,) and error.rank == rank
            assert "rank(s) [3]" in str(error) and "never arrived" in str(error)
        again = pool.ask([0], "run", group, warmup[:1])[0]
        assert isinstance(again, AllReduceError) and "broke earlier" in str(again)


def test_a_rank_that_never_starts_fails_the_rendezvous_naming_it():
    group = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with pytest.raises(PeerTimeoutError, match=r"rank\(s\) \[1\], which never appeared") as e:
        Communicator(group, 0, 2, capacity=CAPACITY, timeout_s=0.2)
    assert e.value.missing == (1,)
    assert not simulation.workspace_path(group, 0).exists()


def test_a_second_rank_with_the_same_number_is_refused():
    group = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}"
    path = simulation.workspace_path(group, 0)
    path.write_bytes(b"")
    try:
        with pytest.raises(AllReduceError, match="already exists"):
            Communicator(group, 0, 2, capacity=CAPACITY, timeout_s=0.2)
    finally:
        path.unlink()


def run_threads(ranks: int, specs: list[Spec], **options) -> list[list[tuple[np.ndarray, ...]]]:
    """Ranks as threads of this process, each with its own mapping of every workspace."""
    group = f"t{os.getpid()}_{uuid.uuid4().hex[:8]}"
    results: list = [None] * ranks

    def rank(r: int) -> None:
        try:
            with Communicator(group, r, ranks, capacity=CAPACITY, **options) as comm:
                results[r] = [call(comm, s) for s in specs]
        except Exception as e:
            results[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert not isinstance(r, BaseException), r
    return results


@settings(max_examples=12)
@given(ranks=st.integers(2, 4), rows=st.integers(1, 9), hidden=st.integers(1, 300),
       dtype=st.sampled_from([F32, BF16]), fused=st.booleans(),
       modes=st.lists(st.sampled_from(["oneshot", "twoshot", "auto"]), min_size=1, max_size=3),
       max_blocks=st.integers(1, 5))
def test_any_size_ranks_and_dtype_match_the_reference(ranks, rows, hidden, dtype, fused, modes,
                                                      max_blocks):
    specs = [Spec((rows, hidden), dtype, m, fused, seed=i) for i, m in enumerate(modes)]
    results = run_threads(ranks, specs, max_blocks=max_blocks, timeout_s=20.0)
    for i, spec in enumerate(specs):
        check(spec, ranks, [results[r][i] for r in range(ranks)])


def test_the_simulation_doctests_pass():
    assert doctest.testmod(simulation).failed == 0
    assert doctest.testmod(reference).failed == 0
