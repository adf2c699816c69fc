"""The paged KV cache, as every cache-reading op sees it: layouts, dimensions, validation.

``layout="vllm"``: [num_blocks, block_size, num_kv_heads, head_dim] (vLLM's
``reshape_and_cache_flash`` layout); ``layout="pallas"``: [num_kv_heads, num_blocks,
block_size, head_dim] (torch_xla / JAX Pallas). Shared by ``paged_attention``,
``ragged_paged_attention`` and ``reshape_and_cache`` and their references.

Example:
    >>> cache_dims((64, 16, 2, 128), "vllm")
    (64, 16, 2, 128)
    >>> cache_dims((2, 64, 16, 128), "pallas")
    (64, 16, 2, 128)
"""

from __future__ import annotations

from collections.abc import Sequence

from xla_kernels.op import Invalid, Spec

LAYOUTS = ("vllm", "pallas")
"""The cache layouts every paged op accepts."""


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


def check_layout(layout: str) -> None:
    """Raise :class:`~xla_kernels.Invalid` for a layout no paged op knows."""
    if layout not in LAYOUTS:
        raise Invalid("layout", f"unknown layout {layout!r}",
                      'use "vllm" ([num_blocks, block_size, num_kv_heads, head_dim]) or '
                      '"pallas" ([num_kv_heads, num_blocks, block_size, head_dim])')


def check_attention_caches(query_arg: str, query: Spec, key_cache: Spec, value_cache: Spec, *,
                           layout: str, head_dims: Sequence[int],
                           block_sizes: Sequence[int]) -> tuple[int, int, int, int]:
    """Validate the caches an attention op reads against its queries ([tokens, q_heads,
    head_dim], named ``query_arg``); returns :func:`cache_dims`. Raises
    :class:`~xla_kernels.Invalid` naming the argument and the fix."""
    check_layout(layout)
    owner = f"the {query_arg}'" + ("" if query_arg.endswith("s") else "s")
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
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
