"""How many passes over a row the CUDA kernel's threshold searches take: a NumPy model of
``Search`` in ``src/xla_kernels/kernels/sampling/sampling.cu`` (same pivots, bracket and
early stops), run on rows of ``N(0, scale^2)`` logits. Every threshold it finds is checked
against the definition (the k-th largest key; the largest key whose kept mass reaches the
top-p goal). docs/design/sampling.md's pass counts come from it.

Example:
    $ python benchmarks/sampling_passes.py --vocab 128256 --rows 3
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import ml_dtypes
import numpy as np

PIVOTS, VALUE_PIVOTS = 15, 8


def keys_of(x: np.ndarray) -> np.ndarray:
    """OrderedKey of float32 values, as int64."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
    return np.where(u & 0x80000000, ~u & 0xFFFFFFFF, u | 0x80000000)


def key_float(k: int) -> np.float32:
    u = (k & 0x7FFFFFFF) if k & 0x80000000 else ~k & 0xFFFFFFFF
    return np.array([u], np.uint32).view(np.float32)[0]


def pivots(lo: int, hi: int) -> list[int]:
    xlo, xhi = key_float(lo), key_float(hi)
    out = []
    with np.errstate(all="ignore"):
        for j in range(PIVOTS):
            if j < VALUE_PIVOTS:
                v = np.float32(xlo + (xhi - xlo) * np.float32((j + 1) / (VALUE_PIVOTS + 1)))
                key = int(keys_of(np.array([v]))[0])
            else:
                key = lo + 1 + (hi - lo) * (j - VALUE_PIVOTS + 1) // (PIVOTS - VALUE_PIVOTS + 1)
            out.append(min(max(key, lo + 1), hi))
    return out


def search(keys: np.ndarray, values: np.ndarray, lo: int, hi: int,
           meets: Callable[[int], bool], count_goal: int | None) -> tuple[int, int]:
    """(threshold key, passes) of the bracket search over members ``keys`` / ``values``."""
    above = 0
    for passes in range(1, 41):
        piv = pivots(lo, hi)
        inside = (keys >= lo) & (keys <= hi)
        k, v = keys[inside], values[inside]
        acc = [int(v[k >= p].sum()) for p in piv]
        low, high = int(k.min()), int(k.max())
        if low == high:
            return low, passes
        new_lo, new_hi, at_lo, new_above = lo, hi, above + int(v.sum()), above
        for p, a in zip(piv, acc, strict=True):
            if meets(above + a):
                if p > new_lo:
                    new_lo, at_lo = p, above + a
            elif p - 1 < new_hi:
                new_hi, new_above = p - 1, above + a
        if count_goal is not None and at_lo == count_goal:
            return new_lo, passes
        lo, hi, above = max(new_lo, low), min(new_hi, high), new_above
    raise AssertionError("no convergence in 40 passes")


def passes_for(x: np.ndarray, top_k: int, top_p: float) -> tuple[int, int]:
    """(top-k passes, top-p passes) on one row at temperature 1, checked against the
    definitions."""
    keys = keys_of(x)
    threshold, k_passes = int(keys.min()), 0
    if 0 < top_k < x.size:
        threshold, k_passes = search(keys, np.ones(x.size, np.int64), int(keys.min()),
                                     int(keys.max()), lambda f: f >= top_k, top_k)
        kth = np.sort(keys)[::-1][top_k - 1]
        assert (keys >= threshold).sum() == (keys >= kth).sum(), (threshold, kth)
    if top_p >= 1:
        return k_passes, 0
    t = (x - x.max()) * np.float32(1.4426950408889634)
    q = np.where(t > -40, np.floor(np.exp2(t.astype(np.float64)) * 2.0**40), 0).astype(np.int64)
    member = keys >= threshold
    kk, qq = keys[member], q[member]
    goal = float(np.float32(top_p)) * float(qq.sum())
    reaches = lambda f: f > 0 and float(f) >= goal  # noqa: E731
    found, p_passes = search(kk, qq, threshold, int(keys.max()), reaches, None)
    want = next(v for v in np.unique(kk)[::-1] if reaches(int(qq[kk >= v].sum())))
    assert found == want, (found, want)
    return k_passes, p_passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--scale", type=float, default=2.0)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    print("| setting | f32 passes (top-k, top-p) per row | bf16 |\n|---|---|---|")
    for top_k, top_p in ((50, 0.9), (0, 0.9), (1000, 0.95), (50, 1.0)):
        cells = []
        for dtype in (np.float32, ml_dtypes.bfloat16):
            rows = [(rng.standard_normal(args.vocab) * args.scale).astype(dtype)
                    .astype(np.float32) for _ in range(args.rows)]
            cells.append(" ".join(str(passes_for(x, top_k, top_p)) for x in rows))
        print(f"| top-k {top_k}, top-p {top_p} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
