"""Running the paged engine in the serving tests: fresh copies of the requests (an engine
consumes them) and one run on a shuffled or ordered block allocator."""

from __future__ import annotations

from xla_kernels.serving.blocks import BlockAllocator
from xla_kernels.serving.config import EngineConfig
from xla_kernels.serving.engine import Engine, Request


def fresh(requests: list[Request]) -> list[Request]:
    """Unstarted copies of ``requests``."""
    return [Request(r.id, list(r.prompt), r.max_new_tokens, r.arrival) for r in requests]


def run_engine(runner, requests: list[Request], config: EngineConfig, *,
               shuffle_seed: int | None = None, engine_type: type = Engine):
    """``(outputs, engine)`` of one run of fresh copies of ``requests``."""
    engine = engine_type(runner, config, BlockAllocator(config.num_blocks,
                                                        shuffle_seed=shuffle_seed))
    return engine.run(fresh(requests)), engine
