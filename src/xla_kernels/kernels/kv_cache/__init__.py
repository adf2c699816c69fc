"""``reshape_and_cache``: write new tokens' keys and values into a paged KV cache, in place.

::

    key_cache, value_cache = reshape_and_cache(key, value, key_cache, value_cache,
                                               slot_mapping, *, layout="vllm",
                                               k_scale=1.0, v_scale=1.0)

* ``key``/``value`` [num_tokens, num_kv_heads, head_dim]; the caches as in
  :mod:`xla_kernels.kernels.paged_attention` (``layout="vllm"`` [num_blocks, block_size,
  num_kv_heads, head_dim] or ``"pallas"`` [num_kv_heads, num_blocks, block_size, head_dim]);
  ``slot_mapping`` int32 [num_tokens], slot = block_id * block_size + offset.
* Token ``t`` is written to slot ``slot_mapping[t]``; a slot below 0 (padding) or at or
  beyond ``num_blocks * block_size`` is skipped, never written out of bounds. Every other
  cache entry keeps its value. bf16, f16 and f32, the caches in the key's dtype.
* fp8 caches (vLLM's ``kv_cache_dtype="fp8"``): both caches ``f8e4m3fn``, key/value bf16,
  f16 or f32; each element is quantized on write: ``x / k_scale`` (``v_scale`` for values)
  computed in f32, rounded to nearest even e4m3, saturated to +-448 (+-inf too); NaN stays
  NaN. The scales are per tensor, finite and > 0 (1.0 for other caches), the ones
  ``paged_attention`` later multiplies back.
* The caches are updated **in place**: in JAX the op returns them, aliased to the operands
  (under ``jax.jit(..., donate_argnums=...)`` nothing is copied; without donation XLA copies
  the caches first); the torch operator mutates them and returns nothing, like vLLM's
  ``reshape_and_cache_flash``.

Kernels: CUDA (``kv_cache.cu``, one CTA per token, 16-byte copies) and CPU
(``kv_cache_cpu.cc``); :func:`reshape_and_cache_xla` is the plain-XLA fallback and
:func:`reshape_and_cache_numpy` the test oracle.

Example:
    >>> import jax, jax.numpy as jnp
    >>> key = jnp.ones((3, 2, 64), jnp.bfloat16)
    >>> cache = jnp.zeros((4, 16, 2, 64), jnp.bfloat16)
    >>> write = jax.jit(reshape_and_cache, donate_argnums=(2, 3))
    >>> kc, vc = write(key, key, cache, cache, jnp.array([0, 17, -1], jnp.int32))  # doctest: +SKIP
"""

from __future__ import annotations

import re

from xla_kernels.attrs import Attr
from xla_kernels.op import CallPlan, Invalid, Kernel, Op, Spec, Tensor, updated

from ..paged_cache import (
    FP8,
    LAYOUTS,
    cache_factors,
    check_kv_scales,
    check_layout,
    fused_cache_dims,
    fused_cache_factors,
)
from .reference import (
    quantize_fp8_xla,
    reshape_and_cache_fused_numpy,
    reshape_and_cache_numpy,
    reshape_and_cache_xla,
)

DTYPES = ("bf16", "f16", "f32")
CACHE_DTYPES = (*DTYPES, FP8)


def _check_value(key: Spec, value: Spec) -> None:
    """The new values must match the new keys: one dtype, one shape."""
    if value.dtype != key.dtype:
        raise Invalid("value", f"dtype {value.dtype} differs from key's {key.dtype}",
                      "cast key, value and the cache to one dtype")
    if value.shape != key.shape:
        raise Invalid("value", f"shape {value.shape} differs from key's {key.shape}",
                      "pass key and value of one shape")


def _output_rule(key: Spec, value: Spec, key_cache: Spec, value_cache: Spec,
                 slot_mapping: Spec, *, layout: str, k_scale: float,
                 v_scale: float) -> list[Spec]:
    check_layout(layout)
    _check_value(key, value)
    if value_cache.dtype != key_cache.dtype:
        raise Invalid("value_cache", f"dtype {value_cache.dtype} differs from key_cache's "
                      f"{key_cache.dtype}", "store both caches in one dtype")
    if key_cache.dtype not in (key.dtype, FP8):
        raise Invalid("key_cache", f"dtype {key_cache.dtype} differs from key's {key.dtype}",
                      f"cast key, value and the caches to one dtype, or use {FP8} caches")
    check_kv_scales(k_scale, v_scale, cache_dtype=key_cache.dtype)
    if value_cache.shape != key_cache.shape:
        raise Invalid("value_cache", f"shape {value_cache.shape} differs from key_cache's "
                      f"{key_cache.shape}", "pass caches of one shape")
    num_tokens, heads, dim = key.shape
    cache_heads, cache_dim = ((key_cache.shape[2] if layout == "vllm" else key_cache.shape[0]),
                              key_cache.shape[3])
    if (cache_heads, cache_dim) != (heads, dim):
        raise Invalid("key_cache", f"shape {key_cache.shape} in layout {layout!r} has "
                      f"{cache_heads} kv heads of size {cache_dim}, key has {heads} of {dim}",
                      "pass a cache for these heads, and check `layout`")
    if slot_mapping.shape != (num_tokens,):
        raise Invalid("slot_mapping", f"expected shape ({num_tokens},), got "
                      f"{slot_mapping.shape}", "pass one slot per token")
    return [updated(key_cache), updated(value_cache)]


def _sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """Along kv heads only: every token's slot may be anywhere in the cache."""
    cache = cache_factors(plan.attrs["layout"])
    return (f"n k d, n k d, {cache}, {cache}, n -> {cache}, {cache}",
            {"need_replication_factors": ("n", "b", "t", "d")})


reshape_and_cache = Op(
    "xla_kernels.reshape_and_cache",
    inputs=[
        Tensor("key", dtypes=DTYPES, rank=3, doc="[num_tokens, num_kv_heads, head_dim]"),
        Tensor("value", dtypes=DTYPES, rank=3, doc="key's shape"),
        Tensor("key_cache", dtypes=CACHE_DTYPES, rank=4, in_place=True,
               doc="paged keys, `layout`"),
        Tensor("value_cache", dtypes=CACHE_DTYPES, rank=4, in_place=True, doc="paged values"),
        Tensor("slot_mapping", dtypes=("i32",), rank=1, doc="[num_tokens] slots"),
    ],
    attrs=[Attr("layout", str, default="vllm", doc='"vllm" or "pallas" cache layout'),
           Attr("k_scale", float, default=1.0, doc="fp8 caches: stored key = key / k_scale"),
           Attr("v_scale", float, default=1.0,
                doc="fp8 caches: stored value = value / v_scale")],
    outputs=_output_rule,
    output_names=("key_cache", "value_cache"),
    sharding_rule=_sharding_rule,
    kernels={"cpu": Kernel(["kv_cache_cpu.cc"], handler="XkReshapeAndCacheCpu"),
             "cuda": Kernel(["kv_cache.cu"], handler="XkReshapeAndCacheCuda")},
    doc=__doc__ or "",
)



def _fused_output_rule(key: Spec, value: Spec, kv_cache: Spec, slot_mapping: Spec, *,
                       k_scale: float, v_scale: float) -> list[Spec]:
    _check_value(key, value)
    if kv_cache.dtype not in (key.dtype, FP8):
        raise Invalid("kv_cache", f"dtype {kv_cache.dtype} differs from key's {key.dtype}",
                      f"cast key, value and the cache to one dtype, or use an {FP8} cache")
    check_kv_scales(k_scale, v_scale, cache_dtype=kv_cache.dtype)
    num_tokens, heads, dim = key.shape
    _, _, cache_heads, cache_dim = fused_cache_dims(kv_cache.shape)
    if (cache_heads, cache_dim) != (heads, dim):
        raise Invalid("kv_cache", f"shape {kv_cache.shape} holds {cache_heads} kv heads of "
                      f"size {cache_dim}, key has {heads} of {dim}",
                      "pass a cache of [num_blocks, block_size, 2 * num_kv_heads, head_dim]")
    if slot_mapping.shape != (num_tokens,):
        raise Invalid("slot_mapping", f"expected shape ({num_tokens},), got "
                      f"{slot_mapping.shape}", "pass one slot per token")
    return [updated(kv_cache)]


def _fused_sharding_rule(plan: CallPlan) -> tuple[str, dict]:
    """Along kv heads; p (the key, value pair) stays whole, so a device holds whole pairs."""
    cache, sizes = fused_cache_factors(plan.inputs[2].shape)
    named = set(re.findall(r"\w+", cache))
    whole = [f for f in ("n", "b", "t", "p", "w", "x", "d") if f == "n" or f in named]
    return f"n k d, n k d, {cache}, n -> {cache}", {**sizes, "need_replication_factors": whole}


reshape_and_cache_fused = Op(
    "xla_kernels.reshape_and_cache_fused",
    inputs=[
        Tensor("key", dtypes=DTYPES, rank=3, doc="[num_tokens, num_kv_heads, head_dim]"),
        Tensor("value", dtypes=DTYPES, rank=3, doc="key's shape"),
        Tensor("kv_cache", dtypes=CACHE_DTYPES, rank=(4, 5), in_place=True,
               doc="[num_blocks, block_size, 2 * num_kv_heads, head_dim]: head h's key at "
                   "2h, its value at 2h + 1"),
        Tensor("slot_mapping", dtypes=("i32",), rank=1, doc="[num_tokens] slots"),
    ],
    attrs=[Attr("k_scale", float, default=1.0, doc="fp8 caches: stored key = key / k_scale"),
           Attr("v_scale", float, default=1.0,
                doc="fp8 caches: stored value = value / v_scale")],
    outputs=_fused_output_rule,
    output_names=("kv_cache",),
    sharding_rule=_fused_sharding_rule,
    kernels={"cpu": Kernel(["kv_cache_cpu.cc"], handler="XkReshapeAndCacheFusedCpu"),
             "cuda": Kernel(["kv_cache.cu"], handler="XkReshapeAndCacheFusedCuda")},
    doc="""``reshape_and_cache_fused(key, value, kv_cache, slot_mapping, *, k_scale=1.0,
v_scale=1.0) -> kv_cache``: :func:`reshape_and_cache` for one fused cache
[num_blocks, block_size, 2 * num_kv_heads, head_dim] (head ``h``'s key at index ``2h`` of
the third axis, its value at ``2h + 1``: tpu-inference's layout), updated in place.

Example:
    >>> import jax, jax.numpy as jnp
    >>> kv = jnp.zeros((4, 16, 4, 64), jnp.bfloat16)               # 2 kv heads
    >>> key = jnp.ones((3, 2, 64), jnp.bfloat16)
    >>> write = jax.jit(reshape_and_cache_fused, donate_argnums=(2,))
    >>> kv = write(key, -key, kv, jnp.array([0, 17, -1], jnp.int32))  # doctest: +SKIP
""",
)

__all__ = ["CACHE_DTYPES", "DTYPES", "FP8", "LAYOUTS", "quantize_fp8_xla", "reshape_and_cache",
           "reshape_and_cache_fused", "reshape_and_cache_fused_numpy", "reshape_and_cache_numpy",
           "reshape_and_cache_xla"]
