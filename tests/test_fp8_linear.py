"""fp8_linear on the CPU: the kernel and the plain-XLA path against the float64 oracle
(tests/fp8_linear_oracle.py) for both activation schemes, per-channel and block scales, odd
shapes (out and in not multiples of the block, tokens 1, 3, 64); a property test over
shapes and blocks; every bad input's message; torch eager, opcheck and torchax; sharding on
a 2-device CPU mesh; export with a symbolic token count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xla_kernels as xk
from fp8_linear_oracle import TOL, fp8_linear_f64, make_inputs, quantize_rows_f32, rel
from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.kernels.fp8_linear import (
    block_scale_shape,
    fp8_linear,
    fp8_linear_xla,
    quantize_activations,
)
from xla_kernels.runtime.eager import Buffer, KernelError, call_handler
from xla_kernels.runtime.library import load_kernel

SCHEMES = ("none", "dynamic")
# (block_shape, out, in): per channel; DeepSeek's 128x128 with partial last blocks in both
# axes; small blocks; in not a multiple of 16 (the CUDA kernel's element-wise loads).
CASES = [((0, 0), 40, 96), ((128, 128), 200, 136), ((16, 32), 37, 80), ((0, 0), 13, 29)]


@pytest.mark.parametrize("tokens", [1, 3, 64])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_cpu_kernel_matches_float64(rng, case, dtype, scheme, tokens):
    block_shape, out, k = case
    x, w, s = make_inputs(rng, tokens, k, out, dtype, block_shape)
    y = fp8_linear(x, w, s, block_shape=block_shape, activation_scheme=scheme)
    assert y.shape == (tokens, out) and y.dtype == x.dtype
    want = fp8_linear_f64(x, w, s, block_shape=block_shape, activation_scheme=scheme)
    assert rel(y, want) < TOL[dtype]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", CASES[:3], ids=[str(c) for c in CASES[:3]])
def test_xla_path_matches_float64(rng, case, dtype, scheme):
    block_shape, out, k = case
    x, w, s = make_inputs(rng, 5, k, out, dtype, block_shape)
    y = jax.jit(lambda *a: fp8_linear_xla(*a, block_shape=block_shape,
                                          activation_scheme=scheme))(x, w, s)
    assert y.dtype == x.dtype
    want = fp8_linear_f64(x, w, s, block_shape=block_shape, activation_scheme=scheme)
    assert rel(y, want) < TOL[dtype]


def test_dynamic_quantizes_the_activations(rng):
    """The W8A8 result carries x's e4m3 rounding (about 2 % per element): far from the
    weight-only result, exact against the oracle that models it."""
    x, w, s = make_inputs(rng, 6, 64, 24, "f32", (0, 0))
    dynamic = fp8_linear(x, w, s, activation_scheme="dynamic")
    none = fp8_linear(x, w, s)
    assert rel(dynamic, fp8_linear_f64(x, w, s, activation_scheme="dynamic")) < 1e-6
    assert rel(dynamic, none) > 1e-2


def test_activation_quantization_is_the_documented_one(rng):
    """The plain-XLA quantization gives the oracle's e4m3 values and scales bit for bit,
    including the row of zeros (scale 1e-12 / 448) and each row's largest value (448)."""
    x = (rng.standard_normal((5, 77)) * rng.uniform(1e-3, 1e3, (5, 1))).astype(np.float32)
    x[2] = 0.0
    q, s = quantize_activations(x)
    q_want, s_want = quantize_rows_f32(x)
    assert np.array_equal(np.asarray(q).astype(np.float64), q_want)
    assert np.array_equal(np.asarray(s, np.float64), s_want)
    assert np.abs(q_want[[0, 1, 3, 4]]).max(axis=1).tolist() == [448.0] * 4


def test_no_tokens_gives_an_empty_output(rng):
    _, w, s = make_inputs(rng, 1, 32, 8, "bf16", (0, 0))
    x = np.zeros((0, 32), ml_dtypes.bfloat16)
    for scheme in SCHEMES:
        assert fp8_linear(x, w, s, activation_scheme=scheme).shape == (0, 8)


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 9), k=st.integers(1, 70), out=st.integers(1, 40),
       block=st.one_of(st.just((0, 0)), st.tuples(st.integers(1, 48), st.integers(1, 80))),
       scheme=st.sampled_from(SCHEMES), seed=st.integers(0, 2 ** 16))
def test_property_any_shape_and_block_matches_float64(tokens, k, out, block, scheme, seed):
    x, w, s = make_inputs(np.random.default_rng(seed), tokens, k, out, "f32", block)
    assert s.shape == block_scale_shape(out, k, block)
    y = fp8_linear(x, w, s, block_shape=block, activation_scheme=scheme)
    assert rel(y, fp8_linear_f64(x, w, s, block_shape=block, activation_scheme=scheme)) < 1e-5


# bad inputs -----------------------------------------------------------------------------

def _specs(t=4, k=32, out=24, dtype="bf16", w=None, wdtype="f8e4m3fn", scale=None,
           sdtype="f32"):
    return [xk.Spec((t, k), dtype), xk.Spec(w or (out, k), wdtype),
            xk.Spec(scale or (out, 1), sdtype)]


BAD_CALLS = [
    ("x/weight in mismatch", _specs(w=(24, 16)), {}, "weight", "expected shape (out, 32)"),
    ("per-channel scale shape", _specs(scale=(24, 2)), {}, "weight_scale",
     "expected shape (24, 1) (one per output channel)"),
    ("block scale shape", _specs(scale=(3, 1)), {"block_shape": (8, 16)}, "weight_scale",
     "expected shape (3, 2) (one per 8x16 block)"),
    ("partial blocks round up", _specs(out=25, k=33, scale=(3, 2)), {"block_shape": (8, 16)},
     "weight_scale", "expected shape (4, 3)"),
    ("half a block shape", _specs(), {"block_shape": (0, 128)}, "block_shape", "(0, 0)"),
    ("negative block", _specs(), {"block_shape": (-1, 4)}, "block_shape", "sizes >= 1"),
    ("activation scheme", _specs(), {"activation_scheme": "static"}, "activation_scheme",
     "unknown scheme 'static'"),
    ("no output rows", _specs(out=0, scale=(0, 1)), {}, "weight", "at least one output row"),
    ("weight dtype", _specs(wdtype="bf16"), {}, "weight", "dtype bf16 is not supported"),
    ("x dtype", _specs(dtype="f64"), {}, "x", "dtype f64 is not supported"),
    ("scale dtype", _specs(sdtype="bf16"), {}, "weight_scale", "dtype bf16 is not supported"),
    ("x rank", [xk.Spec((2, 3, 32), "bf16"), *_specs()[1:]], {}, "x", "rank"),
]


@pytest.mark.parametrize("name,specs,attrs,arg,words", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_errors_name_argument_and_fix(name, specs, attrs, arg, words):
    with pytest.raises(xk.XlaKernelsError) as e:
        fp8_linear.bind(specs, attrs)
    msg = str(e.value)
    assert msg.startswith("xla_kernels.fp8_linear: ") and f"argument '{arg}'" in msg, msg
    assert words in msg and "Fix:" in msg, msg


def _handler_call(arrays, attrs, out=None):
    fn = load_kernel(fp8_linear, "cpu").function
    y = np.zeros((arrays[0].shape[0], arrays[1].shape[0]), arrays[0].dtype) if out is None \
        else out
    workspace = np.zeros(1, np.float32)  # the CUDA kernel's; the CPU kernel leaves it alone
    call_handler(fn, args=[Buffer.from_array(np.ascontiguousarray(a)) for a in arrays],
                 rets=[Buffer.from_array(y), Buffer.from_array(workspace)], attrs=attrs,
                 op_name=fp8_linear.name)
    return y


def test_the_handler_validates_its_inputs_itself(rng):
    x, w, s = make_inputs(rng, 3, 32, 8, "f32", (4, 16))
    attrs = {"block_shape": np.array([4, 16], np.int64), "activation_scheme": "dynamic"}
    y = _handler_call([x, w, s], attrs)
    assert rel(y, fp8_linear_f64(x, w, s, block_shape=(4, 16),
                                 activation_scheme="dynamic")) < TOL["f32"]
    cases = [
        ([x, w, s[:1]], attrs, None, "weight_scale", "expected f32 [2, 2]"),
        ([x, w[:, :16], s], attrs, None, "weight", "expected f8e4m3fn [out, 32]"),
        ([x, w, s], dict(attrs, activation_scheme="static"), None, "activation_scheme",
         "unknown scheme"),
        ([x, w, s], dict(attrs, block_shape=np.array([0, 4])), None, "block_shape",
         "expected (0, 0)"),
        ([x, w, s], attrs, np.zeros((3, 8), np.float16), "y", "x's dtype"),
    ]
    for arrays, a, out, arg, words in cases:
        with pytest.raises(KernelError) as e:
            _handler_call(arrays, a, out=out)
        msg = str(e.value)
        assert e.value.code_name == "INVALID_ARGUMENT", msg
        assert f"argument '{arg}'" in msg and words in msg and "Fix:" in msg, msg


# frontends, export and sharding ---------------------------------------------------------

def test_torch_eager_operator_matches_float64(rng):
    import torch

    from xla_kernels.frontends.torch import torch_op

    x, w, s = make_inputs(rng, 5, 48, 20, "bf16", (8, 16))
    args = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16),
            torch.from_numpy(w.view(np.uint8)).view(torch.float8_e4m3fn), torch.from_numpy(s))
    y = torch_op(fp8_linear)(*args, block_shape=(8, 16), activation_scheme="dynamic")
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (5, 20)
    want = fp8_linear_f64(x, w, s, block_shape=(8, 16), activation_scheme="dynamic")
    assert rel(y.float().numpy(), want) < TOL["bf16"]


def opcheck_and_compile_checks() -> None:
    import torch

    from fp8_linear_oracle import make_inputs as inputs
    from xla_kernels.frontends.torch import torch_op

    op = torch_op(fp8_linear)
    x, w, s = inputs(np.random.default_rng(0), 3, 32, 8, "f32", (0, 0))
    args = (torch.from_numpy(x), torch.from_numpy(w.view(np.uint8)).view(torch.float8_e4m3fn),
            torch.from_numpy(s))
    # Not test_schema: it compares each input before and after with torch.allclose, which
    # torch's CPU does not implement for float8 tensors.
    torch.library.opcheck(op, args, {"activation_scheme": "dynamic"},
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    compiled = torch.compile(lambda *a: op(*a).sin(), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args), op(*args).sin())


@pytest.mark.slow
def test_torch_opcheck_and_compile():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("opcheck_and_compile_checks", module="test_fp8_linear")


def test_torchax_lowers_to_the_op(rng):
    import torch

    from xla_kernels.frontends.torch import torch_op
    from xla_kernels.frontends.torchax import import_torchax, register_torchax

    torchax = import_torchax()
    register_torchax(fp8_linear)
    x, w, s = make_inputs(rng, 4, 40, 12, "f32", (0, 0))
    env = torchax.default_env()
    with env:
        args = [env.to_xla(torch.from_numpy(x)),
                env.to_xla(torch.from_numpy(w.view(np.uint8)).view(torch.float8_e4m3fn)),
                env.to_xla(torch.from_numpy(s))]
        got = np.asarray(torch_op(fp8_linear)(*args, activation_scheme="dynamic").jax())
    want = fp8_linear_f64(x, w, s, activation_scheme="dynamic")
    assert rel(got, want) < TOL["f32"]


def test_export_with_a_symbolic_token_count_runs_at_every_size(rng):
    import jax.numpy as jnp

    x, w, s = make_inputs(rng, 7, 32, 8, "f32", (4, 16))
    (t,) = jax.export.symbolic_shape("t")
    program = xk.deserialize(xk.serialize(xk.export(
        lambda a, b, c: fp8_linear(a, b, c, block_shape=(4, 16)),
        jax.ShapeDtypeStruct((t, 32), jnp.float32), w, s, platforms=["cpu"])))
    for tokens in (1, 7):
        want = fp8_linear_f64(x[:tokens], w, s, block_shape=(4, 16))
        assert rel(program.call(x[:tokens], w, s), want) < TOL["f32"]


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from fp8_linear_oracle import fp8_linear_f64, make_inputs, rel
    from xla_kernels.kernels.fp8_linear import fp8_linear
    from xla_kernels.hlo import assert_single_custom_call, hlo_text

    COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
                   "reduce-scatter")
    mesh = Mesh(np.array(jax.devices()), ("x",))
    rng = np.random.default_rng(0)

    def run(block, out, k, specs, scheme="none"):
        x, w, s = make_inputs(rng, 8, k, out, "f32", block)
        args = [jax.device_put(a, NamedSharding(mesh, p)) for a, p in zip((x, w, s), specs)]
        f = jax.jit(lambda *a: fp8_linear(*a, block_shape=block, activation_scheme=scheme))
        y = f(*args)
        want = fp8_linear_f64(x, w, s, block_shape=block, activation_scheme=scheme)
        assert rel(y, want) < 1e-5, (block, specs, rel(y, want))
        text = hlo_text(f, *args)
        call = assert_single_custom_call(text, "xla_kernels.fp8_linear")
        return y, call, [c for c in COLLECTIVES if c in text]

    # Results: (y, the CUDA kernel's workspace). Tokens split: each device runs its rows.
    y, call, comm = run((0, 0), 12, 32, [P("x"), P(), P()], "dynamic")
    assert y.sharding.spec[0] == "x" and call.result_shape.startswith("(f32[4,12]"), call.line
    assert comm == [], comm
    # Column parallel, per-channel scales: weight rows and scales split together.
    y, call, comm = run((0, 0), 12, 32, [P(), P("x"), P("x")], "dynamic")
    assert tuple(y.sharding.spec)[1:] == ("x",), y.sharding
    assert call.result_shape.startswith("(f32[8,6]") and comm == [], (call.line, comm)
    # Column parallel, block scales, out a multiple of bn: whole blocks per device.
    y, call, comm = run((4, 16), 16, 40, [P(), P("x"), P("x")])
    assert tuple(y.sharding.spec)[1:] == ("x",), y.sharding
    assert call.result_shape.startswith("(f32[8,8]") and comm == [], (call.line, comm)
    # Block scales, out not a multiple of bn: out stays whole (gathered), still right.
    y, call, comm = run((4, 16), 14, 40, [P(), P("x"), P()])
    assert call.result_shape.startswith("(f32[8,14]"), call.line
    # Row parallel (in split): the kernel sees whole rows; XLA gathers them.
    y, call, comm = run((0, 0), 12, 32, [P(None, "x"), P(None, "x"), P()], "dynamic")
    assert call.result_shape.startswith("(f32[8,12]") and "all-gather" in comm, (call.line, comm)
    print("ok")
""")


def test_sharding_on_a_two_device_cpu_mesh():
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.slow
@requires_nvcc
@pytest.mark.parametrize("arch,arch_specific", [("80", False), ("90", True)],
                         ids=["sm_80", "sm_90a"])
def test_cuda_kernel_compiles(arch, arch_specific, tmp_path):
    kernel = fp8_linear.kernels["cuda"]
    path = builder.build_library(fp8_linear.name, kernel.resolved_sources(), platform="cuda",
                                 cuda_archs=[arch], cache_dir=tmp_path,
                                 arch_specific=arch_specific)
    assert path.exists()
