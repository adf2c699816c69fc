"""paged_attention on the CPU: the CPU kernel and the plain-XLA fallback against float64.

Every check draws fresh random inputs (the ``rng`` fixture prints its seed), poisons the
cache slots that must not be read with NaN, and, for the kernel, fills the output with NaN
before the call (through the eager runtime, which writes into our own arrays).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from attention_checks import (
    assert_refused,
    check,
    dequantized,
    fp8_bad_calls,
    handler_attrs,
    torch_tensor,
)
from xla_kernels.kernels.paged_attention import (
    paged_attention,
    paged_attention_numpy_f64,
    paged_attention_xla,
    workspace_size,
)
from xla_kernels.kernels.paged_attention.testing import TOLERANCES, make_inputs, rel_error
from xla_kernels.kernels.paged_cache import FP8
from xla_kernels.runtime import kernel_of
from xla_kernels.runtime.eager import Buffer, KernelError, call_handler
from xla_kernels.runtime.library import load_kernel

CPU = jax.devices("cpu")[0]
ARGS = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")


def run_cpu_kernel(x: dict, **attrs) -> np.ndarray:
    """The CPU handler called eagerly, writing into a NaN-poisoned output."""
    fn = load_kernel(paged_attention, "cpu").function
    q = x["query"]
    out = np.full_like(q, np.nan)
    layout = attrs.get("layout", "vllm")
    block_size = x["key_cache"].shape[1] if layout == "vllm" else x["key_cache"].shape[2]
    ws = np.full(workspace_size(q.shape[0], q.shape[1], q.shape[2],
                                x["block_tables"].shape[1] * block_size), np.nan, np.float32)
    call_handler(fn, args=[Buffer.from_array(np.ascontiguousarray(x[k])) for k in ARGS],
                 rets=[Buffer.from_array(out), Buffer.from_array(ws)], attrs=handler_attrs(**attrs),
                 op_name=paged_attention.name)
    return out


def reference(x: dict, **attrs) -> np.ndarray:
    return paged_attention_numpy_f64(*(x[k] for k in ARGS), **attrs)


# A covering set: every dtype x head_dim x block_size once, layouts and GQA ratios
# (1, 4 and 32 = MQA) rotating through them.
HEADS = [(8, 8), (8, 2), (32, 1)]
MATRIX = [
    (dtype, d, b, ("vllm", "pallas")[i % 2], HEADS[(i // 2) % 3])
    for i, (dtype, d, b) in enumerate(itertools.product(("bf16", "f16", "f32"),
                                                        (64, 128, 256), (16, 32, 64)))
]


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads", MATRIX)
def test_cpu_kernel_matches_float64(rng, dtype, head_dim, block_size, layout, heads):
    hq, hkv = heads
    x = make_inputs(rng, num_seqs=4, num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                    block_size=block_size, dtype=dtype, layout=layout, max_context=150)
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    out = run_cpu_kernel(x, scale=scale, layout=layout)
    check(out, reference(x, scale=scale, layout=layout), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("softcap,window", [(0.0, 0), (5.0, 0), (0.0, 37), (10.0, 16)])
def test_softcap_and_sliding_window(rng, dtype, layout, softcap, window):
    x = make_inputs(rng, num_seqs=5, num_q_heads=8, num_kv_heads=2, head_dim=64,
                    block_size=16, dtype=dtype, layout=layout, max_context=120,
                    sliding_window=window)
    attrs = dict(scale=3.0 / 8.0, softcap=softcap, sliding_window=window, layout=layout)
    ref = reference(x, **attrs)
    check(run_cpu_kernel(x, **attrs), ref, dtype)
    xla = jax.jit(paged_attention_xla, static_argnames=tuple(attrs))(
        *(x[k] for k in ARGS), **attrs)
    check(xla, ref, dtype)


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads", MATRIX[::3])
def test_xla_reference_matches_float64(rng, dtype, head_dim, block_size, layout, heads):
    hq, hkv = heads
    x = make_inputs(rng, num_seqs=3, num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                    block_size=block_size, dtype=dtype, layout=layout, max_context=100)
    f = jax.jit(paged_attention_xla, static_argnames=("scale", "layout"))
    out = f(*(x[k] for k in ARGS), scale=0.1, layout=layout)
    check(out, reference(x, scale=0.1, layout=layout), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_op_under_jit_and_vmap(rng, dtype):
    x = make_inputs(rng, num_seqs=3, num_q_heads=4, num_kv_heads=2, head_dim=128,
                    block_size=32, dtype=dtype, layout="pallas", max_context=200)
    args = [jax.device_put(x[k], CPU) for k in ARGS]

    @jax.jit
    def f(*a):
        return paged_attention(*a, scale=0.09, softcap=20.0, layout="pallas")

    out = f(*args)
    assert out.shape == x["query"].shape and out.dtype == x["query"].dtype
    check(out, reference(x, scale=0.09, softcap=20.0, layout="pallas"), dtype)
    # vmap over a leading batch of queries (sequential batching rule).
    qs = jnp.stack([args[0], -args[0]])
    outs = jax.vmap(lambda q: paged_attention(q, *args[1:], scale=0.09, layout="pallas"))(qs)
    for i, sign in enumerate((1, -1)):
        y = dict(x, query=(sign * x["query"].astype(np.float32)).astype(x["query"].dtype))
        check(outs[i], reference(y, scale=0.09, layout="pallas"), dtype)


def test_long_context_ragged(rng):
    x = make_inputs(rng, num_seqs=3, num_q_heads=16, num_kv_heads=4, head_dim=128,
                    block_size=64, dtype="bf16", seq_lens=[1, 3001, 4096 - 5], max_context=4096)
    check(run_cpu_kernel(x, scale=0.088), reference(x, scale=0.088), "bf16")


def test_out_of_range_block_ids_are_masked(rng):
    x = make_inputs(rng, num_seqs=4, num_q_heads=8, num_kv_heads=4, head_dim=64,
                    block_size=16, dtype="f32", seq_lens=[64, 50, 33, 64], poison=False)
    bt = x["block_tables"]
    num_blocks = x["key_cache"].shape[0]
    bt[0, 1] = -1                      # one bad block in the middle
    bt[1, 0] = num_blocks              # first block past the end
    bt[2, 2] = 2**31 - 1               # huge id in the last, partial block
    bt[3, :] = -(2**31)                # every block bad: all masked -> zeros
    ref = reference(x, scale=0.125)
    assert np.all(ref[3] == 0)
    for out in (run_cpu_kernel(x, scale=0.125),
                jax.jit(paged_attention_xla, static_argnames="scale")(
                    *(x[k] for k in ARGS), scale=0.125)):
        check(out, ref, "f32")
        assert np.all(np.asarray(out)[3] == 0)


def test_empty_and_overlong_sequences(rng):
    x = make_inputs(rng, num_seqs=5, num_q_heads=4, num_kv_heads=1, head_dim=64,
                    block_size=16, dtype="bf16", seq_lens=[0, -7, 5, 48, 48], max_context=48)
    x["seq_lens"][4] = 10**6           # clamped to the capacity (48)
    ref = reference(x, scale=0.125)
    clamped = reference(dict(x, seq_lens=np.array([0, -7, 5, 48, 48], np.int32)), scale=0.125)
    np.testing.assert_array_equal(ref, clamped)
    for out in (run_cpu_kernel(x, scale=0.125),
                paged_attention(*(x[k] for k in ARGS), scale=0.125),
                paged_attention_xla(*(x[k] for k in ARGS), scale=0.125)):
        out = np.asarray(out, np.float32)
        assert np.all(out[:2] == 0), "seq_len <= 0 must give zeros"
        check(out, ref, "bf16")


def test_workspace_size():
    assert workspace_size(4, 8, 128, 64) == 1           # one partition: no workspace
    assert workspace_size(32, 32, 128, 2048) == 32 * 32 * 32 * 130
    assert workspace_size(1, 32, 128, 32768) == 32 * 64 * 130
    assert workspace_size(128, 32, 256, 32768) == 128 * 32 * 16 * 258
    spec = paged_attention.bind(
        [xk.Spec((32, 32, 128), "bf16"), xk.Spec((4096, 16, 8, 128), "bf16"),
         xk.Spec((4096, 16, 8, 128), "bf16"), xk.Spec((32, 128), "i32"),
         xk.Spec((32,), "i32")], {"scale": 0.1}).outputs
    assert spec[0] == xk.Spec((32, 32, 128), "bf16")
    assert spec[1] == xk.Spec((workspace_size(32, 32, 128, 2048),), "f32", workspace=True)


def _specs(q=(2, 8, 128), k=(10, 16, 2, 128), v=None, bt=(2, 4), sl=(2,), dtype="bf16",
           kdtype=None):
    return [xk.Spec(q, dtype), xk.Spec(k, kdtype or dtype), xk.Spec(v or k, kdtype or dtype),
            xk.Spec(bt, "i32"), xk.Spec(sl, "i32")]


BAD_CALLS = [
    ("head_dim", _specs(q=(2, 8, 96), k=(10, 16, 2, 96)), {}, "query", "head_dim"),
    ("dtype mismatch", _specs(kdtype="f16"), {}, "key_cache", "dtype"),
    ("heads", _specs(q=(2, 6, 128), k=(10, 16, 4, 128)), {}, "key_cache", "multiple"),
    ("block size", _specs(k=(10, 8, 2, 128)), {}, "key_cache", "block_size"),
    ("cache dim", _specs(k=(10, 16, 2, 64)), {}, "key_cache", "head_dim"),
    ("value shape", _specs(v=(11, 16, 2, 128)), {}, "value_cache", "shape"),
    ("tables", _specs(bt=(3, 4)), {}, "block_tables", "shape"),
    ("lens", _specs(sl=(3,)), {}, "seq_lens", "shape"),
    ("layout", _specs(), {"layout": "nhd"}, "layout", "unknown layout"),
    ("window", _specs(), {"sliding_window": -1}, "sliding_window", ">= 0"),
    ("softcap", _specs(), {"softcap": -1.0}, "softcap", ">= 0"),
    ("scale", _specs(), {"scale": float("inf")}, "scale", "finite"),
    ("pallas dims", _specs(k=(2, 10, 16, 128)), {"layout": "vllm"}, "key_cache", "block_size"),
]


@pytest.mark.parametrize("name,specs,attrs,arg,words", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_errors_name_argument_and_fix(name, specs, attrs, arg, words):
    assert_refused(paged_attention, specs, attrs, arg, words)


def test_bad_dtype_rejected(rng):
    x = make_inputs(rng, num_seqs=2, num_q_heads=2, num_kv_heads=1, head_dim=64,
                    block_size=16, dtype="f32", max_context=32)
    with pytest.raises(xk.OpTypeError, match="query"):
        paged_attention(x["query"].astype(np.float64), *(x[k] for k in ARGS[1:]), scale=1.0)
    with pytest.raises(xk.OpTypeError, match="block_tables"):
        paged_attention(*(x[k] for k in ARGS[:3]), x["block_tables"].astype(np.int64),
                        x["seq_lens"], scale=1.0)


def test_kernel_validates_shapes_itself(rng):
    """The C++ handler re-checks its inputs and fails cleanly (no crash)."""
    x = make_inputs(rng, num_seqs=2, num_q_heads=8, num_kv_heads=2, head_dim=64,
                    block_size=16, dtype="f32", max_context=32)
    fn = load_kernel(paged_attention, "cpu").function
    out, ws = np.zeros_like(x["query"]), np.zeros(1, np.float32)
    bad = dict(x, key_cache=np.ascontiguousarray(x["key_cache"][..., :32]),
               value_cache=np.ascontiguousarray(x["value_cache"][..., :32]))
    with pytest.raises(KernelError, match="head_dim") as e:
        call_handler(fn, args=[Buffer.from_array(np.ascontiguousarray(bad[k])) for k in ARGS],
                     rets=[Buffer.from_array(out), Buffer.from_array(ws)],
                     attrs=handler_attrs(0.1), op_name=paged_attention.name)
    assert e.value.code_name == "INVALID_ARGUMENT"
    with pytest.raises(KernelError, match="layout"):
        call_handler(fn, args=[Buffer.from_array(x[k]) for k in ARGS],
                     rets=[Buffer.from_array(out), Buffer.from_array(ws)],
                     attrs=handler_attrs(0.1, layout="bogus"), op_name=paged_attention.name)




def test_workspace_formula_is_the_one_in_limits_h():
    import ctypes

    from xla_kernels.kernels.paged_attention import paged_attention, workspace_size

    library = ctypes.CDLL(str(kernel_of(paged_attention, "cpu").library))
    elems = library.XkPagedAttentionWorkspaceElems
    elems.restype = ctypes.c_int64
    elems.argtypes = [ctypes.c_int64] * 4
    for seqs in (0, 1, 3, 32, 129, 4096):
        for heads in (1, 8, 32):
            for dim in (64, 128, 256):
                for context in (0, 16, 64, 65, 2048, 32768, 10**6):
                    assert workspace_size(seqs, heads, dim, context) == elems(
                        seqs, heads, dim, context), (seqs, heads, dim, context)


# ------------------------------------------------------------------ fp8 KV cache

# Every query dtype x head_dim x block_size once with fp8 caches; layouts and GQA ratios
# rotate through them.
FP8_MATRIX = [
    (dtype, d, b, ("vllm", "pallas")[i % 2], HEADS[(i // 2) % 3])
    for i, (dtype, d, b) in enumerate(itertools.product(("bf16", "f16"), (64, 128, 256),
                                                        (16, 32, 64)))
]


def fp8_problem(rng, *, dtype, head_dim=64, block_size=16, layout="vllm", heads=(8, 2),
                num_seqs=5, max_context=150, scales=None, **kw):
    """Random fp8 caches (NaN in every slot that must not be read) and random scales; the
    attrs to call with."""
    k_scale, v_scale = scales or (float(rng.uniform(0.005, 0.1)), float(rng.uniform(0.005, 0.1)))
    x = make_inputs(rng, num_seqs=num_seqs, num_q_heads=heads[0], num_kv_heads=heads[1],
                    head_dim=head_dim, block_size=block_size, dtype=dtype, layout=layout,
                    max_context=max_context, cache_dtype=FP8, kv_scales=(k_scale, v_scale),
                    **kw)
    scale = float(rng.uniform(0.5, 2.0)) / np.sqrt(head_dim)
    return x, dict(scale=scale, layout=layout, k_scale=k_scale, v_scale=v_scale)


@pytest.mark.parametrize("dtype,head_dim,block_size,layout,heads", FP8_MATRIX)
def test_fp8_cache_cpu_kernel_matches_float64_of_the_dequantized_cache(
        rng, dtype, head_dim, block_size, layout, heads):
    x, attrs = fp8_problem(rng, dtype=dtype, head_dim=head_dim, block_size=block_size,
                           layout=layout, heads=heads)
    assert x["key_cache"].dtype.name == "float8_e4m3fn"
    out = run_cpu_kernel(x, **attrs)
    assert out.dtype == x["query"].dtype
    check(out, reference(x, **attrs), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
def test_fp8_error_is_no_worse_than_the_same_kernel_on_the_dequantized_cache(rng, dtype,
                                                                           layout):
    """Power-of-two scales make the dequantized cache exact in bf16/f16: the fp8 kernel's
    error against float64 is then held to the bf16/f16 kernel's on the same values."""
    x, attrs = fp8_problem(rng, dtype=dtype, layout=layout, heads=(8, 2), head_dim=128,
                           scales=(2.0**-5, 2.0**-6), max_context=300)
    ref = reference(x, **attrs)
    fp8_err = rel_error(run_cpu_kernel(x, **attrs), ref)
    deq, plain = dequantized(x, attrs, "query")
    same_err = rel_error(run_cpu_kernel(deq, **plain), ref)
    assert fp8_err <= same_err * 1.01 + 1e-7, (fp8_err, same_err)
    assert fp8_err <= TOLERANCES[dtype]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("softcap,window", [(0.0, 0), (7.0, 23)])
def test_fp8_cache_jit_op_and_xla_fallback(rng, dtype, layout, softcap, window):
    x, attrs = fp8_problem(rng, dtype=dtype, layout=layout, heads=(6, 3), head_dim=64,
                           block_size=32, sliding_window=window, max_context=170)
    attrs.update(softcap=softcap, sliding_window=window)
    ref = reference(x, **attrs)
    args = [jax.device_put(x[k], CPU) for k in ARGS]
    out = jax.jit(lambda *a: paged_attention(*a, **attrs))(*args)
    assert out.dtype == x["query"].dtype
    check(out, ref, dtype)
    xla = jax.jit(paged_attention_xla, static_argnames=tuple(attrs))(*args, **attrs)
    check(xla, ref, dtype)


def test_fp8_cache_empty_rows_and_out_of_range_ids(rng):
    x, attrs = fp8_problem(rng, dtype="bf16", seq_lens=[0, -2, 40, 64, 10**6], max_context=64)
    x["block_tables"][2, 1] = -1
    x["block_tables"][3, :] = 2**31 - 1
    out = run_cpu_kernel(x, **attrs)
    assert np.all(out[[0, 1, 3]].astype(np.float32) == 0)
    check(out, reference(x, **attrs), "bf16")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_fp8_cache_in_torch_eager(rng, dtype):
    torch = pytest.importorskip("torch")
    from xla_kernels.frontends.torch import torch_op

    x, attrs = fp8_problem(rng, dtype=dtype, layout="pallas", heads=(4, 4))
    tdtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    out = torch_op(paged_attention)(*(torch_tensor(x[k]) for k in ARGS), **attrs)
    assert out.dtype == tdtype
    check(out.float().numpy(), reference(x, **attrs), dtype)


FP8_BAD_CALLS = fp8_bad_calls(_specs, "query")


@pytest.mark.parametrize("name,specs,attrs,arg,words", FP8_BAD_CALLS,
                         ids=[c[0] for c in FP8_BAD_CALLS])
def test_fp8_bad_calls_name_argument_and_fix(name, specs, attrs, arg, words):
    assert_refused(paged_attention, specs, attrs, arg, words)


def test_fp8_query_is_refused_by_dtype():
    with pytest.raises(xk.OpTypeError, match=r"argument 'query': dtype f8e4m3fn is not "
                                             r"supported. Fix: pass one of bf16, f16, f32"):
        paged_attention.bind(_specs(dtype=FP8), {"scale": 0.1})


@pytest.mark.parametrize("change,words", [
    (dict(dtype=np.float32), "dtype f32 is not supported with f8e4m3fn caches"),
    (dict(k_scale=0.0), "argument 'k_scale': must be finite and > 0"),
    (dict(v_scale=float("nan")), "argument 'v_scale': must be finite and > 0"),
])
def test_fp8_handler_validates_itself(rng, change, words):
    """The C++ handler re-checks dtypes and scales (a hand-written call skips Python)."""
    x, attrs = fp8_problem(rng, dtype="bf16")
    if "dtype" in change:
        x["query"] = x["query"].astype(change.pop("dtype"))
    attrs.update(change)
    with pytest.raises(KernelError, match=words):
        run_cpu_kernel(x, **attrs)
