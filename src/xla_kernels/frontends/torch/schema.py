"""What the torch operator of an op is, derived from the declaration alone: its name, its
schema, and the conversion of attribute values to and from the schema's types.

Nothing here defines anything in torch; :mod:`xla_kernels.frontends.torch.operator` makes
the operator from this.

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

from collections.abc import Mapping
from typing import Any

from xla_kernels.errors import RegistrationError
from xla_kernels.op import Op, Spec

__all__ = ["USER_NAMESPACE", "attrs_for_torch", "attrs_from_torch", "qualified_name", "schema",
           "visible_count"]


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
