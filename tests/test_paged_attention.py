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
from xla_kernels.kernels.paged_attention import (
    paged_attention,
    paged_attention_numpy_f64,
    paged_attention_xla,
    workspace_size,
)
from xla_kernels.kernels.paged_attention.testing import TOLERANCES, make_inputs, rel_error
from xla_kernels.runtime.eager import Buffer, KernelError, call_handler
from xla_kernels.runtime.library import load_kernel

CPU = jax.devices("cpu")[0]
ARGS = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")


def _attrs(scale: float, softcap: float = 0.0, sliding_window: int = 0,
           layout: str = "vllm") -> dict:
    return {"scale": np.float32(scale), "softcap": np.float32(softcap),
            "sliding_window": np.int64(sliding_window), "layout": layout}


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
                 rets=[Buffer.from_array(out), Buffer.from_array(ws)], attrs=_attrs(**attrs),
                 op_name=paged_attention.name)
    return out


def reference(x: dict, **attrs) -> np.ndarray:
    return paged_attention_numpy_f64(*(x[k] for k in ARGS), **attrs)


def check(out: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    assert not np.isnan(np.asarray(out, np.float32)).any(), "NaN in the output"
    err = rel_error(out, ref)
    assert err <= TOLERANCES[dtype], f"relative error {err:.3g} > {TOLERANCES[dtype]}"


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
    with pytest.raises(xk.OpInputError) as e:
        paged_attention.bind(specs, {"scale": 0.1, **attrs})
    msg = str(e.value)
    assert f"argument '{arg}'" in msg and words in msg and "Fix:" in msg, msg


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
                     attrs=_attrs(0.1), op_name=paged_attention.name)
    assert e.value.code_name == "INVALID_ARGUMENT"
    with pytest.raises(KernelError, match="layout"):
        call_handler(fn, args=[Buffer.from_array(x[k]) for k in ARGS],
                     rets=[Buffer.from_array(out), Buffer.from_array(ws)],
                     attrs=_attrs(0.1, layout="bogus"), op_name=paged_attention.name)




def test_workspace_formula_is_the_one_in_limits_h():
    import ctypes

    from xla_kernels.kernels.paged_attention import paged_attention, workspace_size

    library = ctypes.CDLL(str(paged_attention.record.kernel("cpu").library))
    elems = library.XkPagedAttentionWorkspaceElems
    elems.restype = ctypes.c_int64
    elems.argtypes = [ctypes.c_int64] * 4
    for seqs in (0, 1, 3, 32, 129, 4096):
        for heads in (1, 8, 32):
            for dim in (64, 128, 256):
                for context in (0, 16, 64, 65, 2048, 32768, 10**6):
                    assert workspace_size(seqs, heads, dim, context) == elems(
                        seqs, heads, dim, context), (seqs, heads, dim, context)
