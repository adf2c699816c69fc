"""Property: whatever shardings its operands arrive with, and whatever shardings its results
are asked for, an op with a sharding rule gives the unsharded answer under plain ``jax.jit``
(exactly for elementwise ops). Meshes of 1 to 8 devices, a random PartitionSpec per operand
(axes that do not divide a dimension included: those are applied inside the program, where
XLA pads). Needs 8 devices: tests/test_sharding_mixed.py runs this file in a fresh process
with 8 fake CPU devices."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import xla_kernels as xk
from xla_kernels.kernels.kv_cache import (
    reshape_and_cache,
    reshape_and_cache_fused,
    reshape_and_cache_fused_numpy,
    reshape_and_cache_numpy,
)
from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
from xla_kernels.kernels.paged_attention.testing import make_inputs as paged_inputs
from xla_kernels.kernels.paged_cache import join_fused
from xla_kernels.kernels.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_fused,
    ragged_paged_attention_fused_numpy_f64,
    ragged_paged_attention_numpy_f64,
)
from xla_kernels.kernels.ragged_paged_attention.testing import make_inputs as ragged_inputs
from xla_kernels.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_numpy_f64,
    rms_norm,
    rms_norm_numpy_f64,
)
from xla_kernels.kernels.simple_add import simple_add

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (fake CPU "
                                "devices: run through tests/test_sharding_mixed.py)")

MESHES = [(1,), (2,), (4,), (2, 2), (8,), (2, 4), (4, 2)]
EXAMPLES = 12

# A user op declared as the README's examples are: elementwise, any shape.
user_add = xk.Op(
    "xk_tests.sharding_user_add",
    inputs=[xk.Tensor("a", ("f32",)), xk.Tensor("b", ("f32",))],
    outputs=lambda a, b: xk.like(a),
    kernels={"cpu": simple_add.kernels["cpu"]},
    sharding_rule="..., ... -> ...",
)


def _rowdot(rule: str | tuple[str, dict]) -> xk.Op:
    """A user op with a contracted factor: ``out[...] = sum_j a[..., j] * w[j]``."""
    name = "xk_tests.sharding_rowdot_" + str(abs(hash(str(rule))) % 10**6)
    return xk.Op(name, inputs=[xk.Tensor("a", ("f32",)), xk.Tensor("w", ("f32",), rank=1)],
                 outputs=lambda a, w: xk.Spec(a.shape[:-1], "f32"),
                 kernels={"cpu": xk.Kernel(["fixtures/sharding/rowdot.cc"],
                                           handler="XkTestsRowDotCpu")},
                 sharding_rule=rule)


ROWDOT_RULES = {
    "contracted": "... j, j -> ...",
    "reduction": ("... j, j -> ...", {"reduction_factors": ("j",)}),
    "need_replication": ("i j, j -> i", {"need_replication_factors": ("j",)}),
}
ROWDOTS = {k: _rowdot(r) for k, r in ROWDOT_RULES.items()}


@st.composite
def partition_spec(draw: st.DrawFn, axes: tuple[str, ...], rank: int) -> P:
    """None, one axis or a tuple of axes per dimension, each mesh axis used at most once."""
    unused, entries = list(axes), []
    for _ in range(rank):
        count = draw(st.integers(0, len(unused)))
        chosen = draw(st.permutations(unused))[:count]
        unused = [a for a in unused if a not in chosen]
        entries.append(None if not chosen else chosen[0] if count == 1 else tuple(chosen))
    return P(*entries)


def _divides(shape: tuple[int, ...], spec: P, mesh: Mesh) -> bool:
    return all(size % math.prod(mesh.shape[a] for a in
                                ((e,) if isinstance(e, str) else e or ())) == 0
               for size, e in zip(shape, spec, strict=False))


def run_sharded(data: st.DataObject, fn, args: list[np.ndarray], out_ranks: list[int]):
    """``jax.jit(fn)`` with each operand split by a drawn spec over a drawn mesh, and each
    result constrained to a drawn spec (or left to the partitioner)."""
    shape = data.draw(st.sampled_from(MESHES), "mesh")
    names = ("a", "b")[:len(shape)]
    mesh = Mesh(np.array(jax.devices()[:math.prod(shape)]).reshape(shape), names)
    in_specs = [data.draw(partition_spec(names, x.ndim), f"in{i}") for i, x in enumerate(args)]
    out_specs = [data.draw(st.none() | partition_spec(names, r), f"out{i}")
                 for i, r in enumerate(out_ranks)]
    # A jax.Array cannot hold an uneven split, nor can a jit parameter or result have one:
    # such operands arrive replicated and are split inside the program (XLA pads), and such
    # results leave replicated.
    def fits(value: Any, spec: P | None) -> bool:
        return spec is not None and _divides(value.shape, spec, mesh)

    placed = [jax.device_put(x, NamedSharding(mesh, s if fits(x, s) else P()))
              for x, s in zip(args, in_specs, strict=True)]

    def program(*xs):
        xs = [jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s))
              for x, s in zip(xs, in_specs, strict=True)]
        outs = fn(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tuple(jax.lax.with_sharding_constraint(o, NamedSharding(mesh, s))
                     if fits(o, s) else o for o, s in zip(outs, out_specs, strict=True))

    shapes = jax.eval_shape(program, *args)
    leave = tuple(NamedSharding(mesh, s if fits(o, s) else P())
                  for o, s in zip(shapes, out_specs, strict=True))
    outs = jax.jit(program, out_shardings=leave)(*placed)
    return outs[0] if len(outs) == 1 else outs


@settings(max_examples=3 * EXAMPLES)
@given(st.data())
def test_simple_add(data):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((8, 6)).astype(np.float32) for _ in range(2))
    got = run_sharded(data, simple_add, [a, b], [2])
    assert np.array_equal(np.asarray(got), a + b)


@settings(max_examples=2 * EXAMPLES)
@given(st.data())
def test_user_elementwise_op(data):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((4, 2, 6)).astype(np.float32) for _ in range(2))
    got = run_sharded(data, user_add, [a, b], [3])
    assert np.array_equal(np.asarray(got), a + b)


@settings(max_examples=EXAMPLES)
@given(st.sampled_from(sorted(ROWDOTS)), st.data())
def test_user_op_with_a_contracted_factor(rule, data):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 16) if rule == "need_replication" else (4, 6, 16))
    w = rng.standard_normal(16)
    got = run_sharded(data, ROWDOTS[rule], [a.astype(np.float32), w.astype(np.float32)],
                      [a.ndim - 1])
    np.testing.assert_allclose(np.asarray(got), a @ w, rtol=1e-4, atol=1e-4)


@settings(max_examples=EXAMPLES)
@given(st.data())
def test_rms_norm(data):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 3, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32)
    got = run_sharded(data, rms_norm, [x, w], [3])
    np.testing.assert_allclose(np.asarray(got), rms_norm_numpy_f64(x, w), rtol=1e-5, atol=1e-5)


@settings(max_examples=EXAMPLES)
@given(st.data())
def test_fused_add_rms_norm(data):
    rng = np.random.default_rng(3)
    x, residual = (rng.standard_normal((8, 3, 32)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(32).astype(np.float32)
    out, residual_out = run_sharded(data, fused_add_rms_norm, [x, residual, w], [3, 3])
    want_out, want_residual = fused_add_rms_norm_numpy_f64(x, residual, w)
    np.testing.assert_allclose(np.asarray(out), want_out, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.asarray(residual_out), want_residual)


@settings(max_examples=EXAMPLES)
@given(st.sampled_from(["vllm", "pallas"]), st.data())
def test_paged_attention(layout, data):
    x = paged_inputs(np.random.default_rng(4), num_seqs=4, num_q_heads=8, num_kv_heads=4,
                     head_dim=64, block_size=16, dtype="f32", layout=layout, poison=False)
    got = run_sharded(data, lambda *a: paged_attention(*a, scale=0.125, layout=layout),
                      list(x.values()), [3])
    want = paged_attention_numpy_f64(*x.values(), scale=0.125, layout=layout)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=1e-5)


@settings(max_examples=EXAMPLES)
@given(st.data())
def test_ragged_paged_attention(data):
    x = ragged_inputs(np.random.default_rng(5), q_lens=[1, 5, 2], kv_lens=[9, 20, 3],
                      num_q_heads=8, num_kv_heads=4, head_dim=64, block_size=16,
                      dtype="f32", poison=False)
    got = run_sharded(data, lambda *a: ragged_paged_attention(*a, scale=0.125),
                      list(x.values()), [3])
    want = ragged_paged_attention_numpy_f64(*x.values(), scale=0.125)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=1e-5)


@settings(max_examples=EXAMPLES)
@given(st.sampled_from(["vllm", "pallas"]), st.data())
def test_reshape_and_cache(layout, data):
    rng = np.random.default_rng(6)
    key, value = (rng.standard_normal((6, 4, 64)).astype(np.float32) for _ in range(2))
    shape = (8, 16, 4, 64) if layout == "vllm" else (4, 8, 16, 64)
    k_cache, v_cache = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    slots = np.array([0, 17, -1, 95, 40, 127], np.int32)
    want = reshape_and_cache_numpy(key, value, k_cache, v_cache, slots, layout=layout)
    got = run_sharded(data, lambda *a: reshape_and_cache(*a, layout=layout),
                      [key, value, k_cache, v_cache, slots], [4, 4])
    assert np.array_equal(np.asarray(got[0]), want[0])
    assert np.array_equal(np.asarray(got[1]), want[1])


@settings(max_examples=EXAMPLES)
@given(st.data())
def test_ragged_paged_attention_fused(data):
    x = ragged_inputs(np.random.default_rng(7), q_lens=[1, 5, 2], kv_lens=[9, 20, 3],
                      num_q_heads=8, num_kv_heads=4, head_dim=64, block_size=16,
                      dtype="f32", poison=False)
    args = [x["queries"], join_fused(x["key_cache"], x["value_cache"]),
            *(x[k] for k in ("kv_lens", "block_tables", "cu_q_lens", "num_seqs"))]
    got = run_sharded(data, lambda *a: ragged_paged_attention_fused(*a, scale=0.125), args,
                      [3])
    want = ragged_paged_attention_fused_numpy_f64(*args, scale=0.125)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=1e-5)


@settings(max_examples=EXAMPLES)
@given(st.data())
def test_reshape_and_cache_fused(data):
    rng = np.random.default_rng(8)
    key, value = (rng.standard_normal((6, 4, 64)).astype(np.float32) for _ in range(2))
    kv = rng.standard_normal((8, 16, 8, 64)).astype(np.float32)
    slots = np.array([0, 17, -1, 95, 40, 127], np.int32)
    want = reshape_and_cache_fused_numpy(key, value, kv, slots)
    got = run_sharded(data, reshape_and_cache_fused, [key, value, kv, slots], [4])
    assert np.array_equal(np.asarray(got), want)
