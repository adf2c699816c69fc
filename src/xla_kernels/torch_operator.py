"""The torch operator of an op: its name, schema, fake kernel and attribute conversion.

One ``torch.ops.<namespace>.<name>`` per op target, derived from the declaration alone and
shared by every torch-facing frontend: the eager CPU/CUDA kernels
(:mod:`xla_kernels.frontends.torch`), torchax and torch_xla each add their implementation
to this operator; none of them defines it or imports another.

Schema rules (``op.name`` ``"my_lib.sub.add"`` becomes ``my_lib_sub::add``; inputs are
``Tensor`` arguments, in order; attributes are keyword-only and typed by their codec,
:mod:`xla_kernels.attr_types`): a declared default becomes the schema default; a required
attribute, or a default the schema language cannot spell (``inf``, ``nan``, an odd string,
an int beyond int64), becomes ``T? name=None``, where ``None`` means "not passed" so that
the library's own error (or the declared default) applies. Visible outputs become the
return: ``Tensor`` or ``(Tensor, Tensor, ...)``; their count comes from the declaration's
``output_names``, else from running the shape rule on probe inputs.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> qualified_name(simple_add), schema(simple_add)
    ('xla_kernels::simple_add', '(Tensor a, Tensor b) -> Tensor')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xla_kernels import dtypes
from xla_kernels.errors import GradientError, OpInputError, RegistrationError
from xla_kernels.op import Op, Spec

if TYPE_CHECKING:
    import torch

__all__ = ["USER_NAMESPACE", "TorchOperator", "attrs_for_torch", "attrs_from_torch", "define",
           "qualified_name", "schema"]


#: The torch namespace of ops whose name has no ``.`` (e.g. ``"rms_norm"``): never
#: ``xla_kernels``, where this package's own ops (``"xla_kernels.rms_norm"``) live.
USER_NAMESPACE = "xk_user"


def qualified_name(op: Op, *, namespace: str | None = None) -> str:
    """``"namespace::name"`` of the torch operator derived from ``op``.

    The namespace is the part of ``op.name`` before the last ``.``, with ``.`` turned
    into ``_`` (:data:`USER_NAMESPACE` when the name has no ``.``), unless ``namespace``
    is given; any other character not allowed in an ASCII identifier becomes ``_``
    (``"my_lib.scale-fwd"`` becomes ``my_lib::scale_fwd``).

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> qualified_name(simple_add, namespace="mine")
        'mine::simple_add'
    """
    head, _, tail = op.name.rpartition(".")
    ns = namespace if namespace is not None else (head or USER_NAMESPACE)
    ns, tail = _identifier(ns.replace(".", "_")), _identifier(tail)
    return f"{ns}::{tail}"


def _identifier(text: str) -> str:
    """``text`` as an identifier torch's schema parser takes (ASCII only)."""
    out = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in text) or "_"
    return f"_{out}" if out[0].isdigit() else out


def schema(op: Op, *, num_outputs: int | None = None) -> str:
    """The torch schema (without the name) derived from ``op``'s declaration.

    Example:
        >>> import xla_kernels as xk
        >>> op = xk.Op("docs.scale", inputs=[xk.Tensor("x", ("f32",))],
        ...            attrs=[xk.Attr("factor", float, default=2.0), xk.Attr("n", int),
        ...                   xk.Attr("dims", list[int], default=(1, 2))],
        ...            outputs=lambda x, **_: (xk.like(x), xk.like(x)),
        ...            kernels={"cpu": xk.Kernel(["scale.cc"], "Scale")})
        >>> schema(op)
        '(Tensor x, *, float factor=2.0, int? n=None, int[] dims=[1, 2]) -> (Tensor, Tensor)'
    """
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    params = [f"Tensor({next(letters)}!) {t.name}" if t.in_place else f"Tensor {t.name}"
              for t in op.inputs]
    if op.attrs or not op.inputs:
        params.append("*")
    if not op.inputs:  # nothing to dispatch on: the caller says where (default: the CPU)
        if any(a.name == "device" for a in op.attrs):
            raise RegistrationError(f"{op.name}: an op without array inputs takes the torch "
                                    "keyword 'device', which its attribute 'device' shadows. "
                                    "Fix: rename the attribute.")
        params.append("Device? device=None")
    for attr in op.attrs:
        kind = attr.codec.torch_schema_type
        if kind is None:
            raise RegistrationError(
                f"{op.name}: argument '{attr.name}': cannot define a torch operator: the "
                f"attribute is declared {attr.codec.python_name} ({attr.codec.cpp_type}) and "
                f"{attr.codec.torch_refusal.partition('; ')[0]}. Fix: "
                f"{attr.codec.torch_refusal.partition('; ')[2]}.")
        literal = None if attr.required else attr.codec.torch_literal(attr.default)
        params.append(f"{kind} {attr.name}={literal}" if literal is not None
                      else f"{kind}? {attr.name}=None")
    visible = visible_count(op) if num_outputs is None else int(num_outputs)
    returns = visible - sum(t.in_place for t in op.inputs)  # torch returns no mutated input
    if returns < 0 or visible < 1:
        raise RegistrationError(f"{op.name}: num_outputs must count every visible output "
                                f"(inputs updated in place too), got {visible}")
    ret = "Tensor" if returns == 1 else "(" + ", ".join(["Tensor"] * returns) + ")"
    return f"({', '.join(params)}) -> {ret}"


def visible_count(op: Op) -> int:
    """How many visible outputs ``op`` has: the schema needs it before any call.

    The declaration's ``output_names`` says it. Without them, the shape rule runs on
    probe inputs (each input's first declared dtype, every input of one shape: rank 0 to
    4, sides 2, 1, 8 or 128, within each input's declared ranks, required attributes set
    to small values) until one is accepted.

    Example:
        >>> from xla_kernels.kernels.paged_attention import paged_attention
        >>> visible_count(paged_attention)
        1
    """
    if op.output_names is not None:
        return len(op.output_names)
    attrs = {a.name: a.codec.probe() for a in op.attrs if a.required}
    first_error: Exception | None = None
    for side in (2, 1, 8, 128):
        for rank in range(5):
            probe = []
            for t in op.inputs:
                r = rank if t.rank is None or rank in t.rank else t.rank[0]
                probe.append(Spec((side,) * r, t.dtypes[0]))
            try:
                plan = op.bind(probe, attrs)
            except Exception as e:  # the rule may reject this probe: try the next one
                first_error = first_error or e
                continue
            return len(plan.visible_outputs)
    raise RegistrationError(
        f"{op.name}: cannot derive the torch schema's return count: the shape rule "
        f"rejected every probe (inputs of one shape, e.g. {first_error}). Fix: declare "
        "output_names=(...) on the Op (one name per visible output), or pass num_outputs= "
        "to torch_op.")


def attrs_for_torch(op: Op, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values as the torch schema takes them (``bytes`` become lists of ints).

    Example:
        >>> import xla_kernels as xk
        >>> op = xk.Op("docs.blob", inputs=[xk.Tensor("x", ("f32",))],
        ...            attrs=[xk.Attr("blob", bytes)], outputs=lambda x, blob: xk.like(x),
        ...            kernels={"cpu": xk.Kernel(["b.cc"], "B")})
        >>> attrs_for_torch(op, {"blob": b"hi"})
        {'blob': [104, 105]}
    """
    types = op.attr_types
    return {k: types[k].to_torch(v) if k in types else v for k, v in attrs.items()}


def attrs_from_torch(op: Op, kwargs: Mapping[str, Any], *, concretize: bool = False
                     ) -> dict[str, Any]:
    """The op's attributes from a torch call's keywords (the inverse of :func:`attrs_for_torch`).

    ``None`` means "not passed" (the op's default applies); byte lists become ``bytes``;
    with ``concretize``, symbolic ints/floats (``torch.compile``) become concrete.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> attrs_from_torch(simple_add, {})
        {}
    """
    types = op.attr_types
    out = {}
    for k, v in kwargs.items():
        if v is None or (k == "device" and not op.inputs):
            continue
        if concretize:
            v = _concrete(v)
        out[k] = types[k].from_torch(v, op=op.name, name=k) if k in types else v
    return out


def _concrete(v: Any) -> Any:
    import torch

    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, torch.SymFloat):
        return float(v)
    if isinstance(v, torch.SymBool):
        return bool(v)
    if isinstance(v, (list, tuple)):
        return [_concrete(x) for x in v]
    return v


@dataclasses.dataclass
class TorchOperator:
    """A defined torch operator: its name, schema and ``OpOverloadPacket``."""

    qualname: str
    schema: str
    packet: Any


def define(op: Op, *, namespace: str | None = None, num_outputs: int | None = None
           ) -> TorchOperator:
    """Define ``op``'s torch operator, its fake kernel and its eager CPU/CUDA kernels, once.

    The eager kernels (:mod:`xla_kernels.frontends.torch`) come with the operator, so it
    runs on CPU and CUDA tensors whichever frontend defined it. The operator follows the
    record's current declaration. A later declaration whose
    schema differs is refused by the record (torch cannot redefine an operator).

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> define(simple_add).qualname
        'xla_kernels::simple_add'
    """
    import torch

    record = op.record
    qualname = qualified_name(op, namespace=namespace)
    with record.lock:
        known = record.torch_operators.get(qualname)
        if known is not None:
            return known
        text = schema(op, num_outputs=num_outputs)
        try:
            torch.library.define(qualname, text, tags=(torch.Tag.pt2_compliant_tag,))
        except RuntimeError as e:
            raise RegistrationError(
                f"{op.name}: cannot define torch operator {qualname}{text}: {e}. Fix: pass "
                f"namespace= to torch_op (another library defines {qualname}).") from None

        def fake_impl(*tensors: torch.Tensor, **kwargs: Any) -> Any:
            return _fake(record.op, tensors, kwargs)

        ns, name = qualname.split("::")
        fake_impl.__name__ = fake_impl.__qualname__ = f"{name}_fake"
        torch.library.register_fake(qualname, fake_impl)
        operator = TorchOperator(qualname, text, getattr(getattr(torch.ops, ns), name))
        if op.has_side_effect:  # torch.compile must neither drop nor reorder its calls
            torch.library._register_effectful_op(operator.packet.default,
                                                 torch.library.EffectType.ORDERED)
        _register_autograd(record, operator)
        if any(t.in_place for t in op.inputs):
            _register_version_bump(op, operator)
        record.torch_operators[qualname] = operator
        record.guard(lambda new: _schema_guard(operator, new))
    from xla_kernels.frontends.torch import install_eager

    install_eager(record, qualname)
    return operator


def _register_autograd(record: Any, operator: TorchOperator) -> None:
    """The operator's Autograd kernel: a gate that goes straight to the backend kernel
    when no input needs a gradient, and otherwise runs the op under an autograd.Function
    whose backward is the op's declared one; without one, a gradient through the op
    raises (never a silent None). An op that updates inputs in place refuses inputs that
    need a gradient (see :func:`_in_place_gradient_error`). Follows the record's current op.

    The gate is C++ where the native torch kernels build (a Python autograd kernel costs
    several microseconds per call, needed or not), Python otherwise.
    """
    import torch

    from xla_kernels.frontends import torch_native

    overload = operator.packet.default
    returns_nothing = operator.schema.endswith("-> ()")

    def differentiable(*tensors: torch.Tensor, **attrs: Any) -> Any:
        op = record.op
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
        return _differentiable_function().apply(record, overload, attrs, *tensors)

    if torch_native.install_autograd(operator.qualname, differentiable):
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


def _register_version_bump(op: Op, operator: TorchOperator) -> None:
    """The operator's ADInplaceOrView kernel: bump the version counter of every input
    the op updates in place, as torch's own in-place ops do, so that autograd refuses a
    backward that needs their old values (a tensor saved for backward, or a view of
    one). C++ where the native torch kernels build, Python otherwise."""
    import torch

    from xla_kernels.frontends import torch_native

    if torch_native.install_version_bump(operator.qualname):
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
    import torch

    class Differentiable(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, record: Any, overload: Any, attrs: dict[str, Any],
                    *tensors: torch.Tensor) -> Any:
            output = overload(*tensors, **attrs)  # grad mode is off: the gate's fast path
            outputs = output if isinstance(output, tuple) else (output,)
            ctx.record, ctx.attrs, ctx.num_inputs = record, attrs, len(tensors)
            ctx.namespace = overload.namespace
            ctx.save_for_backward(*tensors, *outputs)
            ctx.mark_non_differentiable(*_non_differentiable(record.op, outputs))
            return output

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            saved = ctx.saved_tensors
            inputs, outputs = saved[:ctx.num_inputs], saved[ctx.num_inputs:]
            return (None, None, None, *_backward(ctx.record.op, inputs, ctx.attrs, outputs,
                                                 grads, namespace=ctx.namespace))

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
              grads: tuple, *, namespace: str) -> tuple:
    """The input gradients of one call, from the op's declared backward, whose torch
    operator lives in the forward's ``namespace`` (the one ``torch_op`` was given)."""
    if op.vjp is None:
        raise RuntimeError(f"{op.name}: cannot be differentiated: the op declares no "
                           "backward. Fix: declare vjp=xk.Vjp(...) on the op, compute the "
                           "gradient another way, or detach() the inputs.")
    import torch

    # Every attribute, defaults filled in, as the forward kernel saw them.
    attrs = op.bind(inputs, attrs_from_torch(op, torch_attrs)).attrs
    args, backward_attrs = op.vjp.backward_call(op, inputs, outputs, grads, attrs)
    backward = op.vjp.backward
    packet = define(backward, namespace=namespace).packet
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
    import torch

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


def _schema_guard(operator: TorchOperator, new: Op) -> str | None:
    try:
        text = schema(new)
    except RegistrationError:  # no probe fits the new rule: keep the operator's return count
        returns = operator.schema.rpartition(" -> ")[2]
        text = schema(new, num_outputs=1 if returns == "Tensor" else returns.count("Tensor"))
    if text != operator.schema:
        return (f"its torch operator {operator.qualname} is defined with schema "
                f"{operator.schema}, while this declaration needs {text} (torch cannot "
                "redefine an operator)")
    return None


def _fake(op: Op, tensors: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> Any:
    import torch

    plan = op.bind(tensors, attrs_from_torch(op, kwargs, concretize=True))
    device = tensors[0].device if tensors else torch.device(kwargs.get("device") or "cpu")
    outs = [torch.empty(s.shape, dtype=dtypes.to_torch(s.dtype), device=device)
            for s in plan.outputs]
    return plan.results(outs, with_updated=False)
