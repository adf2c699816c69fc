"""The JAX frontend: each :class:`~xla_kernels.op.Op` becomes a JAX primitive.

``op(*arrays, **attrs)`` is :func:`call` (``Op.__call__`` calls it by name; this module
imports :mod:`xla_kernels.op` only for type annotations, so the two form no circle).

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
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
from jax import lax
from jax._src import dispatch, effects, sharding_impls
from jax._src.interpreters.mlir import full_like_aval
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.interpreters.mlir import ir

from xla_kernels import dtypes, platforms
from xla_kernels.errors import GradientError, OpDeclarationError, OpInputError
from xla_kernels.frontends import jax_partitioning as partitioning
from xla_kernels.runtime.registry import ensure_registered

if TYPE_CHECKING:
    from xla_kernels.op import CallPlan, Op


class FrozenAttrs:
    """A call's coerced attributes in a hashable form, as JAX primitive parameters need.

    Example:
        >>> from xla_kernels.kernels.paged_attention import paged_attention
        >>> from xla_kernels.op import Spec
        >>> specs = [Spec((1, 8, 64), "f32"), Spec((4, 16, 2, 64), "f32"),
        ...          Spec((4, 16, 2, 64), "f32"), Spec((1, 4), "i32"), Spec((1,), "i32")]
        >>> plan = paged_attention.bind(specs, {"scale": 0.125})
        >>> FrozenAttrs(plan) == FrozenAttrs(paged_attention.bind(specs, {"scale": 0.125}))
        True
    """

    def __init__(self, plan: CallPlan):
        self._values = plan.attrs
        self._key = plan.hashable_attrs()

    def thaw(self) -> dict[str, Any]:
        """The attribute values, as the op's kernels receive them."""
        return dict(self._values)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FrozenAttrs) and self._key == other._key

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items())) + "}"


class SideEffect(effects.Effect):
    """The effect of an op declared ``has_side_effect=True``: JAX neither merges nor drops
    its calls, and lowers them with ``has_side_effect`` so XLA does not either."""

    def __str__(self) -> str:
        return "xla_kernels side effect"


_SIDE_EFFECT = SideEffect()
effects.lowerable_effects.add_type(SideEffect)
effects.control_flow_allowed_effects.add_type(SideEffect)
effects.custom_derivatives_allowed_effects.add_type(SideEffect)


def call(op: Op, arrays: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    """Validate a call of ``op`` on JAX arrays and bind its primitive.

    Returns one array for a single visible output, else a tuple. An op with a declared
    :class:`~xla_kernels.op.Vjp` is differentiable (``jax.grad``, ``jax.vjp``, and their
    ``jax.vmap``): its backward op computes the gradients.
    """
    plan = op.bind(arrays, attrs)
    _check_committed_devices(op, arrays)
    if op.vjp is not None:
        return differentiable(op)(FrozenAttrs(plan), *arrays)
    return plan.results(primitive(op).bind(*arrays, attrs=FrozenAttrs(plan), raw=False))


def _check_committed_devices(op: Op, arrays: Sequence[Any]) -> None:
    """OpInputError naming the argument when concrete arrays are committed to different
    devices (JAX would refuse them too, naming them ``args[i]`` of a "jitted
    computation"). Traced arrays are JAX's to check: under ``jit`` its error names them."""
    first: tuple[int, Any] | None = None
    for i, a in enumerate(arrays):
        if isinstance(a, jax.core.Tracer) or not getattr(a, "committed", False):
            continue
        devices = a.sharding.device_set
        if first is None:
            first = (i, devices)
        elif devices != first[1]:
            names = [t.name for t in op.inputs]
            raise OpInputError(
                op.name, names[i], f"is committed to {_devices(devices)}, while "
                f"'{names[first[0]]}' is committed to {_devices(first[1])}",
                f"put every input on one device, e.g. jax.device_put({names[i]}, "
                f"{names[first[0]]}.sharding)")


def _devices(devices: Any) -> str:
    return ", ".join(str(d) for d in sorted(devices, key=lambda d: d.id))


def differentiable(op: Op) -> Any:
    """``jax.custom_vjp`` of ``op``'s current declaration: ``f(frozen_attrs, *arrays)``."""
    record = op.record
    with record.lock:
        made = record.jax_differentiable
        if made is None or made.xk_op is not record.op:
            made = record.jax_differentiable = _make_differentiable(record.op)
        return made


def _make_differentiable(op: Op) -> Any:
    vjp = op.vjp

    def forward(attrs: FrozenAttrs, *arrays: Any) -> Any:
        plan = op.bind(arrays, attrs.thaw(), coerced=True)
        return plan.results(primitive(op).bind(*arrays, attrs=attrs, raw=False))

    def forward_saving(attrs: FrozenAttrs, *primals: Any) -> tuple[Any, Any]:
        arrays = tuple(p.value for p in primals)  # symbolic_zeros: CustomVJPPrimal
        # An input differentiated against that the backward returns nothing for would get a
        # zero gradient: refuse it.
        message = vjp.ungraded_input_message(op, [p.perturbed for p in primals])
        if message is not None:
            raise GradientError(message)
        # Through fn, not the bare primitive: a second-order gradient differentiates this
        # function too, and fn's derivative is the declared backward.
        out = fn(attrs, *arrays)
        return out, (arrays, out)

    def backward(attrs: FrozenAttrs, saved: Any, cotangent: Any) -> tuple[Any, ...]:
        arrays, out = saved
        outs = out if isinstance(out, tuple) else (out,)
        cts = _cotangents(op, cotangent if isinstance(cotangent, tuple) else (cotangent,))
        if cts is None:  # no output the backward differentiates is used: zero gradients
            return (None,) * len(arrays)
        args, battrs = vjp.backward_call(op, arrays, outs, cts, attrs.thaw())
        return tuple(vjp.input_grads(op, _run_backward(op, args, battrs)))

    fn = jax.custom_vjp(forward, nondiff_argnums=(0,))
    # Symbolic zeros tell an output the loss does not use (ad.Zero) from one it does: a
    # non-differentiable output may only receive the former.
    fn.defvjp(forward_saving, backward, symbolic_zeros=True)
    fn.xk_op = op  # type: ignore[attr-defined]
    return fn


def _cotangents(op: Op, cts: Sequence[Any]) -> list[Any] | None:
    """The cotangents the backward op takes, symbolic zeros made arrays; None if every one
    of them is a symbolic zero. Raises if a non-differentiable output received one."""
    vjp = op.vjp
    names = tuple(op.output_names or ())
    taken, any_nonzero = [], False
    for name, ct in zip(names, cts, strict=True):
        zero = isinstance(ct, SymbolicZero)
        if not vjp.takes_cotangent(name):
            if not zero and ct.dtype != jax.dtypes.float0:
                raise GradientError(_no_gradient_message(op, name))
            taken.append(None)
            continue
        any_nonzero = any_nonzero or not zero
        taken.append(lax.full(ct.shape, 0, ct.dtype) if zero else ct)
    return taken if any_nonzero else None


def _no_gradient_message(op: Op, output: str) -> str:
    """The message for a cotangent that reached ``output``, which carries no gradient."""
    why = ("nondiff_outputs declares it non-differentiable" if output in
           op.vjp.nondiff_outputs else f"the vjp takes no cotangent 'd{output}'")
    return (f"{op.name}: output {output!r}: a gradient reached it, but it carries none "
            f"({why}). Fix: differentiate a loss that does not depend on {output!r} (use "
            f"jax.lax.stop_gradient({output}) where only its value is needed), or declare "
            f"'d{output}' in the Vjp's args with a backward that takes it.")


def _run_backward(op: Op, args: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    """Call ``op``'s backward op; if that op declares no vjp of its own, differentiating the
    call (a second-order gradient) raises an error that names both ops."""
    backward = op.vjp.backward
    if backward.vjp is not None:
        return backward(*args, **attrs)
    guarded = jax.custom_jvp(lambda *arrays: backward(*arrays, **attrs))

    def no_second_order(primals: Any, tangents: Any) -> Any:
        raise GradientError(op.vjp.second_order_message(op))

    guarded.defjvp(no_second_order)
    return guarded(*args)


def primitive(op: Op) -> Primitive:
    """The JAX primitive of ``op``'s current declaration, created on first use."""
    record = op.record
    with record.lock:
        if record.jax_primitive is None or record.jax_primitive.xk_op is not record.op:
            record.jax_primitive = _make_primitive(record.op)
        return record.jax_primitive


def _make_primitive(op: Op) -> Primitive:
    prim = Primitive(op.name)
    prim.xk_op = op  # type: ignore[attr-defined]
    prim.multiple_results = True
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_effectful_abstract_eval(functools.partial(_abstract_eval, op))
    # Partitioning needs the device assignment while lowering, and a lowering JAX caches as
    # a function does not see it: ops with a sharding rule lower uncached, with devices.
    cacheable = op.sharding_rule is None
    if not cacheable:
        dispatch.prim_requires_devices_during_lowering.add(prim)
    for platform in platforms.PLATFORMS.values():
        rule = (functools.partial(_lower, op, platform.name) if platform.name in op.kernels
                else functools.partial(_no_kernel, op))
        mlir.register_lowering(prim, rule, platform=platform.jax_lowering, cacheable=cacheable)
    mlir.register_lowering(prim, functools.partial(_no_kernel, op))
    batching.primitive_batchers[prim] = functools.partial(_batch, op, prim)
    ad.primitive_jvps[prim] = functools.partial(_no_derivative, op)
    return prim


def _no_derivative(op: Op, primals: Any, tangents: Any, *, attrs: FrozenAttrs, raw: bool
                   ) -> Any:
    raise TypeError(f"{op.name}: cannot be differentiated: the op declares no backward. Fix: "
                    "wrap the call in jax.custom_vjp with your backward, or stop_gradient its "
                    "inputs.")


def _abstract_eval(op: Op, *avals: Any, attrs: FrozenAttrs, raw: bool
                   ) -> tuple[list[jax.core.ShapedArray], set[effects.Effect]]:
    plan = op.bind(avals, attrs.thaw(), coerced=True)
    outs = [jax.core.ShapedArray(o.shape, dtypes.to_numpy(o.dtype)) for o in plan.outputs]
    return outs, ({_SIDE_EFFECT} if op.has_side_effect else set())


def _lower(op: Op, platform: str, ctx: Any, *operands: Any, attrs: FrozenAttrs, raw: bool
           ) -> Any:
    plan = op.bind(ctx.avals_in, attrs.thaw(), coerced=True)
    op.check_platform(platform, plan.inputs)
    if op.sharding_rule is not None and not raw and _spans_devices(ctx):
        return _lower_partitioned(op, plan, ctx, operands, attrs)
    ensure_registered(op, platform)
    config = {k: ir.Attribute.parse(text) for k, text in plan.mlir_attributes().items()}
    return jax.ffi.ffi_lowering(op.target, backend_config=config,
                                has_side_effect=op.has_side_effect,
                                operand_output_aliases=plan.aliases or None)(ctx, *operands)


def _spans_devices(ctx: Any) -> bool:
    """Whether XLA's SPMD partitioner will split this program (Shardy on, several devices,
    not inside a fully manual shard_map)."""
    if not jax.config.jax_use_shardy_partitioner:
        return False
    context = ctx.module_context.axis_context
    if isinstance(context, sharding_impls.ShardingContext):
        return context.num_devices > 1
    if isinstance(context, sharding_impls.SPMDAxisContext):
        return set(context.manual_axes) != set(context.mesh.axis_names)
    return False


def _lower_partitioned(op: Op, plan: CallPlan, ctx: Any, operands: Sequence[Any],
                       attrs: FrozenAttrs) -> Any:
    """The call as a ``custom_partitioning`` whose Shardy rule is the op's: the partitioner
    runs the kernel on each device's shards (no gather) wherever the rule allows."""
    rule = op.sharding_rule(plan) if callable(op.sharding_rule) else op.sharding_rule
    text, options = rule if isinstance(rule, tuple) else (rule, {})
    # Shardy wants special factors in the order the factors first appear in the rule.
    order = {f: i for i, f in enumerate(dict.fromkeys(re.findall(r"[A-Za-z_]\w*", text)))}
    options = {k: tuple(sorted(v, key=lambda f: order.get(f, len(order))))
               if k.endswith("_factors") else v for k, v in options.items()}
    names = op.output_names or [f"output {i}" for i in range(len(plan.visible_outputs))]
    bound = partitioning.bind_rule(
        op.name, text, options, [(s.name or f"input {i}", s.shape)
                                 for i, s in enumerate(plan.inputs)],
        [(n, s.shape) for n, s in zip(names, plan.visible_outputs, strict=False)])
    partitioned = _partitioned(op)
    try:
        visible = mlir.lower_fun(lambda *xs: partitioned(attrs, bound, *xs),
                                 multiple_results=True)(ctx, *operands)
    except ValueError as e:
        raise OpDeclarationError(op.name, f"its sharding rule {text!r} does not fit this call "
                                 f"({e})", "give one term per input and per visible output") from e
    values = iter(visible)
    return [full_like_aval(ctx, 0, ctx.avals_out[i]) if spec.workspace else next(values)
            for i, spec in enumerate(plan.outputs)]


def _partitioned(op: Op) -> Any:
    """``custom_partitioning`` of the op's visible outputs: ``f(attrs, bound_rule, *arrays)``."""
    record = op.record
    with record.lock:
        made = record.jax_partitioned
        if made is not None and made.xk_op is record.op:
            return made

    def visible(attrs: FrozenAttrs, rule: partitioning.BoundRule, *arrays: Any
                ) -> tuple[Any, ...]:
        plan = op.bind(arrays, attrs.thaw(), coerced=True)
        outs = primitive(op).bind(*arrays, attrs=attrs, raw=True)
        return tuple(outs[i] for i in plan.visible_indices)

    def partition(attrs: FrozenAttrs, rule: partitioning.BoundRule, mesh: Any,
                  arg_shapes: Any, result_shape: Any) -> Any:
        results = result_shape if isinstance(result_shape, (tuple, list)) else (result_shape,)
        mesh, out_shardings, in_shardings = partitioning.partition_shardings(
            rule, mesh, arg_shapes, results)
        return mesh, lambda *xs: visible(attrs, rule, *xs), out_shardings, in_shardings

    def sharding_rule(attrs: FrozenAttrs, rule: partitioning.BoundRule, mesh: Any,
                      value_types: Any, result_types: Any) -> tuple[str, dict]:
        return rule.text, dict(rule.options)

    from jax.experimental.custom_partitioning import custom_partitioning

    made = custom_partitioning(visible, static_argnums=(0, 1))
    made.def_partition(partition=partition, sharding_rule=sharding_rule)
    made.xk_op = op  # type: ignore[attr-defined]
    with record.lock:
        record.jax_partitioned = made
    return made


def _no_kernel(op: Op, ctx: Any, *operands: Any, attrs: FrozenAttrs, raw: bool) -> Any:
    raise platforms.no_kernel_error(
        op.name, ", ".join(ctx.module_context.platforms), op.kernels,
        "place the computation on a supported device (e.g. jax.jit(f, "
        "device=jax.devices('cpu')[0])), or declare a kernel for this platform")


def _batch(op: Op, prim: Primitive, args: Sequence[Any], dims: Sequence[int | None], *,
           attrs: FrozenAttrs, raw: bool) -> tuple[list[Any], list[int]]:
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    moved = [a if d is None else jax.numpy.moveaxis(a, d, 0)
             for a, d in zip(args, dims, strict=True)]
    if op.vmap_method == "sequential":
        batched = [i for i, d in enumerate(dims) if d is not None]

        def one(slices: Sequence[Any]) -> Any:
            full = list(moved)
            for i, s in zip(batched, slices, strict=True):
                full[i] = s
            return prim.bind(*full, attrs=attrs, raw=raw)

        outs = lax.map(one, [moved[i] for i in batched])
    else:
        expand = op.vmap_method == "expand_dims"
        new_args = []
        for a, d in zip(moved, dims, strict=True):
            if d is None:
                a = a[None] if expand else jax.numpy.broadcast_to(a, (size, *a.shape))
            new_args.append(a)
        outs = prim.bind(*new_args, attrs=attrs, raw=raw)
    return list(outs), [0] * len(outs)

