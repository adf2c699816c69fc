"""sample's CUDA kernel: the same token as the CPU kernel for every row (the two compute the
same integers, sampling_core.h), its draws against the float64 distribution, greedy equal to
argmax, reproducible, and the torch operator on CUDA tensors."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
import torch

from sampling_reference import (
    CONFIGS,
    P_VALUE_FLOOR,
    chi_squared_p_value,
    filtered_probs,
    row_logits,
)
from test_sampling import per_row
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.sampling import sample

pytestmark = pytest.mark.gpu

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def on(platform: str, logits: np.ndarray, args: list[np.ndarray]) -> np.ndarray:
    device = jax.devices(platform)[0]
    put = [jax.device_put(a, device) for a in (logits, *args)]
    out = jax.jit(sample)(*put)
    assert out.devices().pop().platform == platform
    return np.asarray(out)


def mixed_rows(rng: np.random.Generator, rows: int) -> list[np.ndarray]:
    """Per-row settings that differ row to row: greedy, each filter alone, all together,
    off-range values; top-k sets that fit the kernel's shared-memory candidates (<= 1024)
    and larger ones."""
    temperature = rng.choice([0.0, 0.5, 1.0, 1.7], rows).astype(np.float32)
    top_k = rng.choice([0, 1, 5, 50, 1000, 5000, -3, 10**9], rows).astype(np.int32)
    top_p = rng.choice([1.0, 0.9, 0.5, 0.0, 1.5], rows).astype(np.float32)
    min_p = rng.choice([0.0, 0.05, 0.3, 2.0], rows).astype(np.float32)
    seeds = rng.integers(0, 2**32, rows, dtype=np.uint64).astype(np.uint32)
    offsets = rng.integers(0, 2**31, rows).astype(np.int32)
    return [temperature, top_k, top_p, min_p, seeds, offsets]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("rows, vocab", [(1, 128256), (16, 128256), (24, 128256), (33, 1001),
                                         (64, 128256), (7, 1001), (300, 48), (5, 3),
                                         (3, 262147), (160, 128256)])
def test_cuda_picks_the_cpu_kernels_token_on_every_row(rng, dtype, rows, vocab):
    """On Hopper (132 SMs) up to 16 rows run as clusters of 8 blocks, 17-33 of 4 (24, 33),
    34-66 of 2 (64), more as one block a row: each must give the CPU's token."""
    logits = (rng.standard_normal((rows, vocab)) * rng.uniform(0.5, 3)).astype(DTYPES[dtype])
    logits[0, rng.integers(0, vocab, max(1, vocab // 10))] = -np.inf
    args = mixed_rows(rng, rows)
    np.testing.assert_array_equal(on("gpu", logits, args), on("cpu", logits, args))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cuda_draws_follow_the_float64_distribution(name):
    row = row_logits(64, seed=5)
    config = CONFIGS[name]
    logits = np.broadcast_to(row, (60_000, row.size))
    tokens = on("gpu", np.ascontiguousarray(logits), per_row(60_000, *config, seed_base=99))
    assert chi_squared_p_value(tokens, filtered_probs(row, *config)) > P_VALUE_FLOOR


def test_cuda_draws_at_128k_follow_the_distribution_of_top_k_and_top_p():
    rng = np.random.default_rng(8)
    row = (rng.standard_normal(128256) * 2).astype(np.float32)
    config = (1.0, 40, 0.95, 0.0)
    n = 20_000
    rows = jax.jit(lambda r, *a: sample(jax.numpy.broadcast_to(r, (n, r.size)), *a))
    tokens = np.asarray(rows(row, *per_row(n, *config, seed_base=5)))
    assert chi_squared_p_value(tokens, filtered_probs(row, *config)) > P_VALUE_FLOOR


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_cuda_greedy_is_argmax_with_ties_to_the_lowest_index(rng, dtype):
    logits = rng.standard_normal((256, 128256)).astype(DTYPES[dtype])
    logits[3, [5, 70000, 128255]] = 30
    args = per_row(256, 0.0, top_k=50, top_p=0.9)
    tokens = on("gpu", logits, args)
    np.testing.assert_array_equal(tokens, np.argmax(logits.astype(np.float32), axis=-1))
    assert tokens[3] == 5


def test_cuda_same_seed_same_token_and_batch_independent(rng):
    logits = rng.standard_normal((64, 32000)).astype(ml_dtypes.bfloat16)
    args = mixed_rows(rng, 64)
    first = on("gpu", logits, args)
    np.testing.assert_array_equal(on("gpu", logits, args), first)
    order = rng.permutation(64)
    np.testing.assert_array_equal(on("gpu", logits[order], [a[order] for a in args]),
                                  first[order])


def test_cuda_torch_operator_matches_jax(rng):
    logits = rng.standard_normal((32, 5000)).astype(np.float32)
    args = mixed_rows(rng, 32)
    want = on("gpu", logits, args)
    t = [torch.from_numpy(a.view(np.int32) if a.dtype == np.uint32 else a).cuda()
         for a in (logits, *args)]
    got = torch_op(sample)(*t)
    assert got.is_cuda
    np.testing.assert_array_equal(got.cpu().numpy(), want)


def test_cuda_edge_rows(rng):
    logits = rng.standard_normal((4, 700)).astype(np.float32)
    logits[0, :] = -np.inf
    logits[0, 123] = 1.0
    logits[1, :] = np.nan
    logits[2, 9] = np.inf
    logits[3, :] = 0.0
    args = per_row(4, 1.0, top_k=3, top_p=0.5, min_p=0.1)
    got = on("gpu", logits, args)
    np.testing.assert_array_equal(got, on("cpu", logits, args))
    assert got[:3].tolist() == [123, 0, 9]
