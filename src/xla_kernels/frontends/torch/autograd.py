"""The Autograd and ADInplaceOrView kernels of an op's torch operator.

The Autograd kernel is a gate: when no input needs a gradient the call goes straight to the
backend kernel; otherwise the op runs under an ``autograd.Function`` whose backward calls
the torch operator of the op's declared backward op (``Vjp``); without one, a gradient
through the op raises, naming it. Ops that update inputs in place bump their version
counters (ADInplaceOrView) and refuse inputs that need a gradient. The gate and the bump
are C++ (:mod:`.native`) where the native kernels build, Python otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from xla_kernels.errors import GradientError, OpInputError
from xla_kernels.frontends.torch import native
from xla_kernels.frontends.torch.devices import check_devices
from xla_kernels.frontends.torch.schema import attrs_for_torch, attrs_from_torch

if TYPE_CHECKING:
    from xla_kernels.frontends.torch.operator import TorchOperator
    from xla_kernels.op import Op
    from xla_kernels.record import OpRecord

__all__ = ["OperatorOf", "install_autograd", "install_version_bump"]

OperatorOf = Callable[["Op", str], "TorchOperator"]
"""``operator_of(op, namespace)``: the torch operator of ``op`` (defined once)."""


def install_autograd(record: OpRecord, operator: TorchOperator,
                     operator_of: OperatorOf) -> None:
    """The operator's Autograd kernel: a gate that goes straight to the backend kernel
    when no input needs a gradient, and otherwise runs the op under an autograd.Function
    whose backward is the op's declared one; without one, a gradient through the op
    raises (never a silent None). An op that updates inputs in place refuses inputs that
    need a gradient (see :func:`_in_place_gradient_error`). Follows the record's current op.

    The gate is C++ where the native torch kernels build (a Python autograd kernel costs
    several microseconds per call, needed or not), Python otherwise. ``operator_of`` makes
    (once) the torch operator of the backward op: :func:`.operator.define`, which calls
    this function, passes itself (imported, the two modules would form a circle).
    """
    overload = operator.packet.default
    returns_nothing = operator.schema.endswith("-> ()")

    def differentiable(*tensors: torch.Tensor, **attrs: Any) -> Any:
        op = record.op
        if tensors:  # before anything is recorded for backward
            check_devices(op, tensors)
        if any(t.in_place for t in op.inputs):
            raise _in_place_gradient_error(op, tensors)
        if returns_nothing:  # nothing to differentiate
            with torch.no_grad():
                return overload(*tensors, **attrs)
        if op.vjp is not None:  # a missing input gradient would be dropped from the sum
            message = op.vjp.ungraded_input_message(
                op, [isinstance(t, torch.Tensor) and t.requires_grad for t in tensors])
            if message is not None:
                raise GradientError(message)
        return _differentiable_function().apply(record, overload, attrs, operator_of,
                                                *tensors)

    if native.install_autograd(operator.qualname, differentiable):
        return

    def gate(keys: Any, *tensors: torch.Tensor, **attrs: Any) -> Any:
        if torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
            return differentiable(*tensors, **attrs)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keys & torch._C._after_autograd_keyset, *tensors,
                                       **attrs)

    namespace, name = operator.qualname.split("::")
    library = torch.library.Library(namespace, "IMPL")
    library.impl(name, gate, "Autograd", with_keyset=True)
    _libraries.append(library)


def _in_place_gradient_error(op: Op, tensors: tuple) -> OpInputError:
    """Why ``op``, which updates inputs in place, cannot run on ``tensors`` with grad mode
    on: one of them requires grad. An autograd.Function cannot record an update of its
    inputs (torch would keep differentiating the old values) and the update carries no
    gradient from the other inputs into the updated ones: either way a later backward
    would be silently wrong."""
    updated = [t.name for t in op.inputs if t.in_place]
    names = " and ".join(f"'{n}'" for n in updated)
    for spec, tensor in zip(op.inputs, tensors, strict=False):
        if not getattr(tensor, "requires_grad", False):
            continue
        if spec.in_place:
            return OpInputError(op.name, spec.name, "requires grad and is updated in place, "
                                "which autograd cannot record", "update it under "
                                f"torch.no_grad(), or pass {spec.name}.detach()")
        return OpInputError(op.name, spec.name, f"requires grad, but the op updates {names} "
                            "in place, which autograd cannot differentiate",
                            f"pass {spec.name}.detach(), or call the op under torch.no_grad()")
    return OpInputError(op.name, None, "an input requires grad, but the op updates "
                        f"{names} in place, which autograd cannot differentiate",
                        "call the op under torch.no_grad()")


def install_version_bump(op: Op, operator: TorchOperator) -> None:
    """The operator's ADInplaceOrView kernel: bump the version counter of every input
    the op updates in place, as torch's own in-place ops do, so that autograd refuses a
    backward that needs their old values (a tensor saved for backward, or a view of
    one). C++ where the native torch kernels build, Python otherwise."""
    if native.install_version_bump(operator.qualname):
        return
    overload = operator.packet.default
    updated = [i for i, t in enumerate(op.inputs) if t.in_place]

    def bump(keys: Any, *tensors: torch.Tensor, **attrs: Any) -> Any:
        torch.autograd.graph.increment_version([tensors[i] for i in updated])
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return overload.redispatch(keys & torch._C._after_ADInplaceOrView_keyset,
                                       *tensors, **attrs)

    namespace, name = operator.qualname.split("::")
    library = torch.library.Library(namespace, "IMPL")
    library.impl(name, bump, "ADInplaceOrView", with_keyset=True)
    _libraries.append(library)


_libraries: list[Any] = []  # torch.library.Library objects must stay alive
_function: Any = None


def _differentiable_function() -> Any:
    """The autograd.Function that records one call of an op for backward (built once,
    on first use, so that importing this module does not import torch)."""
    global _function
    if _function is not None:
        return _function

    class Differentiable(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, record: Any, overload: Any, attrs: dict[str, Any],
                    operator_of: OperatorOf, *tensors: torch.Tensor) -> Any:
            output = overload(*tensors, **attrs)  # grad mode is off: the gate's fast path
            outputs = output if isinstance(output, tuple) else (output,)
            ctx.record, ctx.attrs, ctx.num_inputs = record, attrs, len(tensors)
            ctx.operator_of = operator_of
            ctx.namespace = overload.namespace
            ctx.save_for_backward(*tensors, *outputs)
            ctx.mark_non_differentiable(*_non_differentiable(record.op, outputs))
            return output

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            saved = ctx.saved_tensors
            inputs, outputs = saved[:ctx.num_inputs], saved[ctx.num_inputs:]
            return (None, None, None, None,
                    *_backward(ctx.record.op, inputs, ctx.attrs, outputs, grads,
                               namespace=ctx.namespace, operator_of=ctx.operator_of))

    _function = Differentiable
    return _function


def _non_differentiable(op: Op, outputs: tuple) -> list:
    """The outputs that carry no gradient: integer ones, and those whose cotangent the
    op's vjp does not take (a loss on them alone then has nothing to differentiate)."""
    vjp = op.vjp
    names = op.output_names if vjp is not None and op.output_names else (None,) * len(outputs)
    return [o for o, name in zip(outputs, names, strict=True)
            if not (o.is_floating_point() or o.is_complex())
            or (name is not None and not vjp.takes_cotangent(name))]


def _backward(op: Op, inputs: tuple, torch_attrs: dict[str, Any], outputs: tuple,
              grads: tuple, *, namespace: str, operator_of: OperatorOf) -> tuple:
    """The input gradients of one call, from the op's declared backward, whose torch
    operator lives in the forward's ``namespace`` (the one ``torch_op`` was given)."""
    if op.vjp is None:
        raise RuntimeError(f"{op.name}: cannot be differentiated: the op declares no "
                           "backward. Fix: declare vjp=xk.Vjp(...) on the op, compute the "
                           "gradient another way, or detach() the inputs.")
    # Every attribute, defaults filled in, as the forward kernel saw them.
    attrs = op.bind(inputs, attrs_from_torch(op, torch_attrs)).attrs
    args, backward_attrs = op.vjp.backward_call(op, inputs, outputs, grads, attrs)
    backward = op.vjp.backward
    packet = operator_of(backward, namespace).packet
    torch_backward_attrs = attrs_for_torch(backward, backward_attrs)
    if backward.vjp is not None or not torch.is_grad_enabled():
        return tuple(op.vjp.input_grads(op, packet(*args, **torch_backward_attrs)))
    # create_graph=True, and the backward op has no backward: run it outside autograd, and
    # let a second-order gradient through it raise, naming both ops.
    with torch.no_grad():
        result = packet(*args, **torch_backward_attrs)
    results = result if isinstance(result, tuple) else (result,)
    guarded = _second_order_guard().apply(op.vjp.second_order_message(op), len(results),
                                          *results, *args)
    return tuple(op.vjp.input_grads(op, guarded))


_guard: Any = None


def _second_order_guard() -> Any:
    """An autograd.Function that returns its first ``count`` tensors and whose backward
    raises ``message``: it stands for a backward op that declares no vjp."""
    global _guard
    if _guard is not None:
        return _guard

    class SecondOrderUnavailable(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, message: str, count: int, *tensors: torch.Tensor) -> Any:
            ctx.message = message
            return tuple(t.view_as(t) for t in tensors[:count])

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            raise GradientError(ctx.message)

    _guard = SecondOrderUnavailable
    return _guard
