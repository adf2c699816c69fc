"""What ``help(op)`` and ``inspect.signature(op)`` show for a declared op.

``help()`` of an instance shows its class's docstring unless the instance has a
``__doc__`` of its own, and then prints that text (not a signature): so an op's
``__doc__`` starts with its call signature, then the declaration's ``doc`` and a line per
input, attribute and output. ``__signature__`` gives ``inspect.signature`` (and IDEs) the
inputs as positional parameters and the attributes as keyword-only ones.

Example:
    >>> import xla_kernels as xk
    >>> op = xk.Op("docs.scale_help", inputs=[xk.Tensor("x", ("f32",), rank=1)],
    ...            attrs=[xk.Attr("factor", float, default=2.0, doc="the multiplier")],
    ...            outputs=lambda x, *, factor: xk.like(x),
    ...            kernels={"cpu": xk.Kernel(["scale.cc"], "Scale")}, doc="Scales x.")
    >>> print(op.__doc__)
    docs.scale_help(x, /, *, factor=2.0)
    <BLANKLINE>
    Scales x.
    <BLANKLINE>
    Inputs:
      x: f32, rank 1
    Attributes:
      factor: float = 2.0  the multiplier
    Outputs: computed by the shape rule
    Kernels: cpu
"""

from __future__ import annotations

import inspect
from typing import Any

_POSITIONAL = inspect.Parameter.POSITIONAL_ONLY
_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def signature(op: Any) -> inspect.Signature:
    """The call signature of ``op``: arrays positionally, attributes by keyword."""
    params = [inspect.Parameter(t.name, _POSITIONAL) for t in op.inputs]
    params += [inspect.Parameter(a.name, _KEYWORD,
                                 default=inspect.Parameter.empty if a.required else a.default)
               for a in _public_attrs(op)]
    return inspect.Signature(params)


def docstring(op: Any) -> str:
    """The signature line, the declaration's ``doc``, then inputs, attributes, outputs."""
    lines = [f"{op.name}{signature(op)}", ""]
    if op.doc:
        lines += [inspect.cleandoc(op.doc), ""]
    lines.append("Inputs:")
    lines += [f"  {t.name}: {_tensor(t)}" for t in op.inputs]
    attrs = _public_attrs(op)
    if attrs:
        lines.append("Attributes:")
        lines += [f"  {_attr(a)}" for a in attrs]
    outputs = ", ".join(op.output_names) if op.output_names else "computed by the shape rule"
    lines += [f"Outputs: {outputs}", f"Kernels: {', '.join(sorted(op.kernels))}"]
    return "\n".join(lines)


def _public_attrs(op: Any) -> list[Any]:
    """The attributes a caller passes (not the ones the library adds, e.g. legacy opaque)."""
    hidden = getattr(op, "_implicit_attrs", frozenset())
    return [a for a in op.attrs if a.name not in hidden]


def _tensor(t: Any) -> str:
    parts = [", ".join(t.dtypes)]
    if t.rank is not None:
        parts.append(f"rank {' or '.join(str(r) for r in t.rank)}")
    if t.in_place:
        parts.append("updated in place")
    text = ", ".join(parts)
    return f"{text}  {t.doc}" if t.doc else text


def _attr(a: Any) -> str:
    head = f"{a.name}: {a.codec.python_name}"
    if not a.required:
        head += f" = {a.default!r}"
    return f"{head}  {a.doc}" if a.doc else head
