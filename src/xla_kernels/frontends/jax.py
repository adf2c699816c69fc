"""The JAX frontend: each :class:`~xla_kernels.op.Op` becomes a JAX primitive.

The primitive's abstract evaluation is the op's shape rule; its lowering, for each
platform that has a kernel, is one typed-FFI ``custom-call`` whose target is the op's
name, and it builds and registers the kernel the first time that platform is lowered.
Lowering for a platform without a kernel raises :class:`PlatformError` naming the op.
``jax.vmap`` follows the op's ``vmap_method``.

Example:
    >>> import jax.numpy as jnp
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> simple_add(jnp.ones(3), jnp.ones(3))            # doctest: +SKIP
    Array([2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax import lax
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from xla_kernels import dtypes
from xla_kernels.errors import PlatformError
from xla_kernels.runtime.registry import ensure_registered

if TYPE_CHECKING:
    from xla_kernels.op import Op

_PLATFORMS_WITH_KERNELS = ("cpu", "cuda")


class FrozenAttrs:
    """Coerced attribute values in a hashable form, as JAX primitive parameters need.

    Example:
        >>> FrozenAttrs({"n": np.int64(2)}) == FrozenAttrs({"n": np.int64(2)})
        True
    """

    def __init__(self, values: Mapping[str, Any]):
        self._items = tuple(sorted(values.items()))
        self._key = tuple((k, _hashable(v)) for k, v in self._items)

    def thaw(self) -> dict[str, Any]:
        """The attribute values, as the op's kernels receive them."""
        return dict(self._items)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FrozenAttrs) and self._key == other._key

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"


def _hashable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return (value.dtype.str, value.item())
    return value


def call(op: Op, arrays: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    """Validate a call of ``op`` on JAX arrays and bind its primitive.

    Returns one array for a single visible output, else a tuple.
    """
    bound = op.bind(arrays, attrs)
    outs = primitive(op).bind(*arrays, attrs=FrozenAttrs(bound.attrs))
    visible = [o for o, spec in zip(outs, bound.outputs, strict=True) if not spec.workspace]
    return visible[0] if len(visible) == 1 else tuple(visible)


# Keyed by the Op object: a re-executed declaration gets a primitive with its own rule.
_primitives: weakref.WeakKeyDictionary[Op, Primitive] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def primitive(op: Op) -> Primitive:
    """The JAX primitive of ``op``, created and registered on first use."""
    with _lock:
        if op not in _primitives:
            _primitives[op] = _make_primitive(op)
        return _primitives[op]


def _make_primitive(op: Op) -> Primitive:
    prim = Primitive(op.name)
    prim.multiple_results = True
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_abstract_eval(functools.partial(_abstract_eval, op))
    for platform in _PLATFORMS_WITH_KERNELS:
        rule = (functools.partial(_lower, op, platform) if platform in op.kernels
                else functools.partial(_no_kernel, op))
        mlir.register_lowering(prim, rule, platform=platform)
    mlir.register_lowering(prim, functools.partial(_no_kernel, op))
    batching.primitive_batchers[prim] = functools.partial(_batch, op, prim)
    return prim


def _abstract_eval(op: Op, *avals: Any, attrs: FrozenAttrs) -> list[jax.core.ShapedArray]:
    bound = op.bind(avals, attrs.thaw(), coerced=True)
    return [jax.core.ShapedArray(o.shape, dtypes.to_numpy(o.dtype)) for o in bound.outputs]


def _lower(op: Op, platform: str, ctx: Any, *operands: Any, attrs: FrozenAttrs) -> Any:
    op.check_platform(platform, op.bind(ctx.avals_in, attrs.thaw(), coerced=True).inputs)
    ensure_registered(op, platform)
    return jax.ffi.ffi_lowering(op.target)(ctx, *operands, **attrs.thaw())


def _no_kernel(op: Op, ctx: Any, *operands: Any, attrs: FrozenAttrs) -> Any:
    platforms = ", ".join(ctx.module_context.platforms)
    raise PlatformError(
        f"{op.name}: no kernel for platform {platforms} (it has kernels for "
        f"{', '.join(sorted(op.kernels))}). Fix: place the computation on a supported "
        "device (e.g. jax.jit(f, device=jax.devices('cpu')[0])), or declare a kernel for "
        "this platform.")


def _batch(op: Op, prim: Primitive, args: Sequence[Any], dims: Sequence[int | None], *,
           attrs: FrozenAttrs) -> tuple[list[Any], list[int]]:
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    moved = [a if d is None else jax.numpy.moveaxis(a, d, 0)
             for a, d in zip(args, dims, strict=True)]
    if op.vmap_method == "sequential":
        batched = [i for i, d in enumerate(dims) if d is not None]

        def one(slices: Sequence[Any]) -> Any:
            full = list(moved)
            for i, s in zip(batched, slices, strict=True):
                full[i] = s
            return prim.bind(*full, attrs=attrs)

        outs = lax.map(one, [moved[i] for i in batched])
    else:
        expand = op.vmap_method == "expand_dims"
        new_args = []
        for a, d in zip(moved, dims, strict=True):
            if d is None:
                a = a[None] if expand else jax.numpy.broadcast_to(a, (size, *a.shape))
            new_args.append(a)
        outs = prim.bind(*new_args, attrs=attrs)
    return list(outs), [0] * len(outs)
