"""benchmarks/ragged_paged_attention.py on the CPU with tiny batches: its doctests, the dense
peer's K/V are the values our op reads (so cuDNN's dense attention does the same work), a
peer that fails (no cuDNN here) is recorded and the run goes on, and the dense table marks
batches the dense peer does not apply to as n/a (the speeds mean nothing on the CPU)."""

from __future__ import annotations

import doctest
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import load_script
from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention

bench = load_script(Path(__file__).parents[1] / "benchmarks" / "ragged_paged_attention.py")


def config(q_lens: list[int], kv_lens: list[int]) -> dict:
    return dict(name=f"tiny {len(q_lens)}x{q_lens[0]} of {kv_lens[0]}", q_lens=q_lens,
                kv_lens=kv_lens, num_q_heads=4, num_kv_heads=2, head_dim=64, fp8=False)


def test_doctests_pass():
    assert doctest.testmod(bench).failed == 0


def test_the_dense_matrix_is_the_issues_five_fresh_prefills():
    cfgs = bench.dense_matrix(quick=False)
    assert [(c["name"], len(c["q_lens"]), c["q_lens"][0], c["num_q_heads"],
             c["num_kv_heads"], c["head_dim"]) for c in cfgs] == [
        ("prefill 4x4096", 4, 4096, 32, 8, 128), ("prefill 1x16384", 1, 16384, 32, 8, 128),
        ("prefill 4x4096 d64", 4, 4096, 32, 8, 64), ("prefill 8x2048 MHA", 8, 2048, 32, 32, 128),
        ("prefill 4x4096 d256 32/8", 4, 4096, 32, 8, 256)]
    assert all(bench.fresh_prefill(c) for c in cfgs)


def test_dense_key_value_are_what_our_op_reads():
    cfg = config([40, 40], [40, 40])  # 40 tokens: the last of 3 blocks is partly used
    x = bench.make_data(cfg, np.random.default_rng(0), chain=2)
    assert x["dense_key"].shape == (2, 40, 2, 64)
    assert bool(jnp.any(x["queries"][0] != x["queries"][1]))  # one query set per call
    scale = bench.attrs(cfg)["scale"]
    for i in range(2):
        assert bool(jnp.all(x["queries_bsnd"][i].reshape(80, 4, 64) == x["queries"][i][:80]))
        ours = ragged_paged_attention(x["queries"][i], *(x[k] for k in bench.OURS_ARGS[1:]),
                                      scale=scale)
        dense = jax.nn.dot_product_attention(x["queries_bsnd"][i], x["dense_key"],
                                             x["dense_value"], scale=scale, is_causal=True,
                                             implementation="xla")
        diff = jnp.abs(ours[:80].reshape(dense.shape).astype(jnp.float32)
                       - dense.astype(jnp.float32))
        assert float(diff.max()) < 0.05


def test_a_failing_peer_is_recorded_and_other_batches_are_n_a():
    impls = bench.MATRIX_IMPLS["dense"]
    fresh = bench.measure(config([32, 32], [32, 32]), 0.01, chain=2, impls=impls)
    chunked = bench.measure(config([8, 8], [32, 32]), 0.01, chain=2, impls=impls)
    assert fresh["ours_ms"] > 0 and chunked["ours_ms"] > 0
    if jax.default_backend() == "cpu":
        assert fresh["cudnn_dense_error"] and not fresh["cudnn_dense_error"].startswith("n/a")
    assert chunked["cudnn_dense_error"].startswith("n/a")
    table = bench.markdown({"device": {"device": "cpu", "jax": jax.__version__}, "date": "now",
                            "matrix": "dense", "chain": 2, "rows": [fresh, chunked]})
    lines = table.splitlines()
    assert "| ours / cudnn_dense |" in lines[4]
    assert lines[7].startswith("| tiny 2x8 of 32 |") and "| n/a |" in lines[7]
