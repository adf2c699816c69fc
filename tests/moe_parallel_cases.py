"""fused_moe_sharded on eight fake CPU devices, against the float64 oracle on the full
weights. Run by tests/test_moe_parallel.py in a fresh process (the device count is fixed
when JAX starts); by hand:
``XLA_FLAGS=--xla_force_host_platform_device_count=8 pytest tests/moe_parallel_cases.py``."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh

import xla_kernels as xk
from moe_oracle import TOL, dequantize_f64, moe_f64, rel
from xla_kernels.hlo import custom_calls, hlo_text
from xla_kernels.kernels.moe import fp8_quantize
from xla_kernels.kernels.moe.parallel import fused_moe_sharded, interleave_w13
from xla_kernels.kernels.moe.testing import make_inputs

ARGS = ("hidden", "router_logits", "w13", "w2")



@pytest.fixture(autouse=True)
def eight_devices() -> None:
    """Fails (not skips) a run that cannot split: the point of every case here."""
    assert len(jax.devices()) >= 8, ("run with XLA_FLAGS=--xla_force_host_platform_device_"
                                     "count=8 (tests/test_moe_parallel.py does)")


def mesh_of(**axes: int) -> Mesh:
    """A mesh of the first prod(sizes) devices with Auto axes, in the order given."""
    n = int(np.prod(list(axes.values())))
    return Mesh(np.array(jax.devices()[:n]).reshape(tuple(axes.values())), tuple(axes))


def make(rng, tokens, hidden, experts, inter, dtype="f32"):
    return make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                       dtype=dtype)


def run(x, mesh, **kw):
    f = jax.jit(lambda *a: fused_moe_sharded(*a, mesh=mesh, **kw))
    args = [x[k] for k in ARGS]
    return f(*args), hlo_text(f, *args)


LAYOUTS = [dict(ep=2), dict(ep=4), dict(tp=2), dict(ep=2, tp=2), dict(ep=4, tp=2),
           dict(dp=2), dict(dp=2, ep=2, tp=2), dict(dp=4, ep=2)]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[str(lay) for lay in LAYOUTS])
def test_sharded_layer_matches_float64_on_the_full_weights(rng, dtype, layout):
    x = make(rng, 8, 32, 8, 16, dtype)
    mesh = mesh_of(**layout)
    axes = {"ep": "expert_axis", "tp": "tensor_axis", "dp": "token_axis"}
    kw = {axes[a]: a for a in layout}
    out, hlo = run(x, mesh, top_k=2, **kw)
    assert out.shape == (8, 32) and out.dtype == x["hidden"].dtype
    # bf16: each device's partial sum is rounded before the psum adds them.
    tol = TOL[dtype] * (2 if dtype == "bf16" else 1)
    assert rel(out, moe_f64(*(x[k] for k in ARGS), top_k=2)) < tol
    # One custom-call in the per-device program, on that device's shard; an all-reduce
    # whenever experts or the intermediate dimension are split.
    target = "xla_kernels.fused_moe_ep" if "ep" in layout else "xla_kernels.fused_moe"
    calls = [c for c in custom_calls(hlo) if c.target.startswith("xla_kernels.")]
    assert [c.target for c in calls] == [target], calls
    experts, inter = 8 // layout.get("ep", 1), 16 // layout.get("tp", 1)
    w13 = f"[{experts},{2 * inter},32]"
    assert w13 in calls[0].line, calls[0].line
    tokens = 8 // layout.get("dp", 1)
    assert calls[0].result_shape.startswith(f"({'f32' if dtype == 'f32' else 'bf16'}"
                                            f"[{tokens},32]"), calls[0].line
    assert ("all-reduce" in hlo) == ("ep" in layout or "tp" in layout)


def test_explicit_mesh_axes_and_pre_interleaved_weights(rng):
    x = make(rng, 8, 16, 4, 8)
    want = moe_f64(*(x[k] for k in ARGS), top_k=2)
    mesh = jax.make_mesh((2, 2), ("ep", "tp"))  # Explicit axes: the wrapper reshards
    out, _ = run(x, mesh, top_k=2, expert_axis="ep", tensor_axis="tp")
    assert rel(out, want) < TOL["f32"]
    laid = dict(x, w13=np.asarray(interleave_w13(x["w13"], 2)))
    out, _ = run(laid, mesh_of(ep=2, tp=2), top_k=2, expert_axis="ep", tensor_axis="tp",
                 w13_interleaved=True)
    assert rel(out, want) < TOL["f32"]


def test_a_plain_split_of_w13_is_wrong(rng):
    """Declaring the [gate; up] weights interleaved splits them contiguously: the first
    device gets gate rows only. The result is far off, so the layout is what makes TP
    right."""
    x = make(rng, 8, 16, 4, 8)
    out, _ = run(x, mesh_of(tp=2), top_k=2, tensor_axis="tp", w13_interleaved=True)
    assert rel(out, moe_f64(*(x[k] for k in ARGS), top_k=2)) > 0.1


@settings(max_examples=25)
@given(experts=st.sampled_from([2, 4, 8]), top_k=st.integers(1, 4),
       tokens=st.integers(1, 9), ep=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2]),
       renormalize=st.booleans(), seed=st.integers(0, 2**16))
def test_any_split_is_the_unsharded_layer(experts, top_k, tokens, ep, tp, renormalize, seed):
    top_k = min(top_k, experts)
    ep = min(ep, experts)
    x = make(np.random.default_rng(seed), tokens, 8, experts, 2 * tp)
    mesh = mesh_of(ep=ep, tp=tp)
    out, _ = run(x, mesh, top_k=top_k, renormalize=renormalize, expert_axis="ep",
                 tensor_axis="tp")
    want = moe_f64(*(x[k] for k in ARGS), top_k=top_k, renormalize=renormalize)
    assert rel(out, want) < TOL["f32"]


@pytest.mark.parametrize("block_shape", [(0, 0), (8, 8)])
@pytest.mark.parametrize("layout", [dict(ep=2), dict(tp=2), dict(ep=2, tp=2)],
                         ids=["ep2", "tp2", "ep2xtp2"])
def test_fp8_scales_shard_with_their_weights(rng, block_shape, layout):
    x = make(rng, 8, 32, 4, 16, "bf16")
    q13, s13 = fp8_quantize(x["w13"].astype(np.float32), block_shape)
    q2, s2 = fp8_quantize(x["w2"].astype(np.float32), block_shape)
    want = moe_f64(x["hidden"], x["router_logits"], dequantize_f64(q13, s13, block_shape),
                   dequantize_f64(q2, s2, block_shape), top_k=2)
    mesh = mesh_of(**layout)
    kw = {"expert_axis": "ep" if "ep" in layout else None,
          "tensor_axis": "tp" if "tp" in layout else None}
    f = jax.jit(lambda *a: fused_moe_sharded(*a[:4], w13_scale=a[4], w2_scale=a[5], mesh=mesh,
                                             top_k=2, block_shape=block_shape, **kw))
    args = (x["hidden"], x["router_logits"], q13, q2, s13, s2)
    assert rel(f(*args), want) < 2 * TOL["bf16"]
    target = "xla_kernels.fused_moe_fp8_ep" if "ep" in layout else "xla_kernels.fused_moe_fp8"
    calls = [c.target for c in custom_calls(hlo_text(f, *args))
             if c.target.startswith("xla_kernels.")]
    assert calls == [target]


def _raises(arg, words, x, mesh, **kw):
    with pytest.raises(xk.OpInputError) as e:
        fused_moe_sharded(*(x[k] for k in ARGS), mesh=mesh, top_k=2, **kw)
    msg = str(e.value)
    assert msg.startswith("fused_moe_sharded: ") and f"argument '{arg}'" in msg, msg
    assert words in msg and "Fix:" in msg, msg


def test_bad_layouts_are_refused_by_name(rng):
    x = make(rng, 6, 16, 6, 6)
    _raises("expert_axis", "experts = 6 does not split evenly over the 4", x, mesh_of(ep=4),
            expert_axis="ep")
    _raises("tensor_axis", "intermediate = 6 does not split evenly over the 4", x,
            mesh_of(tp=4), tensor_axis="tp")
    _raises("token_axis", "tokens = 6 does not split evenly over the 4", x, mesh_of(dp=4),
            token_axis="dp")
    _raises("expert_axis", "mesh has no axis 'experts'", x, mesh_of(ep=2),
            expert_axis="experts")
    _raises("mesh", "one mesh axis named twice", x, mesh_of(ep=2), expert_axis="ep",
            tensor_axis="ep")
    _raises("w2_scale", "both w13_scale and w2_scale", x, mesh_of(ep=2), expert_axis="ep",
            w13_scale=np.ones((6, 12, 1), np.float32))
    _raises("w13_scale", "both w13_scale and w2_scale", x, mesh_of(ep=2), expert_axis="ep",
            w2_scale=np.ones((6, 16, 1), np.float32))


def test_block_scales_need_whole_blocks_per_slice(rng):
    x = make(rng, 4, 32, 2, 16, "bf16")
    q13, s13 = fp8_quantize(x["w13"].astype(np.float32), (16, 16))
    q2, s2 = fp8_quantize(x["w2"].astype(np.float32), (16, 16))
    with pytest.raises(xk.OpInputError) as e:
        fused_moe_sharded(x["hidden"], x["router_logits"], q13, q2, w13_scale=s13,
                          w2_scale=s2, block_shape=(16, 16), mesh=mesh_of(tp=2),
                          tensor_axis="tp", top_k=2)
    msg = str(e.value)
    assert "argument 'block_shape'" in msg and "(16 / 2 = 8)" in msg and "Fix:" in msg, msg


def test_plain_jit_splits_the_block_op_over_tokens(rng):
    """Without shard_map the expert-parallel op's own rule applies: tokens split, the rest
    (router_logits' width included) whole."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from xla_kernels.kernels.moe import fused_moe_ep

    x = make(rng, 8, 16, 8, 8)
    mesh = mesh_of(dp=4)
    rows = NamedSharding(mesh, P("dp"))
    args = (jax.device_put(x["hidden"], rows), jax.device_put(x["router_logits"], rows),
            x["w13"][2:6], x["w2"][2:6], np.int32(2))
    f = jax.jit(lambda *a: fused_moe_ep(*a, top_k=2))
    out = f(*args)
    want = moe_f64(x["hidden"], x["router_logits"], x["w13"][2:6], x["w2"][2:6], top_k=2,
                   expert_offset=2)
    assert rel(out, want) < TOL["f32"]
    (call,) = [c for c in custom_calls(hlo_text(f, *args)) if c.target.startswith("xla_")]
    assert call.result_shape.startswith("(f32[2,16]"), call.line
