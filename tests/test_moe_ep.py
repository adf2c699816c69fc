"""fused_moe_ep and fused_moe_fp8_ep (a block of the experts, routing over every expert's
logit) on the CPU: kernel, plain-XLA fallback and ragged_dot peer against the float64 oracle
on the block; the blocks add up to the unsharded op; every bad input's message (shape rule
and handler); interleave_w13. Several devices: tests/test_moe_parallel.py."""

from __future__ import annotations

import numpy as np
import pytest

import xla_kernels as xk
from moe_oracle import TOL, dequantize_f64, moe_f64, rel
from xla_kernels.kernels.moe import (
    fp8_quantize,
    fused_moe,
    fused_moe_ep,
    fused_moe_fp8_ep,
    fused_moe_ragged_dot,
    fused_moe_xla,
    scale_shape,
)
from xla_kernels.kernels.moe.parallel import deinterleave_w13, interleave_w13
from xla_kernels.kernels.moe.testing import make_inputs
from xla_kernels.kernels.moe.workspace import MAX_EXPERTS, workspace_sizes
from xla_kernels.runtime.eager import Buffer, KernelError, call_handler
from xla_kernels.runtime.library import load_kernel

ARGS = ("hidden", "router_logits", "w13", "w2")


def make(rng, tokens, hidden, experts, inter, dtype):
    return make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                       dtype=dtype)


def block(x, offset, size):
    return (x["hidden"], x["router_logits"], x["w13"][offset:offset + size],
            x["w2"][offset:offset + size])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("offset,size", [(0, 4), (4, 4), (2, 3), (7, 1)])
def test_a_block_of_experts_matches_float64(rng, dtype, offset, size):
    x = make(rng, 9, 24, 8, 12, dtype)
    # Token 0 routes into the block whatever the draw (logits are 2 * N(0, 1)).
    x["router_logits"][0, offset:offset + size] = 20
    args = block(x, offset, size)
    want = moe_f64(*args, top_k=3, expert_offset=offset)
    assert np.abs(want).max() > 0.1
    assert rel(fused_moe_ep(*args, np.int32(offset), top_k=3), want) < TOL[dtype]
    for peer in (fused_moe_xla, fused_moe_ragged_dot):
        assert rel(peer(*args, top_k=3, expert_offset=offset), want) < TOL[dtype]


@pytest.mark.parametrize("renormalize", [True, False])
def test_the_blocks_add_up_to_the_unsharded_op(rng, renormalize):
    x = make(rng, 11, 16, 8, 8, "f32")
    whole = fused_moe(*(x[k] for k in ARGS), top_k=2, renormalize=renormalize)
    parts = [fused_moe_ep(*block(x, o, 2), np.int32(o), top_k=2, renormalize=renormalize)
             for o in range(0, 8, 2)]
    assert rel(sum(np.asarray(p) for p in parts), whole) < TOL["f32"]
    want = moe_f64(*(x[k] for k in ARGS), top_k=2, renormalize=renormalize)
    assert rel(whole, want) < TOL["f32"]


def test_top_k_may_exceed_the_local_experts(rng):
    x = make(rng, 5, 16, 8, 8, "f32")
    args = block(x, 6, 2)
    want = moe_f64(*args, top_k=4, expert_offset=6)
    assert rel(fused_moe_ep(*args, np.int32(6), top_k=4), want) < TOL["f32"]


@pytest.mark.parametrize("offset", [-2, 7, 100, -(2**31)])
def test_an_offset_outside_the_experts_adds_only_what_overlaps(rng, offset):
    """Local expert i is global expert offset + i; those outside 0..7 get no tokens."""
    x = make(rng, 6, 16, 8, 8, "f32")
    args = block(x, 0, 4)
    got = np.asarray(fused_moe_ep(*args, np.int32(offset), top_k=2))
    want = moe_f64(*args, top_k=2, expert_offset=offset)
    if not np.any(want):
        assert not np.any(got)
    else:
        assert rel(got, want) < TOL["f32"]
    xla = fused_moe_xla(*args, top_k=2, expert_offset=offset)
    assert np.allclose(np.asarray(xla), want, atol=1e-5)


@pytest.mark.parametrize("block_shape", [(0, 0), (8, 8)])
def test_fp8_block_of_experts_matches_float64(rng, block_shape):
    x = make(rng, 7, 32, 8, 16, "bf16")
    q13, s13 = fp8_quantize(x["w13"].astype(np.float32), block_shape)
    q2, s2 = fp8_quantize(x["w2"].astype(np.float32), block_shape)
    o, n = 4, 4
    args = (x["hidden"], x["router_logits"], q13[o:o + n], q2[o:o + n], s13[o:o + n],
            s2[o:o + n])
    w13 = dequantize_f64(q13[o:o + n], s13[o:o + n], block_shape)
    w2 = dequantize_f64(q2[o:o + n], s2[o:o + n], block_shape)
    want = moe_f64(x["hidden"], x["router_logits"], w13, w2, top_k=2, expert_offset=o)
    got = fused_moe_fp8_ep(*args, np.int32(o), top_k=2, block_shape=block_shape)
    assert rel(got, want) < TOL["bf16"]
    xla = fused_moe_xla(*args[:4], top_k=2, w13_scale=args[4], w2_scale=args[5],
                        block_shape=block_shape, expert_offset=o)
    assert rel(xla, want) < TOL["bf16"]


# bad inputs ------------------------------------------------------------------------------

def _specs(t=4, h=16, e=4, g=8, n=8, offset=(), offset_dtype="i32"):
    return [xk.Spec((t, h), "bf16"), xk.Spec((t, g), "f32"), xk.Spec((e, 2 * n, h), "bf16"),
            xk.Spec((e, h, n), "bf16"), xk.Spec(offset, offset_dtype)]


BAD_CALLS = [
    ("fewer logits than experts", _specs(e=4, g=3), {}, "router_logits",
     "4 (w13's local experts) <= global experts"),
    ("too many logits", _specs(g=MAX_EXPERTS + 1), {}, "router_logits",
     f"<= {MAX_EXPERTS}"),
    ("logits tokens", [xk.Spec((4, 16), "bf16"), xk.Spec((3, 8), "f32"), *_specs()[2:]], {},
     "router_logits", "expected shape (4, global experts)"),
    ("offset not scalar", _specs(offset=(1,)), {}, "expert_offset", "expected rank 0"),
    ("top_k > global experts", _specs(g=4), {"top_k": 5}, "top_k", "must be in 1 .. 4"),
]


@pytest.mark.parametrize("name,specs,attrs,arg,words", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_errors_name_argument_and_fix(name, specs, attrs, arg, words):
    with pytest.raises(xk.OpInputError) as e:
        fused_moe_ep.bind(specs, {"top_k": 2, **attrs})
    msg = str(e.value)
    assert msg.startswith("xla_kernels.fused_moe_ep: ") and f"argument '{arg}'" in msg, msg
    assert words in msg and "Fix:" in msg, msg


def test_offset_dtype_and_fp8_errors():
    with pytest.raises(xk.OpTypeError, match="argument 'expert_offset': dtype i64"):
        fused_moe_ep.bind(_specs(offset_dtype="i64"), {"top_k": 2})
    fp8 = [xk.Spec((4, 16), "bf16"), xk.Spec((4, 8), "f32"),
           xk.Spec((4, 16, 16), "f8e4m3fn"), xk.Spec((4, 16, 8), "f8e4m3fn"),
           xk.Spec(scale_shape(4, 16, 16, (0, 0)), "f32"),
           xk.Spec(scale_shape(4, 16, 8, (0, 0)), "f32")]
    fused_moe_fp8_ep.bind([*fp8, xk.Spec((), "i32")], {"top_k": 2})
    with pytest.raises(xk.OpInputError, match=r"fused_moe_fp8_ep: .*'expert_offset'.*Fix:"):
        fused_moe_fp8_ep.bind([*fp8, xk.Spec((2,), "i32")], {"top_k": 2})
    with pytest.raises(xk.OpInputError, match=r"fused_moe_fp8_ep: .*'router_logits'.*Fix:"):
        fused_moe_fp8_ep.bind([fp8[0], xk.Spec((4, 2), "f32"), *fp8[2:],
                               xk.Spec((), "i32")], {"top_k": 2})
    with pytest.raises(xk.OpInputError, match=r"fused_moe_fp8_ep: .*'w13_scale'.*Fix:"):
        fused_moe_fp8_ep.bind([*fp8[:4], xk.Spec((4, 16, 2), "f32"), fp8[5],
                               xk.Spec((), "i32")], {"top_k": 2})


def _handler_call(op, arrays, attrs):
    fn = load_kernel(op, "cpu").function
    hidden = arrays[0]
    t, h = hidden.shape
    sizes = workspace_sizes(t, arrays[2].shape[0], int(attrs["top_k"]),
                            arrays[2].shape[1] // 2, h)
    rets = [np.zeros_like(hidden), np.zeros(sizes[0], np.int32),
            np.zeros(sizes[1], np.float32), np.zeros(sizes[2], hidden.dtype)]
    call_handler(fn, args=[Buffer.from_array(np.require(a, requirements="C")) for a in arrays],
                 rets=[Buffer.from_array(o) for o in rets], attrs=attrs, op_name=op.name)
    return rets[0]


def test_the_handler_validates_its_inputs_itself(rng):
    x = make(rng, 3, 16, 8, 8, "f32")
    args = list(block(x, 2, 4))
    attrs = {"top_k": np.int64(2), "renormalize": np.bool_(True), "activation": "silu"}
    out = _handler_call(fused_moe_ep, [*args, np.array(2, np.int32)], attrs)
    assert rel(out, moe_f64(*args, top_k=2, expert_offset=2)) < TOL["f32"]
    cases = [
        ([args[0], args[1][:, :3], *args[2:], np.array(2, np.int32)], "router_logits",
         "global experts"),
        ([*args, np.array([2], np.int32)], "expert_offset", "int32 scalar"),
        ([*args, np.array(2, np.int64)], "expert_offset", "int32 scalar"),
    ]
    for arrays, arg, words in cases:
        with pytest.raises(KernelError) as e:
            _handler_call(fused_moe_ep, arrays, attrs)
        msg = str(e.value)
        assert e.value.code_name == "INVALID_ARGUMENT", msg
        assert "xla_kernels.fused_moe_ep" in msg, msg
        assert f"argument '{arg}'" in msg and words in msg and "Fix:" in msg, msg


def test_the_fp8_handler_checks_its_offset_and_scales(rng):
    x = make(rng, 3, 16, 4, 8, "f32")
    q13, s13 = fp8_quantize(x["w13"], (0, 0))
    q2, s2 = fp8_quantize(x["w2"], (0, 0))
    attrs = {"top_k": np.int64(2), "renormalize": np.bool_(True), "activation": "silu",
             "block_shape": np.array([0, 0], np.int64)}
    arrays = [x["hidden"], x["router_logits"], q13, q2, s13, s2]
    _handler_call(fused_moe_fp8_ep, [*arrays, np.array(0, np.int32)], attrs)
    with pytest.raises(KernelError, match=r"fused_moe_fp8_ep.*'expert_offset'.*Fix:"):
        _handler_call(fused_moe_fp8_ep, [*arrays, np.zeros(2, np.int32)], attrs)
    with pytest.raises(KernelError, match=r"fused_moe_fp8_ep.*'w2_scale'.*Fix:"):
        _handler_call(fused_moe_fp8_ep, [*arrays[:5], s2[:, :8], np.array(0, np.int32)],
                      attrs)


# tensor-parallel layout -------------------------------------------------------------------

@pytest.mark.parametrize("tp", [1, 2, 4])
def test_interleave_w13_gives_each_slice_its_gate_and_up_rows(rng, tp):
    inter = 8
    w13 = rng.standard_normal((3, 2 * inter, 5)).astype(np.float32)
    laid = np.asarray(interleave_w13(w13, tp))
    per = inter // tp
    for i, part in enumerate(np.split(laid, tp, axis=1)):
        gate = w13[:, i * per:(i + 1) * per]
        up = w13[:, inter + i * per:inter + (i + 1) * per]
        assert np.array_equal(part, np.concatenate([gate, up], axis=1))
    assert np.array_equal(np.asarray(deinterleave_w13(laid, tp)), w13)


def test_tensor_parallel_slices_add_up_only_with_the_interleaved_layout(rng):
    """Each TP shard is an ordinary fused_moe call on its slice; the partial outputs add
    up to the layer with interleave_w13's layout and not with a plain split of w13."""
    x = make(rng, 6, 16, 4, 8, "f32")
    want = moe_f64(*(x[k] for k in ARGS), top_k=2)
    tp = 2

    def summed(w13):
        return sum(np.asarray(fused_moe(x["hidden"], x["router_logits"], a, b, top_k=2))
                   for a, b in zip(np.split(w13, tp, axis=1), np.split(x["w2"], tp, axis=2),
                                   strict=True))

    assert rel(summed(np.asarray(interleave_w13(x["w13"], tp))), want) < TOL["f32"]
    assert rel(summed(x["w13"]), want) > 0.1


def test_interleave_w13_refuses_an_uneven_split(rng):
    with pytest.raises(xk.OpInputError, match=r"argument 'w13'.*Fix:"):
        interleave_w13(np.zeros((2, 12, 4)), 4)


def test_torch_eager_operator_and_opcheck(rng):
    import torch

    from xla_kernels.frontends.torch import torch_op

    x = make(rng, 5, 16, 8, 8, "f32")
    args = [torch.from_numpy(np.ascontiguousarray(a)) for a in block(x, 4, 4)]
    args.append(torch.tensor(4, dtype=torch.int32))
    out = torch_op(fused_moe_ep)(*args, top_k=2)
    assert rel(out.numpy(), moe_f64(*block(x, 4, 4), top_k=2, expert_offset=4)) < TOL["f32"]
    torch.library.opcheck(torch_op(fused_moe_ep), args, {"top_k": 2})
