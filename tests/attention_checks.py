"""How the tests of the attention ops over a paged cache (paged_attention,
ragged_paged_attention; CPU and GPU) call and judge them: the handler's typed attributes,
the check against the float64 reference, the op under jax.jit, torch tensors of the NumPy
inputs, a handler called eagerly into NaN-filled outputs, and the bad fp8 calls both ops
refuse with the same words."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels.kernels.paged_cache import FP8
from xla_kernels.kernels.paged_testing import TOLERANCES, rel_error


def handler_attrs(scale: float, softcap: float = 0.0, sliding_window: int = 0,
                  layout: str = "vllm", k_scale: float = 1.0, v_scale: float = 1.0) -> dict:
    """The attributes as the handlers decode them (f32, i64, string)."""
    return {"scale": np.float32(scale), "softcap": np.float32(softcap),
            "sliding_window": np.int64(sliding_window), "layout": layout,
            "k_scale": np.float32(k_scale), "v_scale": np.float32(v_scale)}


def check(out, ref: np.ndarray, dtype: str, what: str = "") -> None:
    """No NaN in ``out``, and its relative error against ``ref`` within ``dtype``'s
    tolerance."""
    out = np.asarray(out, np.float32)
    assert not np.isnan(out).any(), f"{what}: NaN in the output"
    err = rel_error(out, ref)
    assert err <= TOLERANCES[dtype], f"{what}: relative error {err:.3g} > {TOLERANCES[dtype]}"


def jit_runner(fn: Callable, arg_names: Sequence[str],
               device: Callable[[], jax.Device] | None = None) -> Callable:
    """``run(x, fresh=False, **attrs)``: ``fn(*(x[k] for k in arg_names), **attrs)`` under
    jax.jit, one compiled program per set of attributes, its inputs on ``device()`` (default:
    the CPU), its result as float32 NumPy. ``fresh``: a newly compiled program (the kernel
    switches in the environment are read at launch, and XLA replays the launches its
    command buffer recorded on a program's first run)."""
    jitted: dict = {}

    def run(x: dict, fresh: bool = False, **attrs) -> np.ndarray:
        key = tuple(sorted(attrs.items()))
        if fresh or key not in jitted:
            jitted[key] = jax.jit(lambda *a: fn(*a, **attrs))
        on = device() if device else jax.devices("cpu")[0]
        return np.asarray(jitted[key](*(jax.device_put(x[k], on) for k in arg_names))
                          ).astype(np.float32)

    return run


def torch_tensor(a: np.ndarray, device: str = "cpu"):
    """``a`` as a torch tensor on ``device``; bf16 and fp8 through a view of their bits."""
    import torch

    if a.dtype.name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn).to(device)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def run_cuda_handler(op: xk.Op, tensors: list, workspace_elems: int, attrs: dict) -> np.ndarray:
    """``op``'s CUDA handler called eagerly on torch CUDA ``tensors``, writing into an output
    shaped like the first tensor and a workspace of ``workspace_elems``, both NaN-filled
    first: what comes back as float32 NumPy was all written by the kernels."""
    import torch

    from xla_kernels.runtime.eager import Buffer, call_handler
    from xla_kernels.runtime.library import load_kernel

    out = torch.full(tensors[0].shape, float("nan"), dtype=tensors[0].dtype, device="cuda")
    ws = torch.full((workspace_elems,), float("nan"), dtype=torch.float32, device="cuda")
    call_handler(load_kernel(op, "cuda").function, args=[Buffer.from_array(t) for t in tensors],
                 rets=[Buffer.from_array(out), Buffer.from_array(ws)],
                 attrs=handler_attrs(**attrs), platform="cuda",
                 stream=torch.cuda.current_stream().cuda_stream, op_name=op.name)
    torch.cuda.synchronize()
    return out.float().cpu().numpy()


def assert_refused(op: xk.Op, specs: list, attrs: dict, arg: str, words: str) -> None:
    """``op.bind`` (with ``scale=0.1`` unless ``attrs`` say otherwise) raises an
    :class:`~xla_kernels.OpInputError` whose message names the op, the argument ``arg``, says
    ``words`` and gives a fix."""
    with pytest.raises(xk.OpInputError) as e:
        op.bind(specs, {"scale": 0.1, **attrs})
    msg = str(e.value)
    assert msg.startswith(f"{op.name}: ") and f"argument '{arg}'" in msg, msg
    assert words in msg and "Fix:" in msg, msg


def fp8_bad_calls(specs: Callable[..., list], query_arg: str) -> list[tuple]:
    """(name, specs, attrs, argument, words) of the fp8 calls both ops refuse; ``specs(dtype=,
    kdtype=)`` gives a valid call's input specs with the queries (named ``query_arg``) in
    ``dtype`` and the caches in ``kdtype`` (the cache shape is [10, 16, 2, 128])."""
    cache = (10, 16, 2, 128)
    return [
        (f"f32 {query_arg}", specs(dtype="f32", kdtype=FP8), {}, query_arg,
         f"dtype f32 is not supported with f8e4m3fn caches. Fix: pass bf16 or f16 {query_arg}"),
        ("one fp8 cache", [*specs(kdtype=FP8)[:2], xk.Spec(cache, "bf16"), *specs()[3:]], {},
         "value_cache", "dtype bf16 differs from the other cache's f8e4m3fn. Fix: store both "
         "caches in f8e4m3fn"),
        ("fp8 value only", [*specs(kdtype="bf16")[:2], xk.Spec(cache, FP8), *specs()[3:]], {},
         "key_cache", "dtype bf16 differs from the other cache's f8e4m3fn"),
        ("zero k_scale", specs(kdtype=FP8), {"k_scale": 0.0}, "k_scale",
         "must be finite and > 0"),
        ("negative v_scale", specs(kdtype=FP8), {"v_scale": -0.5}, "v_scale",
         "must be finite and > 0"),
        ("nan k_scale", specs(kdtype=FP8), {"k_scale": float("nan")}, "k_scale",
         "must be finite and > 0"),
        ("inf v_scale", specs(kdtype=FP8), {"v_scale": float("inf")}, "v_scale",
         "must be finite and > 0"),
        ("scale without fp8", specs(), {"k_scale": 0.5}, "k_scale",
         "the caches are bf16: scales apply to f8e4m3fn caches only. Fix: pass k_scale=1.0"),
        ("v_scale without fp8", specs(dtype="f32"), {"v_scale": 2.0}, "v_scale",
         "the caches are f32: scales apply to f8e4m3fn caches only. Fix: pass v_scale=1.0"),
    ]


def dequantized(x: dict, attrs: dict, query_arg: str) -> tuple[dict, dict]:
    """An fp8 problem (inputs ``x``, call ``attrs``) with its caches dequantized into the
    queries' (``x[query_arg]``) dtype, exact for power-of-two scales, and the attrs without
    the scales."""
    np_dtype = x[query_arg].dtype
    y = dict(x, key_cache=(x["key_cache"].astype(np.float32) * attrs["k_scale"]).astype(np_dtype),
             value_cache=(x["value_cache"].astype(np.float32) * attrs["v_scale"]).astype(
                 np_dtype))
    return y, {k: v for k, v in attrs.items() if k not in ("k_scale", "v_scale")}


def fp8_inputs(make_inputs: Callable[..., dict], rng: np.random.Generator, *, dtype: str,
               scales: tuple[float, float] | None = None, **kw) -> tuple[dict, dict]:
    """``make_inputs(rng, ...)`` (an op's ``testing.make_inputs``) with fp8 caches quantized
    with random (or given) scales; and the scale attrs."""
    k_scale, v_scale = scales or (float(rng.uniform(0.005, 0.1)), float(rng.uniform(0.005, 0.1)))
    x = make_inputs(rng, dtype=dtype, cache_dtype=FP8, kv_scales=(k_scale, v_scale), **kw)
    return x, dict(k_scale=k_scale, v_scale=v_scale)
