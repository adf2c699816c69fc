"""fused_moe and fused_moe_fp8 on the CPU: kernel, plain-XLA fallback and ragged_dot peer
against the float64 oracle (tests/moe_oracle.py); vLLM's routing (ties, renormalize); odd
shapes; every bad input's message; torch eager and torchax."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import xla_kernels as xk
from moe_oracle import TOL, dequantize_f64, moe_f64, rel, routing_f64
from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.kernels.moe import (
    fp8_quantize,
    fused_moe,
    fused_moe_fp8,
    fused_moe_ragged_dot,
    fused_moe_xla,
    route_xla,
    scale_shape,
)
from xla_kernels.kernels.moe.testing import make_inputs
from xla_kernels.kernels.moe.workspace import MAX_EXPERTS, MAX_TOP_K, workspace_sizes
from xla_kernels.runtime.eager import Buffer, KernelError, call_handler
from xla_kernels.runtime.library import load_kernel

ARGS = ("hidden", "router_logits", "w13", "w2")


def make(rng, tokens, hidden, experts, inter, dtype, logits_dtype="f32"):
    return make_inputs(rng, tokens=tokens, hidden=hidden, experts=experts, intermediate=inter,
                       dtype=dtype, logits_dtype=logits_dtype)
# (tokens, hidden, experts, intermediate, top_k): one token; fewer tokens than top_k and
# most experts never routed; hidden not a multiple of 8; Mixtral- and Qwen-like ratios.
SHAPES = [(1, 64, 8, 32, 2), (2, 24, 16, 8, 4), (7, 13, 4, 5, 2), (33, 128, 8, 48, 2),
          (16, 64, 32, 16, 8)]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_cpu_kernel_matches_float64(rng, dtype, shape):
    tokens, hidden, experts, inter, top_k = shape
    x = make(rng, tokens, hidden, experts, inter, dtype)
    out = jax.jit(lambda *a: fused_moe(*a, top_k=top_k))(*(x[k] for k in ARGS))
    assert out.shape == (tokens, hidden) and out.dtype == x["hidden"].dtype
    assert rel(out, moe_f64(*(x[k] for k in ARGS), top_k=top_k)) < TOL[dtype]


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_renormalize_and_activation(rng, renormalize, activation):
    x = make(rng, 9, 40, 8, 24, "f32", logits_dtype="bf16")
    attrs = dict(top_k=3, renormalize=renormalize, activation=activation)
    want = moe_f64(*(x[k] for k in ARGS), **attrs)
    assert rel(fused_moe(*(x[k] for k in ARGS), **attrs), want) < TOL["f32"]
    assert rel(fused_moe_xla(*(x[k] for k in ARGS), **attrs), want) < TOL["f32"]
    assert rel(fused_moe_ragged_dot(*(x[k] for k in ARGS), **attrs), want) < TOL["f32"]


def test_renormalize_changes_the_weights(rng):
    x = make(rng, 4, 16, 8, 8, "f32")
    on = fused_moe(*(x[k] for k in ARGS), top_k=2)
    off = fused_moe(*(x[k] for k in ARGS), top_k=2, renormalize=False)
    assert rel(off, on) > 1e-2


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_xla_fallback_and_ragged_dot_match_float64(rng, dtype):
    x = make(rng, 21, 48, 8, 16, dtype)
    want = moe_f64(*(x[k] for k in ARGS), top_k=2)
    assert rel(fused_moe_xla(*(x[k] for k in ARGS), top_k=2), want) < TOL[dtype]
    assert rel(fused_moe_ragged_dot(*(x[k] for k in ARGS), top_k=2), want) < TOL[dtype]


def test_ties_go_to_the_lower_expert(rng):
    """Equal logits: experts 1 and 3 tie for the second place; expert 1 is taken. Each
    expert's output is distinct, so the output says which experts ran."""
    x = make(rng, 1, 8, 4, 4, "f32")
    x["router_logits"] = np.array([[0.25, 1.0, 2.0, 1.0]], np.float32)
    ids, _ = route_xla(x["router_logits"], 2)
    assert np.asarray(ids).tolist() == [[2, 1]]
    assert routing_f64(x["router_logits"], 2, True)[0].tolist() == [[2, 1]]
    out = fused_moe(*(x[k] for k in ARGS), top_k=2)
    want = moe_f64(*(x[k] for k in ARGS), top_k=2)
    assert rel(out, want) < TOL["f32"]
    swapped = dict(x, router_logits=x["router_logits"][:, [0, 3, 2, 1]],
                   w13=x["w13"][[0, 3, 2, 1]], w2=x["w2"][[0, 3, 2, 1]])
    # Now the tie sends the token to the old expert 3 (index 1): another output.
    assert rel(fused_moe(*(swapped[k] for k in ARGS), top_k=2), want) > 1e-3


def test_all_equal_logits_take_the_first_experts(rng):
    x = make(rng, 3, 8, 6, 4, "f32")
    x["router_logits"] = np.zeros((3, 6), np.float32)
    out = fused_moe(*(x[k] for k in ARGS), top_k=3)
    first = fused_moe(x["hidden"], x["router_logits"][:, :3], x["w13"][:3], x["w2"][:3], top_k=3)
    np.testing.assert_allclose(np.asarray(out), np.asarray(first), rtol=1e-6, atol=1e-6)


def test_no_tokens_gives_an_empty_output(rng):
    x = make(rng, 0, 16, 4, 8, "bf16")
    out = fused_moe(*(x[k] for k in ARGS), top_k=2)
    assert out.shape == (0, 16)


def test_top_k_equal_to_experts_without_renormalize_is_the_dense_mixture(rng):
    x = make(rng, 5, 16, 4, 8, "f32")
    out = fused_moe(*(x[k] for k in ARGS), top_k=4, renormalize=False)
    assert rel(out, moe_f64(*(x[k] for k in ARGS), top_k=4, renormalize=False)) < TOL["f32"]


# fp8 ------------------------------------------------------------------------------------

FP8_CASES = [((0, 0), (5, 64, 8, 32, 2)), ((128, 128), (3, 200, 4, 136, 2)),
             ((16, 32), (6, 40, 8, 24, 3)), ((128, 128), (1, 256, 16, 128, 4)),
             ((0, 0), (4, 13, 4, 5, 2))]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("block_shape,shape", FP8_CASES, ids=[str(c) for c in FP8_CASES])
def test_fp8_matches_float64_on_the_dequantized_weights(rng, dtype, block_shape, shape):
    tokens, hidden, experts, inter, top_k = shape
    x = make(rng, tokens, hidden, experts, inter, dtype)
    q13, s13 = fp8_quantize(x["w13"].astype(np.float32), block_shape)
    q2, s2 = fp8_quantize(x["w2"].astype(np.float32), block_shape)
    assert s13.shape == scale_shape(experts, 2 * inter, hidden, block_shape)
    want = moe_f64(x["hidden"], x["router_logits"], dequantize_f64(q13, s13, block_shape),
                   dequantize_f64(q2, s2, block_shape), top_k=top_k)
    attrs = dict(top_k=top_k, block_shape=block_shape)
    out = jax.jit(lambda *a: fused_moe_fp8(*a, **attrs))(x["hidden"], x["router_logits"],
                                                        q13, q2, s13, s2)
    assert out.dtype == x["hidden"].dtype
    assert rel(out, want) < TOL[dtype]
    scales = dict(w13_scale=s13, w2_scale=s2, block_shape=block_shape)
    assert rel(fused_moe_xla(x["hidden"], x["router_logits"], q13, q2, top_k=top_k, **scales),
               want) < TOL[dtype]
    if dtype != "f16":  # the ragged_dot peer dequantizes to the dtype: f16 may overflow
        assert rel(fused_moe_ragged_dot(x["hidden"], x["router_logits"], q13, q2, top_k=top_k,
                                        **scales), want) < TOL[dtype]


def test_fp8_quantization_is_close_to_the_weights(rng):
    w = rng.standard_normal((2, 256, 384)).astype(np.float32)
    for block_shape in ((0, 0), (128, 128)):
        q, s = fp8_quantize(w, block_shape)
        assert rel(dequantize_f64(q, s, block_shape), w) < 0.05


# bad inputs -----------------------------------------------------------------------------

def _specs(t=4, h=16, e=8, n=8, dtype="bf16", logits=None, w13=None, w2=None, wdtype=None):
    return [xk.Spec((t, h), dtype), xk.Spec(logits or (t, e), "f32"),
            xk.Spec(w13 or (e, 2 * n, h), wdtype or dtype), xk.Spec(w2 or (e, h, n),
                                                                    wdtype or dtype)]


BAD_CALLS = [
    ("logits shape", _specs(logits=(4, 7)), {}, "router_logits", "expected shape (4, 8)"),
    ("logits tokens", _specs(logits=(3, 8)), {}, "router_logits", "one logit per token"),
    ("odd w13", _specs(w13=(8, 15, 16)), {}, "w13", "2 * intermediate"),
    ("w13 hidden", _specs(w13=(8, 16, 12)), {}, "w13", "expected shape (8, 2 * intermediate"),
    ("w2 shape", _specs(w2=(8, 16, 4)), {}, "w2", "expected shape (8, 16, 8)"),
    ("w2 experts", _specs(w2=(7, 16, 8)), {}, "w2", "(experts, hidden, intermediate)"),
    ("too many experts", _specs(e=MAX_EXPERTS + 1), {}, "w13", f"expected 1 to {MAX_EXPERTS}"),
    ("no hidden", _specs(h=0), {}, "hidden", "must be >= 1"),
    ("top_k 0", _specs(), {"top_k": 0}, "top_k", "must be in 1 .. 8"),
    ("top_k > experts", _specs(e=4), {"top_k": 5}, "top_k", "must be in 1 .. 4"),
    ("top_k > max", _specs(e=64), {"top_k": MAX_TOP_K + 1}, "top_k", f"1 .. {MAX_TOP_K}"),
    ("activation", _specs(), {"activation": "relu"}, "activation", "unknown activation"),
    ("weight dtype", _specs(wdtype="f16"), {}, "w13", "differs from hidden's bf16"),
    ("w2 dtype", [*_specs(dtype="f32")[:3], xk.Spec((8, 16, 8), "f16")], {}, "w2",
     "differs from hidden's f32"),
]


@pytest.mark.parametrize("name,specs,attrs,arg,words", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_errors_name_argument_and_fix(name, specs, attrs, arg, words):
    with pytest.raises(xk.OpInputError) as e:
        fused_moe.bind(specs, {"top_k": 2, **attrs})
    msg = str(e.value)
    assert msg.startswith("xla_kernels.fused_moe: ") and f"argument '{arg}'" in msg, msg
    assert words in msg and "Fix:" in msg, msg


def _fp8_specs(block=(0, 0), s13=None, s2=None, wdtype="f8e4m3fn", e=4, n=8, h=16):
    return [*_specs(e=e, n=n, h=h, wdtype=wdtype),
            xk.Spec(s13 or scale_shape(e, 2 * n, h, block), "f32"),
            xk.Spec(s2 or scale_shape(e, h, n, block), "f32")]


BAD_FP8_CALLS = [
    ("bf16 weights", _fp8_specs(wdtype="bf16"), {}, "w13", "dtype bf16 is not supported"),
    ("channel scale", _fp8_specs(s13=(4, 16, 2)), {}, "w13_scale", "one per output channel"),
    ("block scale", _fp8_specs(block=(8, 8), s2=(4, 2, 2)), {"block_shape": (8, 8)},
     "w2_scale", "expected shape (4, 2, 1) (one per 8x8 block)"),
    ("half block", _fp8_specs(), {"block_shape": (0, 128)}, "block_shape", "(0, 0)"),
    ("negative block", _fp8_specs(), {"block_shape": (-1, 4)}, "block_shape", "sizes >= 1"),
    ("common checks", _fp8_specs(), {"top_k": 9}, "top_k", "must be in 1 .. 4"),
]


@pytest.mark.parametrize("name,specs,attrs,arg,words", BAD_FP8_CALLS,
                         ids=[c[0] for c in BAD_FP8_CALLS])
def test_bad_fp8_input_errors_name_argument_and_fix(name, specs, attrs, arg, words):
    with pytest.raises(xk.OpInputError) as e:
        fused_moe_fp8.bind(specs, {"top_k": 2, **attrs})
    msg = str(e.value)
    assert msg.startswith("xla_kernels.fused_moe_fp8: ") and f"argument '{arg}'" in msg, msg
    assert words in msg and "Fix:" in msg, msg


def test_bad_dtypes_are_refused_by_name(rng):
    x = make(rng, 2, 8, 4, 4, "f32")
    with pytest.raises(xk.OpTypeError, match="argument 'hidden': dtype f64"):
        fused_moe(x["hidden"].astype(np.float64), *(x[k] for k in ARGS[1:]), top_k=2)
    with pytest.raises(xk.OpTypeError, match="argument 'router_logits': dtype i32"):
        fused_moe(x["hidden"], x["router_logits"].astype(np.int32), x["w13"], x["w2"], top_k=2)
    with pytest.raises(xk.OpInputError, match="argument 'top_k': missing required"):
        fused_moe(*(x[k] for k in ARGS))


def _handler_call(op, arrays, attrs, out=None, workspaces=None):
    fn = load_kernel(op, "cpu").function
    hidden = arrays[0]
    if workspaces is None:
        t, h = hidden.shape
        sizes = workspace_sizes(t, arrays[2].shape[0], int(attrs["top_k"]),
                                arrays[2].shape[1] // 2, h)
        workspaces = [np.zeros(sizes[0], np.int32), np.zeros(sizes[1], np.float32),
                      np.zeros(sizes[2], hidden.dtype)]
    out = np.zeros_like(hidden) if out is None else out
    call_handler(fn, args=[Buffer.from_array(np.ascontiguousarray(a)) for a in arrays],
                 rets=[Buffer.from_array(o) for o in (out, *workspaces)], attrs=attrs,
                 op_name=op.name)
    return out


def test_the_handler_validates_its_inputs_itself(rng):
    x = make(rng, 3, 16, 4, 8, "f32")
    arrays = [x[k] for k in ARGS]
    attrs = {"top_k": np.int64(2), "renormalize": np.bool_(True), "activation": "silu"}
    out = _handler_call(fused_moe, arrays, attrs)
    assert rel(out, moe_f64(*arrays, top_k=2)) < TOL["f32"]
    cases = [
        (dict(attrs, top_k=np.int64(5)), arrays, None, None, "top_k", "must be in 1"),
        (dict(attrs, activation="tanh"), arrays, None, None, "activation", "unknown"),
        (attrs, [*arrays[:3], arrays[3][:, :, :4]], None, None, "w2", "expected [experts"),
        (attrs, [arrays[0], arrays[1][:, :3], *arrays[2:]], None, None, "router_logits",
         "expected [tokens, experts]"),
        (attrs, arrays, np.zeros((3, 16), np.float16), None, "out", "hidden's shape and dtype"),
        (attrs, arrays, None, [np.zeros(1, np.int32), np.zeros(6, np.float32),
                               np.zeros(600, np.float32)], "workspace", "smaller"),
    ]
    for a, arrs, out, ws, arg, words in cases:
        with pytest.raises(KernelError) as e:
            _handler_call(fused_moe, arrs, a, out=out, workspaces=ws)
        msg = str(e.value)
        assert e.value.code_name == "INVALID_ARGUMENT", msg
        assert f"argument '{arg}'" in msg and words in msg and "Fix:" in msg, msg


def test_the_fp8_handler_validates_its_scales(rng):
    x = make(rng, 3, 16, 4, 8, "f32")
    q13, s13 = fp8_quantize(x["w13"], (0, 0))
    q2, s2 = fp8_quantize(x["w2"], (0, 0))
    attrs = {"top_k": np.int64(2), "renormalize": np.bool_(True), "activation": "silu",
             "block_shape": np.array([0, 0], np.int64)}
    arrays = [x["hidden"], x["router_logits"], q13, q2, s13, s2]
    _handler_call(fused_moe_fp8, arrays, attrs)
    with pytest.raises(KernelError, match=r"argument 'w2_scale': expected f32 \[4, 16, 1\]"):
        _handler_call(fused_moe_fp8, [*arrays[:5], s2[:, :8]], attrs)
    with pytest.raises(KernelError, match=r"argument 'block_shape'.*Fix:"):
        _handler_call(fused_moe_fp8, arrays, dict(attrs, block_shape=np.array([0, 4])))


# frontends and sharding -----------------------------------------------------------------

def test_torch_eager_operator_matches_float64(rng):
    import torch

    from xla_kernels.frontends.torch import torch_op

    x = make(rng, 6, 32, 8, 16, "f32")
    op = torch_op(fused_moe)
    args = [torch.from_numpy(x[k]).to(torch.bfloat16) if k != "router_logits"
            else torch.from_numpy(x[k]) for k in ARGS]
    out = op(*args, top_k=2)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (6, 32)
    want = moe_f64(*(a.float().numpy() for a in args), top_k=2)
    assert rel(out.float().numpy(), want) < TOL["bf16"]


def opcheck_and_compile_checks() -> None:
    import torch

    from xla_kernels.frontends.torch import torch_op

    op = torch_op(fused_moe)
    x = make_inputs(np.random.default_rng(0), tokens=5, hidden=16, experts=4, intermediate=8,
                    dtype="f32")
    args = tuple(torch.from_numpy(x[k]) for k in ARGS)
    torch.library.opcheck(op, args, {"top_k": 2})
    compiled = torch.compile(lambda *a: op(*a, top_k=2).sin(), fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(*args), op(*args, top_k=2).sin())


@pytest.mark.slow
def test_torch_opcheck_and_compile():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("opcheck_and_compile_checks", module="test_moe")


def test_torchax_lowers_to_the_op(rng):
    import torch

    from xla_kernels.frontends.torchax import import_torchax, register_torchax

    torchax = import_torchax()
    from xla_kernels.frontends.torch import torch_op

    register_torchax(fused_moe)
    x = make(rng, 5, 16, 4, 8, "f32")
    env = torchax.default_env()
    with env:
        args = [env.to_xla(torch.from_numpy(x[k])) for k in ARGS]
        out = torch_op(fused_moe)(*args, top_k=2)
        got = np.asarray(out.jax())
    assert rel(got, moe_f64(*(x[k] for k in ARGS), top_k=2)) < TOL["f32"]


def test_export_with_a_symbolic_token_count_runs_at_every_size(rng):
    import jax.numpy as jnp

    x = make(rng, 7, 16, 4, 8, "f32")
    (t,) = jax.export.symbolic_shape("t")
    program = xk.deserialize(xk.serialize(xk.export(
        lambda h, r, a, b: fused_moe(h, r, a, b, top_k=2),
        jax.ShapeDtypeStruct((t, 16), jnp.float32), jax.ShapeDtypeStruct((t, 4), jnp.float32),
        x["w13"], x["w2"], platforms=["cpu"])))
    for tokens in (1, 7):
        args = [x["hidden"][:tokens], x["router_logits"][:tokens], x["w13"], x["w2"]]
        assert rel(program.call(*args), moe_f64(*args, top_k=2)) < TOL["f32"]


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from xla_kernels.kernels.moe import fused_moe, fused_moe_xla
    from xla_kernels.hlo import assert_single_custom_call, hlo_text

    rng = np.random.default_rng(0)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    logits = rng.standard_normal((8, 4)).astype(np.float32)
    w13 = rng.standard_normal((4, 12, 16)).astype(np.float32) / 4
    w2 = rng.standard_normal((4, 16, 6)).astype(np.float32) / 2
    rows = NamedSharding(mesh, P("x"))
    args = (jax.device_put(x, rows), jax.device_put(logits, rows), w13, w2)
    f = jax.jit(lambda *a: fused_moe(*a, top_k=2))
    out = f(*args)
    want = fused_moe_xla(x, logits, w13, w2, top_k=2)
    assert np.allclose(np.asarray(out), np.asarray(want), atol=1e-5)
    assert out.sharding.spec[0] == "x", out.sharding
    call = assert_single_custom_call(hlo_text(f, *args), "xla_kernels.fused_moe")
    assert call.result_shape.startswith("(f32[4,16]"), call.line
    print("ok")
""")


def test_tokens_shard_across_devices():
    result = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.slow
@requires_nvcc
@pytest.mark.parametrize("op", [fused_moe, fused_moe_fp8], ids=["bf16", "fp8"])
def test_cuda_kernel_compiles_for_sm80(op, tmp_path):
    """test_cuda_sources.py builds every shipped op for sm_90a; this op also targets A100."""
    kernel = op.kernels["cuda"]
    path = builder.build_library(op.name, kernel.resolved_sources(), platform="cuda",
                                 cuda_archs=["80"], cache_dir=tmp_path)
    assert path.exists()


def test_experts_no_token_routes_to_are_never_read(rng):
    x = make_inputs(rng, tokens=6, hidden=16, experts=8, intermediate=8, dtype="bf16",
                    poison_experts=(1, 4, 5))
    out = fused_moe(*(x[k] for k in ARGS), top_k=3)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    assert rel(out, moe_f64(*(x[k] for k in ARGS), top_k=3)) < TOL["bf16"]
