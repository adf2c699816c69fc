"""fused_moe's CUDA kernels against the float64 oracle and the CPU kernel: every tile
configuration the host picks for bf16/f16 (16-row tiles with 32, 64 or 128 columns and 64-row
tiles, whose 8 warps split K; 128-row tiles) and the f32 CUDA-core path, odd sizes (element-wise
loads), one expert, no tokens, experts never routed (their weights NaN), fp8 per-channel and
block scales, torch eager on CUDA with NaN left in the allocator, the expert-parallel ops
(fused_moe_ep / fused_moe_fp8_ep: a block of the experts, the offset on the device), and the
compute-sanitizer cases."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from moe_oracle import TOL, dequantize_f64, moe_f64, rel
from xla_kernels.kernels.moe import (
    fp8_quantize,
    fused_moe,
    fused_moe_ep,
    fused_moe_fp8,
    fused_moe_fp8_ep,
)
from xla_kernels.kernels.moe.testing import ARGS, make_inputs, sanitize_cases

pytestmark = pytest.mark.gpu

# (tokens, hidden, experts, intermediate, top_k) and the tiles the host picks on an H100 or
# H200 (132 SMs).
SHAPES = {
    "decode bm16 bn32": (1, 512, 8, 256, 2),
    "decode bm16 bn64": (33, 128, 128, 128, 2),
    "decode qwen-like bm16 bn128": (16, 256, 128, 256, 8),
    "bm64": (128, 256, 8, 128, 2),
    "prefill bm128": (300, 256, 16, 192, 4),
    "odd hidden and intermediate": (9, 13, 4, 20, 2),
    "fp8 element loads": (7, 24, 4, 40, 2),
    "one expert": (5, 64, 1, 32, 1),
    "per-pair outputs at an odd offset": (3, 64, 4, 5, 1),
    "fewer tokens than top_k": (2, 128, 32, 64, 8),
}


def gpu(x):
    return [jax.device_put(a, jax.devices("gpu")[0]) for a in x]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_cuda_matches_float64(rng, dtype, name):
    tokens, hidden, experts, inter, top_k = SHAPES[name]
    poison = (experts - 1,) if experts > top_k else ()
    x = make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                    dtype=dtype, poison_experts=poison)
    out = jax.jit(lambda *a: fused_moe(*a, top_k=top_k))(*gpu([x[k] for k in ARGS]))
    assert out.devices().pop().platform == "gpu"
    assert out.shape == (tokens, hidden) and out.dtype == x["hidden"].dtype
    got = np.asarray(out, np.float32)
    assert np.isfinite(got).all()
    assert rel(got, moe_f64(*(x[k] for k in ARGS), top_k=top_k)) < TOL[dtype]


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_cuda_activation_renormalize_and_bf16_logits(rng, activation, renormalize):
    x = make_inputs(rng, tokens=33, hidden=128, experts=16, intermediate=64, dtype="bf16",
                    logits_dtype="bf16")
    attrs = dict(top_k=4, renormalize=renormalize, activation=activation)
    got = fused_moe(*gpu([x[k] for k in ARGS]), **attrs)
    assert rel(got, moe_f64(*(x[k] for k in ARGS), **attrs)) < TOL["bf16"]


def test_cuda_agrees_with_the_cpu_kernel_at_a_qwen3_layer(rng):
    """Qwen3-30B-A3B's expert sizes (128 experts, top 8, hidden 2048, intermediate 768)."""
    x = make_inputs(rng, tokens=64, hidden=2048, experts=128, intermediate=768, dtype="bf16")
    got = fused_moe(*gpu([x[k] for k in ARGS]), top_k=8)
    cpu = jax.devices("cpu")[0]
    want = fused_moe(*(jax.device_put(x[k], cpu) for k in ARGS), top_k=8)
    assert rel(got, want) < 1e-2


def test_no_tokens(rng):
    x = make_inputs(rng, tokens=0, hidden=64, experts=4, intermediate=32, dtype="bf16")
    assert fused_moe(*gpu([x[k] for k in ARGS]), top_k=2).shape == (0, 64)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("block_shape", [(0, 0), (128, 128)])
@pytest.mark.parametrize("name", ["decode bm16 bn32", "decode bm16 bn64",
                                  "decode qwen-like bm16 bn128", "bm64", "prefill bm128",
                                  "fp8 element loads"])
def test_cuda_fp8_matches_float64_on_the_dequantized_weights(rng, dtype, block_shape, name):
    tokens, hidden, experts, inter, top_k = SHAPES[name]
    x = make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                    dtype=dtype)
    q13, s13 = fp8_quantize(x["w13"].astype(np.float32), block_shape)
    q2, s2 = fp8_quantize(x["w2"].astype(np.float32), block_shape)
    want = moe_f64(x["hidden"], x["router_logits"], dequantize_f64(q13, s13, block_shape),
                   dequantize_f64(q2, s2, block_shape), top_k=top_k)
    got = fused_moe_fp8(*gpu([x["hidden"], x["router_logits"], q13, q2, s13, s2]),
                        top_k=top_k, block_shape=block_shape)
    assert rel(got, want) < TOL[dtype]


# (shape name, expert offset, local experts): blocks at the start, middle and end; an offset
# past the experts and a negative one (the local experts outside 0 .. experts-1 get nothing).
EP_CASES = [("decode qwen-like bm16 bn128", 0, 32), ("decode qwen-like bm16 bn128", 64, 32),
            ("prefill bm128", 12, 4), ("bm64", 3, 2), ("odd hidden and intermediate", 2, 2),
            ("prefill bm128", 14, 4), ("bm64", -1, 2), ("bm64", 100, 4)]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("case", EP_CASES, ids=[str(c) for c in EP_CASES])
def test_cuda_expert_block_matches_float64(rng, dtype, case):
    name, offset, local = case
    tokens, hidden, experts, inter, top_k = SHAPES[name]
    x = make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                    dtype=dtype)
    lo, hi = max(offset, 0), max(min(offset + local, experts), 0)
    w13 = np.zeros((local, 2 * inter, hidden), x["w13"].dtype)
    w2 = np.zeros((local, hidden, inter), x["w2"].dtype)
    if hi > lo:  # the global experts this block holds
        w13[lo - offset:hi - offset] = x["w13"][lo:hi]
        w2[lo - offset:hi - offset] = x["w2"][lo:hi]
    args = [x["hidden"], x["router_logits"], w13, w2]
    f = jax.jit(lambda *a: fused_moe_ep(*a, top_k=top_k))  # the offset traced, on the device
    got = np.asarray(f(*gpu([*args, np.int32(offset)])), np.float32)
    want = moe_f64(*args, top_k=top_k, expert_offset=offset)
    if not np.any(want):
        assert not np.any(got)
    else:
        assert rel(got, want) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_cuda_expert_blocks_add_up_to_the_layer(rng, dtype):
    tokens, hidden, experts, inter, top_k = SHAPES["decode qwen-like bm16 bn128"]
    x = make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                    dtype=dtype)
    whole = np.asarray(fused_moe(*gpu([x[k] for k in ARGS]), top_k=top_k), np.float32)
    local = experts // 4
    parts = [np.asarray(fused_moe_ep(*gpu([x["hidden"], x["router_logits"],
                                           x["w13"][o:o + local], x["w2"][o:o + local],
                                           np.int32(o)]), top_k=top_k), np.float32)
             for o in range(0, experts, local)]
    assert rel(sum(parts), whole) < 2 * TOL[dtype]
    assert rel(whole, moe_f64(*(x[k] for k in ARGS), top_k=top_k)) < TOL[dtype]


@pytest.mark.parametrize("block_shape", [(0, 0), (128, 128)])
def test_cuda_fp8_expert_block_matches_float64(rng, block_shape):
    tokens, hidden, experts, inter, top_k = SHAPES["prefill bm128"]
    x = make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                    dtype="bf16")
    q13, s13 = fp8_quantize(x["w13"].astype(np.float32), block_shape)
    q2, s2 = fp8_quantize(x["w2"].astype(np.float32), block_shape)
    o, n = 8, 8
    want = moe_f64(x["hidden"], x["router_logits"],
                   dequantize_f64(q13[o:o + n], s13[o:o + n], block_shape),
                   dequantize_f64(q2[o:o + n], s2[o:o + n], block_shape), top_k=top_k,
                   expert_offset=o)
    got = fused_moe_fp8_ep(*gpu([x["hidden"], x["router_logits"], q13[o:o + n], q2[o:o + n],
                                 s13[o:o + n], s2[o:o + n], np.int32(o)]),
                           top_k=top_k, block_shape=block_shape)
    assert rel(got, want) < TOL["bf16"]


def test_torch_eager_cuda_with_poisoned_memory(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from xla_kernels.frontends.torch import torch_op

    x = make_inputs(rng, tokens=40, hidden=256, experts=8, intermediate=128, dtype="bf16",
                    poison_experts=(3,))
    tensors = [torch.from_numpy(x[k].astype(np.float32)).to(torch.bfloat16).cuda()
               if k != "router_logits" else torch.from_numpy(x[k]).cuda() for k in ARGS]
    # NaN left in the caching allocator's free memory, where the output and the workspaces
    # are likely placed: every output element must still be written.
    junk = torch.full((1 << 22,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del junk
    got = torch_op(fused_moe)(*tensors, top_k=2)
    torch.cuda.synchronize()
    out = got.float().cpu().numpy()
    assert np.isfinite(out).all()
    assert rel(out, moe_f64(*(x[k] for k in ARGS), top_k=2)) < TOL["bf16"]


def test_sanitize_cases_pass():
    sanitize_cases("gpu")
