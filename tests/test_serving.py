"""The serving loop (tiny preset, CPU): the paged engine gives the dense reference's greedy
tokens in both frontends, whatever blocks it gets and however requests arrive; the block
allocator; the scheduler; the serve-bench command."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from serving_engine import fresh, make_runner, run_engine
from xla_kernels import cli
from xla_kernels.serving.batch import empty_batch
from xla_kernels.serving.bench import make_requests
from xla_kernels.serving.blocks import BlockAllocator
from xla_kernels.serving.config import EngineConfig, ServingConfigError, Workload, preset
from xla_kernels.serving.engine import Engine, Request
from xla_kernels.serving.reference import (
    dense_outputs,
    divergence_report,
    first_divergence,
)

MODEL = preset("tiny")
# Lengths that cross block boundaries and get chunked (budget 32), staggered arrivals.
WORKLOAD = Workload(requests=6, prompt_len=24, new_tokens=10, prompt_spread=0.8,
                    output_spread=0.7, arrival_every=2)
ENGINE = EngineConfig(block_size=16, num_blocks=24, max_num_seqs=3, max_model_len=64,
                      token_budget=32)


# The paged engine against the dense reference ------------------------------------------


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_paged_engine_matches_dense_reference_with_shuffled_blocks(
        frontend, cpu, weights, requests, reference):
    runner = make_runner(frontend, MODEL, weights, ENGINE, "xla-kernels")
    outputs, engine = run_engine(runner, requests, ENGINE, shuffle_seed=3)
    assert first_divergence(outputs, reference) is None
    assert any(r.prefill_tokens and r.decode_tokens for r in engine.records)  # mixed steps
    assert engine.allocator.num_used == 0


def test_plain_xla_attention_matches_dense_reference(cpu, weights, requests, reference):
    runner = make_runner("jax", MODEL, weights, ENGINE, "plain-xla")
    outputs, _ = run_engine(runner, requests, ENGINE, shuffle_seed=4)
    assert first_divergence(outputs, reference) is None


class ContiguousSlotsEngine(Engine):
    """A wrong engine: computes slots as if a request's blocks were consecutive."""

    def _batch(self, chosen):
        batch, *feed = super()._batch(chosen)
        bs = self.config.block_size
        for s, (request, _) in enumerate(chosen):
            rows = slice(batch.cu_q_lens[s], batch.cu_q_lens[s + 1])
            pos = batch.positions[rows]
            batch.slot_mapping[rows] = request.blocks[0] * bs + pos
        return (batch, *feed)


def test_the_reference_check_catches_an_engine_that_assumes_contiguous_blocks(
        cpu, weights, requests, reference):
    runner = make_runner("jax", MODEL, weights, ENGINE, "xla-kernels")
    outputs, _ = run_engine(runner, requests, ENGINE, shuffle_seed=3,
                            engine_type=ContiguousSlotsEngine)
    assert first_divergence(outputs, reference) is not None


def test_engine_waits_for_blocks_and_still_matches(cpu, weights, requests, reference):
    # Room for about two requests' reservations: the others wait until blocks are freed.
    config = EngineConfig(block_size=16, num_blocks=5, max_num_seqs=3, max_model_len=64,
                          token_budget=32)
    runner = make_runner("jax", MODEL, weights, config, "xla-kernels")
    engine = Engine(runner, config, BlockAllocator(5, shuffle_seed=5))
    blocked = []

    def watch(engine, record):
        arrived = [r for r in engine.waiting if r.arrival <= engine.steps]
        blocked.append(bool(arrived) and len(engine.running) < config.max_num_seqs)

    outputs = engine.run(fresh(requests), on_step=watch)
    assert any(blocked)                      # a request waited for blocks, not for a slot
    assert first_divergence(outputs, reference) is None
    assert engine.allocator.num_free == 5


def test_divergence_report_names_the_runner_up_and_its_margin(cpu, weights, requests, reference):
    ref = dense_outputs(MODEL, weights, [r.prompt for r in requests],
                        [r.max_new_tokens for r in requests])
    assert ref.tokens == [reference[r.id] for r in requests]
    margins = np.concatenate([np.asarray(m) for m in ref.margins])
    assert (margins >= 0).all() and margins.max() > 0
    assert all(t != u for ts, us in zip(ref.tokens, ref.runner_ups, strict=True)
               for t, u in zip(ts, us, strict=True))
    ids = [r.id for r in requests]
    assert divergence_report(reference, ids, ref) is None
    # Swap in the runner-up at the reference's closest call: the report says so.
    row, index = min(((i, j) for i, m in enumerate(ref.margins) for j in range(len(m))),
                     key=lambda ij: ref.margins[ij[0]][ij[1]])
    engine = {rid: list(reference[rid]) for rid in ids}
    engine[ids[row]][index] = ref.runner_ups[row][index]
    report = divergence_report(engine, ids, ref)
    assert report["request"] == ids[row] and report["index"] == index
    assert report["engine_took_runner_up"] and report["diverged_requests"] == 1
    assert report["reference_margin"] == pytest.approx(margins.min())
    assert report["margin_quantile"] == pytest.approx(np.mean(margins <= margins.min()))


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_step_is_one_program_per_bucket_with_the_caches_donated(frontend, cpu, weights):
    runner = make_runner(frontend, MODEL, weights, ENGINE, "xla-kernels")
    for bucket in (*ENGINE.buckets(), 16):
        runner.step(empty_batch(bucket, ENGINE.max_num_seqs, ENGINE.max_blocks_per_seq))
    assert runner.compiled_buckets() == len(ENGINE.buckets()) == 2
    text = runner.lower(empty_batch(16, ENGINE.max_num_seqs,
                                    ENGINE.max_blocks_per_seq)).as_text()
    assert text.count("tf.aliasing_output") == 2 * MODEL.num_layers     # every cache donated
    assert text.count("@xla_kernels.reshape_and_cache(") == MODEL.num_layers
    assert text.count("@xla_kernels.ragged_paged_attention(") == MODEL.num_layers
    assert text.count("@xla_kernels.rms_norm(") == 2 * MODEL.num_layers + 1


# Scheduler and allocator (a stand-in runner: no model) ---------------------------------


class CountingRunner:
    """Samples 1000 + the step number; records each step's batch."""

    def __init__(self):
        self.batches = []

    def step(self, batch):
        self.batches.append(batch)
        return np.full(batch.kv_lens.shape, 1000 + len(self.batches), np.int32)


def test_requests_of_different_lengths_finish_while_others_arrive():
    config = EngineConfig(block_size=16, num_blocks=8, max_num_seqs=2, max_model_len=64,
                          token_budget=16)
    requests = [Request(0, [1] * 30, 2), Request(1, [2] * 3, 6, arrival=1),
                Request(2, [3] * 5, 1, arrival=2), Request(3, [4] * 9, 3, arrival=9)]
    engine = Engine(CountingRunner(), config)
    outputs = engine.run(requests)
    assert {i: len(o) for i, o in outputs.items()} == {0: 2, 1: 6, 2: 1, 3: 3}
    finish_order = list(engine.done)
    assert finish_order.index(0) < finish_order.index(3)
    assert all(r.prefill_tokens + r.decode_tokens <= 16 for r in engine.records)
    assert max(r.num_seqs for r in engine.records) == 2
    assert engine.allocator.num_used == 0
    # Request 0's 30-token prompt was chunked: 16 rows, then its last 14 with the first 2
    # of request 1 (which arrived meanwhile).
    assert [(r.num_seqs, r.prefill_tokens) for r in engine.records[:2]] == [(1, 16), (2, 16)]


def test_a_request_that_cannot_get_blocks_waits_first_come_first_served():
    config = EngineConfig(block_size=16, num_blocks=3, max_num_seqs=4, max_model_len=64,
                          token_budget=64)
    engine = Engine(CountingRunner(), config)
    engine.add(Request(0, [1] * 20, 4))       # 2 blocks
    engine.add(Request(1, [1] * 20, 4))       # 2 blocks: must wait for request 0
    engine.add(Request(2, [1] * 3, 2))        # 1 block: behind request 1, waits too
    engine.step()
    assert [r.id for r in engine.running] == [0] and len(engine.waiting) == 2
    while 0 not in engine.done:
        engine.step()
    engine.step()
    assert {r.id for r in engine.running} == {1, 2}


def test_block_tables_and_slots_follow_the_allocated_blocks():
    config = EngineConfig(block_size=16, num_blocks=8, max_num_seqs=2, max_model_len=64,
                          token_budget=64)
    runner = CountingRunner()
    engine = Engine(runner, config, BlockAllocator(8, shuffle_seed=0))
    engine.run([Request(0, list(range(40)), 1)])
    batch, blocks = runner.batches[0], engine.done[0]
    table = batch.block_tables[0, :3]
    positions = np.arange(40)
    np.testing.assert_array_equal(batch.slot_mapping[:40],
                                  table[positions // 16] * 16 + positions % 16)
    assert (batch.slot_mapping[40:] == -1).all() and batch.token_ids.shape == (64,)
    assert blocks.blocks == []                                # freed on finishing


def test_every_row_of_every_step_has_its_token_position_and_slot():
    """Prefill chunks and decode rows (built by different code) against the requests: each
    row's token is the request's token at its position (a decode row's is the token the
    previous step sampled), and its slot is its block's."""
    config = EngineConfig(block_size=16, num_blocks=12, max_num_seqs=3, max_model_len=80,
                          token_budget=32)
    runner = CountingRunner()
    engine = Engine(runner, config, BlockAllocator(12, shuffle_seed=5))
    requests = _mixed_requests()
    outputs = engine.run(fresh(requests))
    prompts = {r.id: r.prompt for r in requests}
    checked = {"prefill": 0, "decode": 0}
    for batch in runner.batches:
        for s in range(int(batch.num_seqs[0])):
            lo, hi = int(batch.cu_q_lens[s]), int(batch.cu_q_lens[s + 1])
            table = batch.block_tables[s]
            ids = [i for i, p in prompts.items()
                   if list(batch.token_ids[lo:hi]) == (p + outputs[i])[
                       batch.positions[lo]:batch.positions[hi - 1] + 1]]
            assert ids, (lo, hi)
            for row in range(lo, hi):
                pos = int(batch.positions[row])
                assert batch.slot_mapping[row] == table[pos // 16] * 16 + pos % 16
            checked["decode" if hi - lo == 1 else "prefill"] += 1
    assert checked["decode"] > 20 and checked["prefill"] > 5, checked


def test_allocator_reuses_freed_blocks_and_refuses_double_free():
    alloc = BlockAllocator(4, shuffle_seed=7)
    first = alloc.allocate(4)
    assert sorted(first) == [0, 1, 2, 3] and alloc.allocate(1) is None
    alloc.free(first[:2])
    assert sorted(alloc.allocate(2)) == sorted(first[:2])
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free([first[0], first[0]])


def test_a_request_longer_than_the_cache_is_refused_with_the_fix():
    engine = Engine(CountingRunner(), EngineConfig(num_blocks=2, max_model_len=1000))
    with pytest.raises(ServingConfigError, match=r"needs 3 blocks.*Fix: raise num_blocks"):
        engine.add(Request(0, [1] * 40, 2))
    with pytest.raises(ServingConfigError, match="exceeds max_model_len"):
        engine.add(Request(1, [1] * 999, 2))


# Async scheduling (one step in flight) --------------------------------------------------


class MixingRunner:
    """An OverlapRunner on NumPy whose token for a sequence mixes every input token of the
    sequence's rows with its last position: a decode row fed the wrong token changes every
    token after it."""

    def prepare(self, batch):
        return batch._replace(token_ids=batch.token_ids.copy())

    def feed(self, prepared, rows, slots, tokens):
        ids = prepared.token_ids.copy()
        ids[rows] = tokens[slots]
        return prepared._replace(token_ids=ids)

    def launch(self, batch):
        out = np.zeros(batch.kv_lens.shape, np.int32)
        for s in range(int(batch.num_seqs[0])):
            lo, hi = batch.cu_q_lens[s], batch.cu_q_lens[s + 1]
            out[s] = (int(batch.token_ids[lo:hi].sum()) * 31 + int(batch.positions[hi - 1]) * 7
                      + s) % 997
        return out

    def fetch(self, tokens):
        return np.asarray(tokens)

    def step(self, batch):
        return self.fetch(self.launch(self.prepare(batch)))


class NoFeedRunner(MixingRunner):
    """Forgets to feed: decode rows keep the placeholder 0 (the tests must notice)."""

    def feed(self, prepared, rows, slots, tokens):
        return prepared


def _mixed_requests() -> list[Request]:
    rng = np.random.default_rng(0)
    return [Request(i, [int(t) for t in rng.integers(1, 900, rng.integers(1, 40))],
                    int(rng.integers(1, 12)), arrival=int(rng.integers(0, 15)))
            for i in range(12)]


def test_async_scheduling_gives_the_synchronous_engines_tokens_and_steps():
    config = EngineConfig(block_size=16, num_blocks=10, max_num_seqs=3, max_model_len=80,
                          token_budget=32)
    requests = _mixed_requests()
    sync_out, sync = run_engine(MixingRunner(), requests, config, shuffle_seed=1)
    engine = Engine(MixingRunner(), config, BlockAllocator(10, shuffle_seed=1),
                    async_scheduling=True)
    seen = []
    outputs = engine.run(fresh(requests), on_step=lambda e, r: seen.append(r.index))
    assert outputs == sync_out and sum(map(len, outputs.values())) == 76
    assert all(None not in r.output for r in engine.done.values())
    assert [(r.num_seqs, r.prefill_tokens, r.decode_tokens, r.sampled, r.finished)
            for r in engine.records] == [(r.num_seqs, r.prefill_tokens, r.decode_tokens,
                                          r.sampled, r.finished) for r in sync.records]
    assert seen == [r.index for r in engine.records] and engine.allocator.num_used == 0
    forgetful = Engine(NoFeedRunner(), config, BlockAllocator(10, shuffle_seed=1),
                       async_scheduling=True)
    assert forgetful.run(fresh(requests)) != sync_out


class QueuedDeviceRunner(MixingRunner):
    """A simulated device queue: a step's tokens are ready ``cost`` seconds after the device
    is free (prefill 5 ms a row, a decode step 50 ms: long next to the host's own work, even
    on a loaded machine that stalls it for tens of ms); fetch waits for them."""

    def __init__(self):
        self.free_at = 0.0

    def launch(self, batch):
        rows = int(batch.cu_q_lens[int(batch.num_seqs[0])])
        cost = 0.05 if rows == int(batch.num_seqs[0]) else 0.005 * rows
        self.free_at = max(self.free_at, time.perf_counter()) + cost
        return super().launch(batch), self.free_at

    def fetch(self, tokens):
        while time.perf_counter() < tokens[1]:
            pass
        return tokens[0]

    def feed(self, prepared, rows, slots, tokens):
        return super().feed(prepared, rows, slots, tokens[0])


def test_async_scheduling_books_each_steps_wait_in_its_own_record():
    """The 64-row prefill step's device time (320 ms) shows in the prefill record, not in the
    decode record after it; and the last step's wait is booked too."""
    config = EngineConfig(num_blocks=64, max_num_seqs=4, token_budget=64)
    engine = Engine(QueuedDeviceRunner(), config, async_scheduling=True)
    engine.run([Request(i, [1] * 16, 4) for i in range(4)])
    times = [(r.kind, r.host_ms + r.step_ms) for r in engine.records]
    assert [k for k, _ in times] == ["prefill", "decode", "decode", "decode"]
    assert times[0][1] > 300 and all(t < 200 for _, t in times[1:]), times
    assert engine.records[-1].step_ms > 10, times


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_async_scheduling_matches_dense_reference(frontend, cpu, weights, requests, reference):
    runner = make_runner(frontend, MODEL, weights, ENGINE, "xla-kernels")
    engine = Engine(runner, ENGINE, BlockAllocator(ENGINE.num_blocks, shuffle_seed=3),
                    async_scheduling=True)
    assert engine.run(fresh(requests)) == reference
    assert runner.compiled_buckets() == len(ENGINE.buckets())


def test_async_scheduling_needs_a_runner_that_can_split_its_step():
    with pytest.raises(ServingConfigError, match=r"^async scheduling needs a runner with "
                       r"prepare, feed, launch and fetch; CountingRunner has only step. Fix: "
                       r"use JaxRunner or TorchaxRunner, or async_scheduling=False.$"):
        Engine(CountingRunner(), ENGINE, async_scheduling=True)


# The command ---------------------------------------------------------------------------


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_serve_bench_writes_json_and_matches_reference(frontend, tmp_path: Path, capsys):
    out = tmp_path / f"{frontend}.json"
    status = cli.main(["serve-bench", "--preset", "tiny", "--frontend", frontend,
                       "--platform", "cpu", "--requests", "4", "--json", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["matches_reference"] is True
    for key in ("tokens_per_s", "decode_step_ms", "prefill_tokens_per_s", "config",
                "steps", "breakdown"):
        assert result[key] is not None, key
    assert result["tokens_per_s"] > 0 and result["generated_tokens"] > 0
    assert result["config"]["frontend"] == frontend
    assert result["config"]["attention"] == "xla-kernels"
    assert result["config"]["moe"] is None  # a dense model: no experts
    assert result["config"]["platform"] == "cpu"
    assert result["compiled_programs"] == len(result["config"]["engine"]["buckets"])
    assert result["breakdown"]["attention_share"] > 0
    assert out.with_suffix(".svg").read_text().startswith("<svg")
    captured = capsys.readouterr()
    assert "matches_reference  True" in captured.out
    assert "serve-bench [" in captured.err and "4/4 requests" in captured.err


def test_serve_bench_async_scheduling_matches_reference(tmp_path: Path, capsys):
    out = tmp_path / "async.json"
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--requests", "4",
                     "--async-scheduling", "--no-breakdown", "--no-progress",
                     "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["matches_reference"] is True and result["config"]["async_scheduling"] is True
    assert result["compiled_programs"] == len(result["config"]["engine"]["buckets"])
    assert "jax, xla-kernels, cpu, async scheduling" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "7b"], "unknown preset '7b'. Fix: pass --preset tiny, 1b, 8b, tiny-moe or moe."),
    (["--frontend", "tf"], "unknown --frontend 'tf'. Fix: pass --frontend jax or torchax."),
    (["--attention", "flash"],
     "unknown --attention 'flash'. Fix: pass --attention xla-kernels or plain-xla."),
    (["--platform", "tpu"], "unknown --platform 'tpu'. Fix: pass --platform cpu or gpu."),
])
def test_serve_bench_bad_names_are_one_line_errors_with_the_fix(argv, message, capsys):
    assert cli.main(["serve-bench", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"xla-kernels serve-bench: error: {message}"]


def test_workload_is_seeded_and_spread():
    a = make_requests(WORKLOAD, MODEL.vocab_size, seed=1)
    b = make_requests(WORKLOAD, MODEL.vocab_size, seed=1)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert len({len(r.prompt) for r in a}) > 1 and len({r.max_new_tokens for r in a}) > 1
    assert [r.arrival for r in a] == [0, 2, 4, 6, 8, 10]
