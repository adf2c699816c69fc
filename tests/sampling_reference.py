"""The distribution ``sample`` draws from, in float64, written from the op's documented rules
(not from its kernels), and a chi-squared test of drawn tokens against it. Shared by
tests/test_sampling.py and tests/gpu/test_sampling_gpu.py."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

P_VALUE_FLOOR = 1e-4
"""A run fails when its chi-squared p-value is below this. The seeds are fixed, so a run
gives the same p-value every time; a correct kernel fails with probability 1e-4 per config
only when the seeds change."""


def filtered_probs(logits: Any, temperature: float, top_k: int, top_p: float,
                   min_p: float) -> np.ndarray:
    """float64 probabilities of each token of one row after temperature, min-p, top-k
    (thresholds on the logit: ties kept together), then top-p on what they kept."""
    x = np.asarray(logits, np.float64)
    vocab = x.size
    if not temperature > 0:
        out = np.zeros(vocab)
        out[int(np.argmax(x))] = 1.0
        return out
    p = np.exp((x - x.max()) / temperature)
    p /= p.sum()
    keep = np.ones(vocab, bool)
    if min_p > 0:
        keep &= p >= min(min_p, 1.0) * p.max()
    if 0 < top_k < vocab:
        keep &= x >= np.sort(x)[::-1][top_k - 1]
    if top_p < 1:
        kept = np.where(keep, p, 0.0)
        kept /= kept.sum()
        for v in np.unique(x[keep])[::-1]:
            if kept[x >= v].sum() >= max(top_p, 0.0):
                keep &= x >= v
                break
    out = np.where(keep, p, 0.0)
    return out / out.sum()


def chi_squared_p_value(tokens: Any, probs: np.ndarray) -> float:
    """The p-value of the counts of ``tokens`` under ``probs``. Tokens of probability 0
    must never appear (an AssertionError otherwise); bins expecting fewer than 5 draws are
    pooled into one."""
    tokens = np.asarray(tokens).ravel()
    counts = np.bincount(tokens, minlength=probs.size).astype(np.float64)
    assert counts.size == probs.size, f"a token beyond the vocabulary: {tokens.max()}"
    impossible = (probs == 0) & (counts > 0)
    assert not impossible.any(), (
        f"drew tokens of probability 0: {np.flatnonzero(impossible).tolist()}")
    expected = probs * tokens.size
    big = expected >= 5
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big & (probs > 0)).any():
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    o, e = np.array(obs), np.array(exp)
    return float(stats.chi2.sf(np.sum((o - e) ** 2 / e), df=o.size - 1))


CONFIGS = {
    # name: (temperature, top_k, top_p, min_p)
    "temperature_only": (1.0, 0, 1.0, 0.0),
    "hot": (2.5, 0, 1.0, 0.0),
    "top_k": (0.8, 5, 1.0, 0.0),
    "top_p": (1.0, 0, 0.7, 0.0),
    "min_p": (1.0, 0, 1.0, 0.08),
    "top_k_then_top_p": (0.7, 12, 0.85, 0.0),
    "all_filters": (1.3, 20, 0.9, 0.02),
    "min_p_tighter_than_top_k": (1.0, 30, 1.0, 0.3),
}


def row_logits(vocab: int, seed: int = 0) -> np.ndarray:
    """A fixed row of logits with a realistic spread (a few likely tokens, a long tail)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(vocab) * 1.7).astype(np.float32)

