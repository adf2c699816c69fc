"""Test configuration: fresh random inputs, the GPU marker, and the test ops' import path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("XLA_KERNELS_QUIET", "1")


def _load_hypothesis_profile() -> None:
    """Property tests draw a fixed, reproducible set of examples (CI has a time limit; a
    failure must reproduce); each sets its budget with @settings(max_examples=...). The
    torch_xla environment has no property tests and no hypothesis."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    settings.register_profile("xla_kernels", derandomize=True, deadline=None, database=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("xla_kernels")


_load_hypothesis_profile()


def _jax_has_gpu() -> bool:
    try:
        import jax

        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _jax_has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU visible to JAX (scripts/gpu/tests.sh)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator with a fresh seed per test; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


# The serving tests (test_serving*.py) share these: each such module names its model preset
# (MODEL) and its workload (WORKLOAD) as module constants, and these fixtures build the
# weights, the requests and the dense reference's greedy tokens from them, once per module.


@pytest.fixture(scope="module")
def cpu():
    """Runs the module's tests with JAX's default device the CPU."""
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(scope="module")
def weights(cpu, request: pytest.FixtureRequest):
    """The module's MODEL's random weights (seed 0)."""
    from xla_kernels.serving.weights import init_weights

    return init_weights(request.module.MODEL, seed=0)


@pytest.fixture(scope="module")
def requests(request: pytest.FixtureRequest) -> list:
    """The module's WORKLOAD's requests (seed 1)."""
    from xla_kernels.serving.bench import make_requests

    return make_requests(request.module.WORKLOAD, request.module.MODEL.vocab_size, seed=1)


@pytest.fixture(scope="module")
def reference(weights, requests, request: pytest.FixtureRequest) -> dict[int, list[int]]:
    """The dense (unpaged) reference's greedy tokens of each request, by request id."""
    from serving_engine import reference_tokens

    return reference_tokens(request.module.MODEL, weights, requests)
