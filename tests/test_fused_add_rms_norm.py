"""fused_add_rms_norm on the CPU: against the float64 reference in f32/bf16/f16 (odd hidden
sizes, zero rows), bit for bit against the unfused add + rms_norm, bad inputs' messages, the
torch eager operator (and opcheck, torch.compile), torchax, and rows sharded on a 2-device
CPU mesh."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import xla_kernels as xk
from test_rms_norm import TOL, rel
from xla_kernels import dtypes
from xla_kernels.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_numpy_f64,
    rms_norm,
)

SHAPES = [(1, 8), (3, 5, 129), (7, 1024), (4, 1), (2, 0, 4), (0, 7)]


def inputs(rng, shape, dtype):
    np_dtype = dtypes.to_numpy(dtype)
    x = rng.standard_normal(shape).astype(np_dtype)
    residual = (3 * rng.standard_normal(shape)).astype(np_dtype)
    w = rng.standard_normal(shape[-1]).astype(np_dtype)
    return x, residual, w


def bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_and_the_unfused_add_then_rms_norm_bit_for_bit(rng, dtype, shape):
    x, residual, w = inputs(rng, shape, dtype)
    out, residual_out = jax.jit(lambda *a: fused_add_rms_norm(*a, eps=1e-5))(x, residual, w)
    assert out.dtype == residual_out.dtype == x.dtype
    assert out.shape == residual_out.shape == x.shape
    want_out, want_residual = fused_add_rms_norm_numpy_f64(x, residual, w, eps=1e-5)
    if x.size:
        assert rel(out, want_out) < TOL[dtype]
        np.testing.assert_array_equal(np.asarray(residual_out, np.float64), want_residual)
    # The serving model's unfused sequence: XLA's add in the dtype, then rms_norm.
    total = jax.jit(lambda a, b: a + b)(x, residual)
    y = jax.jit(lambda s, w: rms_norm(s, w, eps=1e-5))(total, w)
    np.testing.assert_array_equal(bits(residual_out), bits(total))
    np.testing.assert_array_equal(bits(out), bits(y))


def test_the_reference_rounds_the_sum_to_the_dtype():
    x = np.array([[1.0, 2.0 ** -9]], dtypes.to_numpy("bf16"))
    residual = np.array([[2.0 ** -9, 1.0]], dtypes.to_numpy("bf16"))
    _, total = fused_add_rms_norm_numpy_f64(x, residual, np.ones(2, x.dtype))
    np.testing.assert_array_equal(total, [[1.0, 1.0]])   # 1 + 2^-9 rounds to 1 in bf16


def test_eps_is_added_to_the_mean_square(rng):
    x, residual, w = inputs(rng, (3, 16), "f32")
    for eps in (0.0, 0.5):
        out, _ = fused_add_rms_norm(x, residual, w, eps=eps)
        assert rel(out, fused_add_rms_norm_numpy_f64(x, residual, w, eps=eps)[0]) < TOL["f32"]


@pytest.mark.parametrize("args,arg,words", [
    (((2, 8), "f32", (2, 4), "f32", (8,), "f32", 1e-6), "residual",
     r"expected x's shape \(2, 8\) and dtype f32, got \(2, 4\) f32"),
    (((2, 8), "f32", (2, 8), "f16", (8,), "f32", 1e-6), "residual",
     r"expected x's shape \(2, 8\) and dtype f32, got \(2, 8\) f16"),
    (((2, 8), "f32", (2, 8), "f32", (4,), "f32", 1e-6), "weight",
     r"expected shape \(8,\) for x of shape \(2, 8\), got \(4,\)"),
    (((2, 8), "f32", (2, 8), "f32", (8,), "bf16", 1e-6), "weight",
     r"dtype bf16 differs from x's f32"),
    (((2, 8), "f32", (2, 8), "f32", (8,), "f32", -1.0), "eps", r"must be >= 0, got -1.0"),
])
def test_bad_inputs_name_the_argument_and_the_fix(args, arg, words):
    xs, xd, rs, rd, ws, wd, eps = args
    x, r, w = (np.ones(s, dtypes.to_numpy(d)) for s, d in ((xs, xd), (rs, rd), (ws, wd)))
    with pytest.raises(xk.OpInputError, match=rf"xla_kernels.fused_add_rms_norm: argument "
                                              rf"'{arg}': {words}\. Fix: "):
        fused_add_rms_norm(x, r, w, eps=eps)


def test_an_int_input_is_refused():
    x = np.ones((2, 8), np.int32)
    with pytest.raises(xk.OpTypeError, match=r"argument 'x': dtype i32 is not supported"):
        fused_add_rms_norm(x, x, np.ones(8, np.int32))


def test_no_gradient_is_declared(rng):
    x, residual, w = inputs(rng, (2, 8), "f32")
    with pytest.raises(Exception, match="fused_add_rms_norm"):
        jax.grad(lambda x: fused_add_rms_norm(x, residual, w)[0].sum())(x)


def test_torch_eager_operator_matches_float64(rng):
    import torch

    from xla_kernels.frontends.torch import torch_op

    for dtype, torch_dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        x, residual, w = inputs(rng, (5, 129), dtype)
        args = [torch.from_numpy(a.astype(np.float32)).to(torch_dtype) for a in (x, residual, w)]
        out, residual_out = torch_op(fused_add_rms_norm)(*args, eps=1e-5)
        assert out.dtype == residual_out.dtype == torch_dtype
        assert tuple(out.shape) == tuple(residual_out.shape) == (5, 129)
        want_out, want_residual = fused_add_rms_norm_numpy_f64(x, residual, w, eps=1e-5)
        assert rel(out.float().numpy(), want_out) < TOL[dtype]
        np.testing.assert_array_equal(residual_out.float().numpy(), want_residual)
        # torch's own add in the dtype gives the same residual stream.
        assert torch.equal(residual_out, args[0] + args[1])
    assert torch.ops.xla_kernels.fused_add_rms_norm is torch_op(fused_add_rms_norm)


def opcheck_and_compile_checks() -> None:
    import torch

    from xla_kernels.frontends.torch import torch_op

    op = torch_op(fused_add_rms_norm)
    args = (torch.randn(3, 16), torch.randn(3, 16), torch.randn(16))
    torch.library.opcheck(op, args, {"eps": 1e-5})
    compiled = torch.compile(lambda *a: [t.sin() for t in op(*a)], fullgraph=True,
                             backend="aot_eager")
    for got, want in zip(compiled(*args), op(*args), strict=True):
        torch.testing.assert_close(got, want.sin())


def test_torch_opcheck_and_compile():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("opcheck_and_compile_checks", module="test_fused_add_rms_norm")


def test_torchax_lowers_to_the_op(rng):
    import torch

    from xla_kernels.frontends.torchax import import_torchax, register_torchax

    torchax = import_torchax()
    register_torchax(fused_add_rms_norm)
    x, residual, w = inputs(rng, (4, 40), "f32")
    env = torchax.default_env()
    with env:
        args = [env.to_xla(torch.from_numpy(a)) for a in (x, residual, w)]
        out, residual_out = torch.ops.xla_kernels.fused_add_rms_norm(*args, eps=1e-6)
        out, residual_out = np.asarray(out.jax()), np.asarray(residual_out.jax())
    want_out, want_residual = fused_add_rms_norm_numpy_f64(x, residual, w)
    assert rel(out, want_out) < TOL["f32"]
    np.testing.assert_array_equal(residual_out, want_residual)


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from xla_kernels.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_numpy_f64
    from xla_kernels.hlo import assert_single_custom_call, hlo_text

    COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
                   "reduce-scatter")
    mesh = Mesh(np.array(jax.devices()), ("x",))
    rng = np.random.default_rng(0)
    x, r = (rng.standard_normal((2, 4, 34)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(34).astype(np.float32)
    want_out, want_residual = fused_add_rms_norm_numpy_f64(x, r, w)
    f = jax.jit(lambda *a: fused_add_rms_norm(*a, eps=1e-6))

    def run(spec):
        args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in
                ((x, spec), (r, spec), (w, P()))]
        out, residual_out = f(*args)
        assert np.abs(np.asarray(out) - want_out).max() < 1e-5
        assert np.array_equal(np.asarray(residual_out), want_residual)
        text = hlo_text(f, *args)
        return out, residual_out, assert_single_custom_call(
            text, "xla_kernels.fused_add_rms_norm"), [c for c in COLLECTIVES if c in text]

    # Rows split (either leading dimension): each device runs its own rows, no collective.
    for spec, local in ((P("x"), "f32[1,4,34]"), (P(None, "x"), "f32[2,2,34]")):
        out, residual_out, call, comm = run(spec)
        assert out.sharding.spec == residual_out.sharding.spec == spec, out.sharding
        assert call.result_shape.startswith("(" + local), call.line
        assert comm == [], comm
    # hidden split: the kernel needs whole rows, so XLA gathers them (still right).
    out, residual_out, call, comm = run(P(None, None, "x"))
    assert "34]" in call.result_shape and "all-gather" in comm, (call.line, comm)
    print("ok")
""")


def test_rows_shard_on_a_two_device_cpu_mesh():
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
