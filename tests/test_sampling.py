"""sample: draws against the float64 distribution of the documented filters (chi-squared),
greedy at temperature 0, seeded reproducibility and batch independence, the Philox stream,
ties and -inf, bad inputs, the torch operator and the sharding rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import xla_kernels as xk
from sampling_reference import (
    CONFIGS,
    P_VALUE_FLOOR,
    chi_squared_p_value,
    filtered_probs,
    row_logits,
)
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.sampling import sample

DRAWS = 60_000
VOCAB = 48
COLUMNS, VEC = 4096, 4  # kColumns, kVec in sampling_core.h: the draw's column order


def per_row(n: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
            min_p: float = 0.0, seed_base: int = 0, offset: int = 0) -> list[np.ndarray]:
    """The six per-row arrays, one setting for every row; seeds seed_base, seed_base + 1..."""
    return [np.full(n, temperature, np.float32), np.full(n, top_k, np.int32),
            np.full(n, top_p, np.float32), np.full(n, min_p, np.float32),
            (np.arange(n, dtype=np.uint64) + seed_base).astype(np.uint32),
            np.full(n, offset, np.int32)]


def draw(row: np.ndarray, n: int, config: tuple, seed_base: int = 0, dtype=np.float32,
         fn=sample) -> np.ndarray:
    """``n`` draws from one row of logits (one per seed)."""
    logits = np.broadcast_to(row.astype(dtype), (n, row.size))
    return np.asarray(fn(logits, *per_row(n, *config, seed_base=seed_base)))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_draws_follow_the_float64_distribution(name):
    row = row_logits(VOCAB, seed=1)
    tokens = draw(row, DRAWS, CONFIGS[name], seed_base=1000 * len(name))
    p = chi_squared_p_value(tokens, filtered_probs(row, *CONFIGS[name]))
    assert p > P_VALUE_FLOOR, f"{name}: p-value {p:.2e}"


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_half_precision_logits_draw_from_their_own_values(dtype):
    row = row_logits(VOCAB, seed=2).astype(dtype)
    config = CONFIGS["all_filters"]
    tokens = draw(row, DRAWS, config, seed_base=7, dtype=dtype)
    assert chi_squared_p_value(tokens, filtered_probs(row.astype(np.float64), *config)) \
        > P_VALUE_FLOOR


def wrong_top_p(row: np.ndarray, config: tuple) -> np.ndarray:
    """The top-p distribution with one token too many kept (the next most likely)."""
    right = filtered_probs(row, *config)
    temperature = config[0]
    extra = np.argmax(np.where(right > 0, -np.inf, row))
    p = np.exp((row - row.max()) / temperature)
    wrong = np.where((right > 0) | (np.arange(row.size) == extra), p, 0.0)
    return wrong / wrong.sum()


def test_a_top_p_off_by_one_token_fails_the_chi_squared_test():
    row = row_logits(VOCAB, seed=1)
    config = CONFIGS["top_p"]
    tokens = draw(row, DRAWS, config, seed_base=3)
    assert chi_squared_p_value(tokens, filtered_probs(row, *config)) > P_VALUE_FLOOR
    with pytest.raises(AssertionError, match="drew tokens of probability 0"):
        chi_squared_p_value(tokens, filtered_probs(row, 1.0, 0, config[2] - 0.12, 0.0))
    assert chi_squared_p_value(tokens, wrong_top_p(row, config)) < P_VALUE_FLOOR


def test_a_top_k_off_by_one_fails_the_chi_squared_test():
    row = row_logits(VOCAB, seed=1)
    tokens = draw(row, DRAWS, CONFIGS["top_k"], seed_base=4)
    t, k, p, m = CONFIGS["top_k"]
    assert chi_squared_p_value(tokens, filtered_probs(row, t, k + 1, p, m)) < P_VALUE_FLOOR


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_temperature_zero_or_below_is_argmax_with_ties_to_the_lowest_index(rng, temperature):
    logits = rng.standard_normal((64, 300)).astype(np.float32)
    logits[5, [17, 40, 299]] = 9.0
    logits[6, :] = -np.inf
    logits[6, 250:] = 2.0
    tokens = np.asarray(sample(logits, *per_row(64, temperature, top_k=3, top_p=0.5)))
    want = np.argmax(logits, axis=-1)
    assert want[5] == 17 and want[6] == 250
    np.testing.assert_array_equal(tokens, want)


def test_a_row_with_an_infinite_or_nan_maximum_is_greedy():
    logits = np.zeros((2, 8), np.float32)
    logits[0, 3] = np.inf
    logits[1, :] = np.nan
    assert np.asarray(sample(logits, *per_row(2))).tolist() == [3, 0]


def test_the_same_seed_and_offset_give_the_same_token(rng):
    logits = rng.standard_normal((32, 1000)).astype(np.float32) * 0.3
    args = per_row(32, 1.0, top_p=0.95, seed_base=77, offset=5)
    first, again = (np.asarray(sample(logits, *args)) for _ in range(2))
    np.testing.assert_array_equal(first, again)
    args[5] = args[5] + 1
    other = np.asarray(sample(logits, *args))
    assert (other != first).sum() > 24  # near-uniform over ~1000 tokens: almost all differ


def test_a_row_draws_the_same_token_in_any_batch(rng):
    logits = rng.standard_normal((40, 500)).astype(np.float32)
    args = per_row(40, 0.9, top_k=100, top_p=0.9, min_p=0.01, seed_base=5)
    args[5] = np.arange(40, dtype=np.int32) * 3
    tokens = np.asarray(sample(logits, *args))
    order = rng.permutation(40)
    shuffled = np.asarray(sample(logits[order], *[a[order] for a in args]))
    np.testing.assert_array_equal(shuffled, tokens[order])
    alone = np.asarray(sample(logits[7:8], *[a[7:8] for a in args]))
    assert alone[0] == tokens[7]


def test_top_k_keeps_tied_logits_together():
    row = np.array([3.0, 1.0, 3.0, 0.0, 3.0, 2.5] + [-1.0] * 10, np.float32)
    tokens = draw(row, 30_000, (1.0, 2, 1.0, 0.0), seed_base=11)
    assert set(np.unique(tokens)) == {0, 2, 4}
    assert chi_squared_p_value(tokens, filtered_probs(row, 1.0, 2, 1.0, 0.0)) > P_VALUE_FLOOR


def test_top_p_zero_keeps_only_the_most_likely_logit():
    row = np.array([1.0, 4.0, 4.0, 3.9], np.float32)
    tokens = draw(row, 4000, (1.0, 0, 0.0, 0.0), seed_base=2)
    assert set(np.unique(tokens)) == {1, 2}


def test_minus_infinity_logits_are_never_drawn():
    row = np.full(64, -np.inf, np.float32)
    row[[3, 30, 63]] = [0.0, 1.0, 0.5]
    tokens = draw(row, 20_000, (5.0, 0, 1.0, 0.0), seed_base=9)
    assert set(np.unique(tokens)) == {3, 30, 63}
    assert chi_squared_p_value(tokens, filtered_probs(row, 5.0, 0, 1.0, 0.0)) > P_VALUE_FLOOR


# ---------------------------------------------------------------- the random stream

def philox4x32(counter: tuple[int, ...], key: tuple[int, ...]) -> tuple[int, ...]:
    """Philox4x32-10 in plain Python integers (Salmon et al. 2011)."""
    mask = 0xFFFFFFFF
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & mask, (p0 >> 32) ^ c3 ^ k1, p0 & mask)
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return c0, c1, c2, c3


def test_the_python_philox_matches_random123s_known_answers():
    assert philox4x32((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2) == (
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert philox4x32((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
                      (0xA4093822, 0x299F31D0)) == (0xD16CFE09, 0x94FDCCEB, 0x5001E420,
                                                    0x24126EA1)


@pytest.mark.parametrize("vocab", [7, 1500, 20000, 70001])
def test_equal_logits_give_the_token_the_documented_stream_names(vocab):
    """Equal logits weigh 2^40 each: the token is at position floor(vocab * r / 2^64) of the
    column order, r = Philox(key (seed, 0), counter (offset, 0, 0, 0))."""
    seeds = np.array([0, 1, 12345, 2**32 - 1, 7, 7], np.uint32)
    offsets = np.array([0, 0, 3, 9, 2**31 - 1, 100], np.int32)
    args = per_row(6)
    args[4], args[5] = seeds, offsets
    tokens = np.asarray(sample(np.zeros((6, vocab), np.float32), *args))
    index = np.arange(vocab)
    order = np.lexsort((index, index // VEC % COLUMNS))  # by column, then by index
    for s, o, token in zip(seeds.tolist(), offsets.tolist(), tokens.tolist(), strict=True):
        w = philox4x32((o, 0, 0, 0), (s, 0))
        r = (w[0] << 32) | w[1]
        assert token == order[(vocab * r) >> 64], (s, o)


def test_signed_seeds_and_unsigned_offsets_are_the_same_bits(rng):
    logits = rng.standard_normal((8, 100)).astype(np.float32)
    args = per_row(8, top_p=0.9)
    args[4] = np.array([0, 1, 2**31, 2**32 - 1, 5, 6, 7, 8], np.uint32)
    args[5] = np.arange(8, dtype=np.int32) - 4
    want = np.asarray(sample(logits, *args))
    args[4], args[5] = args[4].view(np.int32), args[5].view(np.uint32)
    np.testing.assert_array_equal(np.asarray(sample(logits, *args)), want)


def test_a_128k_vocabulary_keeps_top_k(rng):
    logits = rng.standard_normal((3, 128256)).astype(np.float32)
    tokens = np.asarray(sample(logits, *per_row(3, 1.0, top_k=50, top_p=0.95, seed_base=1)))
    top50 = np.argsort(-logits, axis=-1)[:, :50]
    assert all(t in top50[i] for i, t in enumerate(tokens))


# ---------------------------------------------------------------- frontends and sharding

def test_the_torch_operator_draws_the_same_tokens(rng):
    logits = rng.standard_normal((16, 200)).astype(np.float32)
    args = per_row(16, 0.8, top_k=20, top_p=0.9, min_p=0.02, seed_base=3)
    want = np.asarray(sample(logits, *args))
    op = torch_op(sample)
    got = op(torch.from_numpy(logits), *(torch.from_numpy(a.view(np.int32) if a.dtype ==
                                                          np.uint32 else a) for a in args))
    assert got.dtype == torch.int32
    np.testing.assert_array_equal(got.numpy(), want)


def opcheck_and_compile_checks() -> None:
    op = torch_op(sample)
    rng = np.random.default_rng(0)
    args = (torch.from_numpy(rng.standard_normal((4, 50)).astype(np.float32)),
            *(torch.from_numpy(a.view(np.int32) if a.dtype == np.uint32 else a)
              for a in per_row(4, 0.9, top_k=10, top_p=0.8, seed_base=1)))
    torch.library.opcheck(op, args)
    compiled = torch.compile(lambda *a: op(*a) + 1, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*args), op(*args) + 1)


@pytest.mark.slow
def test_the_torch_operator_passes_opcheck_and_compiles():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("opcheck_and_compile_checks", module="test_sampling")


def test_under_jit(rng):
    logits = rng.standard_normal((4, 64)).astype(np.float32)
    args = per_row(4, 1.0, top_p=0.8, seed_base=2)
    want = np.asarray(sample(logits, *args))
    np.testing.assert_array_equal(np.asarray(jax.jit(sample)(logits, *args)), want)


SHARDED = """
    from xla_kernels.kernels.sampling import sample
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((8, 96)).astype(np.float32)
    args = [np.full(8, 0.9, np.float32), np.full(8, 10, np.int32), np.full(8, 0.9, np.float32),
            np.zeros(8, np.float32), np.arange(8, dtype=np.uint32), np.zeros(8, np.int32)]
    want = np.asarray(sample(logits, *args))
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    sharded = [put(logits, mesh, P("dp"))] + [put(a, mesh, P("dp")) for a in args]
    text = compiled(sample, *sharded)
    assert not collectives(text), collectives(text)
    assert "f32[2,96]" in calls(text, "xla_kernels.sample")[0]
    assert np.array_equal(np.asarray(jax.jit(sample)(*sharded)), want)
    by_vocab = [put(logits, mesh, P(None, "dp"))] + [put(a, mesh, P()) for a in args]
    assert np.array_equal(np.asarray(jax.jit(sample)(*by_vocab)), want)
"""


def test_rows_split_over_devices_and_a_split_vocabulary_is_gathered():
    from test_spmd import PRELUDE

    script = PRELUDE + textwrap.dedent(SHARDED) + "\nprint('ok')\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ---------------------------------------------------------------- bad inputs

def good_args(rows: int = 2, vocab: int = 5) -> list:
    return [np.zeros((rows, vocab), np.float32), *per_row(rows)]


@pytest.mark.parametrize("index, bad, message", [
    (0, np.zeros(5, np.float32), r"argument 'logits': expected rank 2, got shape \(5,\)"),
    (0, np.zeros((2, 5), np.int32), r"argument 'logits': dtype i32 is not supported. Fix: "
                                    r"pass one of f32, bf16, f16"),
    (0, np.zeros((2, 0), np.float32), r"argument 'logits': shape \(2, 0\) has an empty "
                                      r"vocabulary. Fix: pass at least one logit per row"),
    (1, np.ones(3, np.float32), r"argument 'temperature': expected shape \(2,\) \(one value "
                                r"per row of logits\), got \(3,\). Fix: pass a \[rows\] array"),
    (1, np.ones(2, np.float64), r"argument 'temperature': dtype f64 is not supported"),
    (2, np.zeros(2, np.float32), r"argument 'top_k': dtype f32 is not supported. Fix: pass "
                                 r"one of i32"),
    (2, np.zeros(1, np.int32), r"argument 'top_k': expected shape \(2,\)"),
    (3, np.ones((2, 1), np.float32), r"argument 'top_p': expected rank 1"),
    (3, np.ones(4, np.float32), r"argument 'top_p': expected shape \(2,\)"),
    (4, np.zeros(2, np.int32), r"argument 'min_p': dtype i32 is not supported"),
    (4, np.zeros(5, np.float32), r"argument 'min_p': expected shape \(2,\)"),
    (5, np.zeros(2, np.float32), r"argument 'seeds': dtype f32 is not supported. Fix: pass "
                                 r"one of u32, i32"),
    (5, np.zeros(3, np.uint32), r"argument 'seeds': expected shape \(2,\)"),
    (6, np.zeros(2, np.int64), r"argument 'offsets': dtype i64 is not supported"),
    (6, np.zeros(1, np.int32), r"argument 'offsets': expected shape \(2,\)"),
])
def test_bad_inputs_name_the_argument_and_the_fix(index, bad, message):
    args = good_args()
    args[index] = bad
    with pytest.raises(xk.OpInputError, match=r"xla_kernels.sample: " + message):
        sample(*(jnp.asarray(a) if a.dtype != np.float64 and a.dtype != np.int64 else a
                 for a in args))
