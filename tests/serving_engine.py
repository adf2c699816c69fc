"""Running the paged engine in the serving tests: a small workload and engine shared by the
tiny-model tests, a runner made from option words, fresh copies of the requests (an engine
consumes them), one run on a shuffled or ordered block allocator, the dense reference's
tokens to compare with, and a script run on two fake CPU devices (tensor parallel)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from xla_kernels.serving.blocks import BlockAllocator
from xla_kernels.serving.config import EngineConfig, Workload
from xla_kernels.serving.engine import Engine, Request

# Five requests over three sequence slots and 24 blocks: prefill chunks, preemption-free
# continuous batching and block reuse in a few engine steps.
SMALL_WORKLOAD = Workload(requests=5, prompt_len=24, new_tokens=8, prompt_spread=0.8,
                          output_spread=0.7, arrival_every=2)
SMALL_ENGINE = EngineConfig(block_size=16, num_blocks=24, max_num_seqs=3, max_model_len=64,
                            token_budget=32)


def make_runner(frontend: str, config, weights, engine: EngineConfig,
                attention: str = "xla-kernels", tp: int = 1, *, moe: str = "auto"):
    """The runner serve-bench makes for these option words, resolved as it resolves them
    (:func:`~xla_kernels.serving.backend.resolve_backend`)."""
    from xla_kernels.serving import bench
    from xla_kernels.serving.backend import resolve_backend, resolve_frontend

    return bench.make_runner(resolve_frontend(frontend), config, weights, engine,
                             resolve_backend(config, attention, moe), tp)


def fresh(requests: list[Request]) -> list[Request]:
    """Unstarted copies of ``requests``."""
    return [Request(r.id, list(r.prompt), r.max_new_tokens, r.arrival) for r in requests]


def run_engine(runner, requests: list[Request], config: EngineConfig, *,
               shuffle_seed: int | None = None, engine_type: type = Engine):
    """``(outputs, engine)`` of one run of fresh copies of ``requests``."""
    engine = engine_type(runner, config, BlockAllocator(config.num_blocks,
                                                        shuffle_seed=shuffle_seed))
    return engine.run(fresh(requests)), engine


def reference_tokens(config, weights, requests: list[Request]) -> dict[int, list[int]]:
    """The dense (unpaged) reference's greedy tokens of each request, by request id."""
    from xla_kernels.serving.reference import dense_greedy

    out = dense_greedy(config, weights, [r.prompt for r in requests],
                       [r.max_new_tokens for r in requests])
    return {r.id: o for r, o in zip(requests, out, strict=True)}


def run_on_two_cpu_devices(script: str) -> subprocess.CompletedProcess:
    """``python -c script`` in a fresh process whose JAX has two CPU devices (the count is
    fixed when JAX starts), with the sources and this folder (so ``serving_engine``) on its
    path."""
    tests = Path(__file__).resolve().parent
    path = os.pathsep.join([str(tests.parent / "src"), str(tests)])
    env = {**os.environ, "PYTHONPATH": path,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, env=env)
