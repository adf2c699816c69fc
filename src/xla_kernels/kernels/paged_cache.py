"""The paged KV cache, as every cache-reading op sees it: layouts, dimensions, validation.

``layout="vllm"``: [num_blocks, block_size, num_kv_heads, head_dim] (vLLM's
``reshape_and_cache_flash`` layout); ``layout="pallas"``: [num_kv_heads, num_blocks,
block_size, head_dim] (torch_xla / JAX Pallas). Shared by ``paged_attention``,
``ragged_paged_attention`` and ``reshape_and_cache`` and their references.

The **fused** cache (tpu-inference's, read by ``ragged_paged_attention_fused`` and written by
``reshape_and_cache_fused``) is one array [num_blocks, block_size, 2 * num_kv_heads,
head_dim] holding head ``h``'s key at index ``2h`` and its value at ``2h + 1`` of the third
axis: :func:`split_fused` and :func:`join_fused` convert it to and from the two vLLM-layout
caches (the references use them; the kernels read it in place).

Example:
    >>> cache_dims((64, 16, 2, 128), "vllm")
    (64, 16, 2, 128)
    >>> cache_dims((2, 64, 16, 128), "pallas")
    (64, 16, 2, 128)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from xla_kernels import dtypes
from xla_kernels.attrs import Attr
from xla_kernels.kernel_kit import INCLUDE_DIR, read_constants
from xla_kernels.op import Invalid, Spec

LAYOUTS = ("vllm", "pallas")
"""The cache layouts every paged op accepts."""

FP8 = "f8e4m3fn"
"""The fp8 cache dtype (vLLM's ``kv_cache_dtype="fp8"``): stored values times a per-tensor
f32 scale (``k_scale``, ``v_scale``) are the keys and values."""

DTYPES = ("bf16", "f16", "f32")
"""Query (and output) dtypes of the attention ops; their caches share it, or are :data:`FP8`."""
CACHE_DTYPES = (*DTYPES, FP8)
FP8_QUERY_DTYPES = ("bf16", "f16")
"""Query (and output) dtypes allowed with an fp8 cache."""

ATTENTION_LIMITS_HEADER = INCLUDE_DIR / "xla_kernels" / "attention_limits.h"
ATTENTION_LIMITS = read_constants(ATTENTION_LIMITS_HEADER)
HEAD_DIMS: tuple[int, ...] = ATTENTION_LIMITS["kHeadDims"]  # type: ignore[assignment]
"""The head dims the attention kernels support (``attention_limits.h``)."""
BLOCK_SIZES: tuple[int, ...] = ATTENTION_LIMITS["kBlockSizes"]  # type: ignore[assignment]
"""The cache block sizes the attention kernels support (``attention_limits.h``)."""


def attention_attrs(sliding_window_doc: str, *, layout: bool = True) -> list[Attr]:
    """The attributes every attention op over a paged cache declares, in order: ``scale``,
    ``softcap``, ``sliding_window`` (documented by ``sliding_window_doc``), ``layout``
    (unless ``layout=False``: an op with one fixed layout), ``k_scale``, ``v_scale``.

    Example:
        >>> [a.name for a in attention_attrs("> 0: a window", layout=False)]
        ['scale', 'softcap', 'sliding_window', 'k_scale', 'v_scale']
    """
    return [
        Attr("scale", float, doc="multiplies q.k"),
        Attr("softcap", float, default=0.0, doc="> 0: softcap * tanh(logit / softcap)"),
        Attr("sliding_window", int, default=0, doc=sliding_window_doc),
        *([Attr("layout", str, default="vllm", doc='"vllm" or "pallas" cache layout')]
          if layout else []),
        Attr("k_scale", float, default=1.0, doc="fp8 caches: key = stored key * k_scale"),
        Attr("v_scale", float, default=1.0, doc="fp8 caches: value = stored value * v_scale"),
    ]


def check_attention_attrs(scale: float, softcap: float, sliding_window: int) -> None:
    """Raise :class:`~xla_kernels.Invalid` for a ``scale`` that is not finite, a ``softcap``
    that is not finite and >= 0, or a negative ``sliding_window``.

    Example:
        >>> check_attention_attrs(0.125, 0.0, 0)
    """
    if not math.isfinite(float(scale)):
        raise Invalid("scale", f"must be finite, got {float(scale)}",
                      "pass e.g. scale=head_dim ** -0.5")
    if not math.isfinite(float(softcap)) or float(softcap) < 0:
        raise Invalid("softcap", f"must be finite and >= 0, got {float(softcap)}",
                      "pass softcap=0.0 to disable it")
    if int(sliding_window) < 0:
        raise Invalid("sliding_window", f"must be >= 0, got {int(sliding_window)}",
                      "pass sliding_window=0 to disable it")


def cache_dims(shape: Sequence[int], layout: str) -> tuple[int, int, int, int]:
    """(num_blocks, block_size, num_kv_heads, head_dim) of a cache shape in ``layout``."""
    if layout == "vllm":
        return shape[0], shape[1], shape[2], shape[3]
    if layout == "pallas":
        return shape[1], shape[2], shape[0], shape[3]
    raise ValueError(f"unknown layout {layout!r}; use 'vllm' or 'pallas'")


def cache_factors(layout: str) -> str:
    """A cache's dimensions as sharding-rule factors: b(locks) t(okens per block) k(v heads)
    d(head_dim), in ``layout``'s order.

    Example:
        >>> cache_factors("pallas")
        'k b t d'
    """
    return "b t k d" if layout == "vllm" else "k b t d"


def fused_cache_dims(shape: Sequence[int], arg: str = "kv_cache") -> tuple[int, int, int, int]:
    """(num_blocks, block_size, num_kv_heads, head_dim) of a fused cache shape: 4-D
    [num_blocks, block_size, 2 * num_kv_heads, head_dim], or tpu-inference's packed 5-D
    [num_blocks, block_size, merged, packing, head_dim] with merged * packing = 2 *
    num_kv_heads (the same memory). Raises :class:`~xla_kernels.Invalid` naming ``arg`` when
    the shape is neither.

    Example:
        >>> fused_cache_dims((64, 16, 4, 128)), fused_cache_dims((64, 16, 2, 2, 128))
        ((64, 16, 2, 128), (64, 16, 2, 128))
    """
    rows = shape[2] * shape[3] if len(shape) == 5 else shape[2] if len(shape) == 4 else 1
    if len(shape) not in (4, 5) or rows % 2:
        raise Invalid(arg, f"expected [num_blocks, block_size, 2 * num_kv_heads, head_dim] "
                      f"(or tpu-inference's [num_blocks, block_size, merged, packing, "
                      f"head_dim]), got shape {tuple(shape)}",
                      "pass one cache holding each kv head's key and value at rows 2h and "
                      "2h + 1 of each slot")
    return shape[0], shape[1], rows // 2, shape[-1]


def fused_cache_factors(shape: Sequence[int]) -> tuple[str, dict[str, int]]:
    """A fused cache's dimensions as sharding-rule factors, and the sizes the rule must be
    told: b(locks) t(okens per block), then a slot's rows (k p), kv heads and the (key,
    value) pair, then d(head_dim). tpu-inference's packed 5-D cache splits the rows as
    [merged, packing]: with packing 2 those are k and p; otherwise a row word holds parts of
    several heads, and both axes (w x) stay whole.

    Example:
        >>> fused_cache_factors((8, 16, 4, 64)), fused_cache_factors((8, 16, 2, 2, 64))
        (('b t (k p) d', {'p': 2}), ('b t k p d', {}))
    """
    if len(shape) == 4:
        return "b t (k p) d", {"p": 2}
    return ("b t k p d" if shape[3] == 2 else "b t w x d"), {}


def split_fused(kv_cache: Any) -> tuple[Any, Any]:
    """The (key_cache, value_cache) pair, ``layout="vllm"``, a fused cache holds (NumPy or
    JAX arrays; a copy).

    Example:
        >>> kv = np.arange(2 * 1 * 4 * 1).reshape(2, 1, 4, 1)
        >>> [c.ravel().tolist() for c in split_fused(kv)]
        [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    if kv_cache.ndim == 5:  # tpu-inference's packed shape: the same rows
        kv_cache = kv_cache.reshape(*kv_cache.shape[:2], -1, kv_cache.shape[-1])
    return kv_cache[:, :, 0::2], kv_cache[:, :, 1::2]


def join_fused(key_cache: Any, value_cache: Any) -> np.ndarray:
    """The fused cache holding two ``layout="vllm"`` caches (NumPy; the inverse of
    :func:`split_fused`).

    Example:
        >>> k, v = np.zeros((2, 1, 2, 1)), np.ones((2, 1, 2, 1))
        >>> join_fused(k, v)[0, 0].ravel().tolist()
        [0.0, 1.0, 0.0, 1.0]
    """
    k, v = np.asarray(key_cache), np.asarray(value_cache)
    out = np.empty((*k.shape[:2], 2 * k.shape[2], k.shape[3]), k.dtype)
    out[:, :, 0::2], out[:, :, 1::2] = k, v
    return out


def fp8_query_dtype(query_dtype: Any) -> np.dtype:
    """The dtype attention over an fp8 cache takes queries in: ``query_dtype`` if it is 16-bit
    (:data:`FP8_QUERY_DTYPES`), else bfloat16 (an f32 model casts its queries, and the output
    back, around the op).

    Example:
        >>> str(fp8_query_dtype(np.float16)), str(fp8_query_dtype(np.float32))
        ('float16', 'bfloat16')
    """
    dtype = np.dtype(query_dtype)
    return dtype if dtype.itemsize == 2 else dtypes.to_numpy("bf16")


def quantize_fp8(x: Any, scale: float) -> np.ndarray:
    """``x / scale`` (in f32) as ``float8_e4m3fn`` in NumPy: round to nearest even, saturated
    to +-448 (infinities too), NaN kept: what ``reshape_and_cache`` stores in an fp8 cache.

    Example:
        >>> quantize_fp8(np.array([1.0, 1000.0, -np.inf, 0.3]), 0.5).astype(np.float32)
        array([   2.   ,  448.   , -448.   ,    0.625], dtype=float32)
    """
    y = np.asarray(x).astype(np.float32) / np.float32(scale)
    return np.clip(y, -448.0, 448.0).astype(dtypes.to_numpy(FP8))


def check_layout(layout: str) -> None:
    """Raise :class:`~xla_kernels.Invalid` for a layout no paged op knows."""
    if layout not in LAYOUTS:
        raise Invalid("layout", f"unknown layout {layout!r}",
                      'use "vllm" ([num_blocks, block_size, num_kv_heads, head_dim]) or '
                      '"pallas" ([num_kv_heads, num_blocks, block_size, head_dim])')


def check_fp8_caches(query_arg: str, query: Spec, key_cache: Spec, value_cache: Spec, *,
                     query_dtypes: Sequence[str]) -> bool:
    """Whether the caches are fp8 (:data:`FP8`); raises :class:`~xla_kernels.Invalid` when
    only one is, or when fp8 caches come with a query dtype outside ``query_dtypes``.

    Example:
        >>> q, c = Spec((1, 8, 64), "bf16"), Spec((4, 16, 2, 64), FP8)
        >>> check_fp8_caches("query", q, c, c, query_dtypes=("bf16", "f16"))
        True
    """
    fp8 = (key_cache.dtype == FP8, value_cache.dtype == FP8)
    if not any(fp8):
        return False
    if not all(fp8):
        bad, other = (("value_cache", value_cache) if fp8[0] else ("key_cache", key_cache))
        raise Invalid(bad, f"dtype {other.dtype} differs from the other cache's {FP8}",
                      f"store both caches in {FP8} (with k_scale and v_scale) or neither")
    if query.dtype not in query_dtypes:
        raise Invalid(query_arg, f"dtype {query.dtype} is not supported with {FP8} caches",
                      f"pass {' or '.join(query_dtypes)} {query_arg} (the output has their "
                      "dtype)")
    return True


def check_kv_scales(k_scale: float, v_scale: float, *, cache_dtype: str) -> None:
    """Raise :class:`~xla_kernels.Invalid` for a scale that is not finite and > 0, or that is
    not 1.0 while the caches are not fp8 (a scale there would be ignored silently).

    Example:
        >>> check_kv_scales(0.02, 0.5, cache_dtype=FP8)
        >>> check_kv_scales(1.0, 1.0, cache_dtype="bf16")
    """
    for name, value in (("k_scale", float(k_scale)), ("v_scale", float(v_scale))):
        if not math.isfinite(value) or value <= 0:
            raise Invalid(name, f"must be finite and > 0, got {value}",
                          f"pass the fp8 cache's per-tensor scale (dequantized value = stored "
                          f"x {name}), or 1.0")
        if cache_dtype != FP8 and value != 1.0:
            raise Invalid(name, f"is {value}, but the caches are {cache_dtype}: scales apply "
                          f"to {FP8} caches only", f"pass {name}=1.0, or {FP8} caches")


def check_attention_caches(query_arg: str, query: Spec, key_cache: Spec, value_cache: Spec, *,
                           layout: str, head_dims: Sequence[int], block_sizes: Sequence[int],
                           fp8_query_dtypes: Sequence[str] = ()) -> tuple[int, int, int, int]:
    """Validate the caches an attention op reads against its queries ([tokens, q_heads,
    head_dim], named ``query_arg``); returns :func:`cache_dims`. Raises
    :class:`~xla_kernels.Invalid` naming the argument and the fix. The caches share the
    queries' dtype, or, for an op that passes ``fp8_query_dtypes``, are both :data:`FP8`
    with queries of one of those dtypes."""
    check_layout(layout)
    owner = f"the {query_arg}'" + ("" if query_arg.endswith("s") else "s")
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    fp8 = bool(fp8_query_dtypes) and check_fp8_caches(query_arg, query, key_cache, value_cache,
                                                       query_dtypes=fp8_query_dtypes)
    if not fp8 and (key_cache.dtype != query.dtype or value_cache.dtype != query.dtype):
        bad = "key_cache" if key_cache.dtype != query.dtype else "value_cache"
        other = key_cache if bad == "key_cache" else value_cache
        raise Invalid(bad, f"dtype {other.dtype} differs from {owner} {query.dtype}",
                      f"cast {query_arg} and caches to one dtype")
    if head_dim not in head_dims:
        raise Invalid(query_arg, f"head_dim {head_dim} is not supported",
                      f"use head_dim {', '.join(map(str, head_dims))} (pad the head dimension)")
    if value_cache.shape != key_cache.shape:
        raise Invalid("value_cache", f"shape {value_cache.shape} differs from key_cache's "
                      f"{key_cache.shape}", "pass key and value caches of one shape")
    dims = cache_dims(key_cache.shape, layout)
    _, block_size, num_kv_heads, cache_dim = dims
    if cache_dim != head_dim:
        raise Invalid("key_cache", f"head_dim {cache_dim} (last dimension) differs from "
                      f"{owner} {head_dim}", f"pass caches with {owner} head_dim")
    if block_size not in block_sizes:
        raise Invalid("key_cache", f"block_size {block_size} is not supported (shape "
                      f"{key_cache.shape} read in layout {layout!r})",
                      f"use block_size {', '.join(map(str, block_sizes))}, and check that "
                      "`layout` matches the cache")
    if num_kv_heads <= 0 or num_q_heads % num_kv_heads:
        raise Invalid("key_cache", f"num_q_heads {num_q_heads} is not a multiple of "
                      f"num_kv_heads {num_kv_heads}",
                      "use a kv head count that divides the query head count (GQA/MQA)")
    return dims
