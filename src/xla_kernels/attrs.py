"""Typed attributes: the static parameters of an op, passed to kernels by value.

An :class:`Attr` declares a name, a type and an optional default. Its type decides
the C++ type the kernel binds with ``.Attr<T>("name")``:

==================  ===============================  ==========================
declared type       Python value                     C++ type in the handler
==================  ===============================  ==========================
``int``             int                              ``int64_t``
``float``           float                            ``float``
``bool``            bool                             ``bool``
``str``             str                              ``std::string_view``
``list[int]``       sequence of int                  ``ffi::Span<const int64_t>``
``list[float]``     sequence of float                ``ffi::Span<const float>``
``bytes``           bytes                            ``ffi::Span<const uint8_t>``
``np.int32`` etc.   int / float of that NumPy type   ``int32_t``, ``double``, ...
``list[np.int32]``  sequence of that NumPy type      ``ffi::Span<const int32_t>``
``tuple[int, int]`` that many ints                   ``ffi::Span<const int64_t>``
``dict``            dict of str to the values above  ``ffi::Dictionary``
                    (and nested dicts)
==================  ===============================  ==========================

Scalars: bool, i8..i64, u8..u64, f32, f64; arrays (``list[T]``): i8..i64, u8..u64, f32,
f64: what XLA's typed FFI decodes. ``list[bool]``, f16/bf16 and complex types are refused
at declaration with the reason and a replacement (docs/attributes.md).

Each type is a codec in :mod:`xla_kernels.attr_types` (coercion, C++ type, MLIR text,
torch schema type, eager encoding, hashing); a new type is one class there.
``Op(..., extra_attrs=True)`` also passes undeclared keywords, typed by their value.

:meth:`Attr.coerce` turns a user's value into the typed NumPy value that
``jax.ffi.ffi_call``, the eager caller and the torch_xla encoder all consume.

Example:
    >>> Attr("eps", float, default=1e-6).coerce(0.5, op="rms_norm")
    np.float32(0.5)
    >>> Attr("dims", list[int]).coerce((2, 3), op="reshape")
    array([2, 3])
"""

from __future__ import annotations

import dataclasses
from typing import Any

from xla_kernels.attr_types import AttrType, attr_type, attr_type_of_value
from xla_kernels.errors import OpDeclarationError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Marker default of an attribute the caller must always pass."""


@dataclasses.dataclass(frozen=True)
class Attr:
    """A typed, named, static parameter of an op.

    Args:
        name: keyword the caller passes and the kernel binds (a C identifier).
        type: one of the types in the module table.
        default: value used when the caller omits it; omit for a required attribute.
        doc: one line for docs and error messages.

    Example:
        >>> Attr("alpha", float, default=1.0).cpp_type
        'float'
    """

    name: str
    type: Any
    default: Any = REQUIRED
    doc: str = ""
    codec: AttrType = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise OpDeclarationError(None, f"attribute name {self.name!r} is not an identifier")
        object.__setattr__(self, "codec", attr_type(self.type, attr=self.name))
        if self.default is not REQUIRED:
            self.coerce(self.default, op="<declaration>")

    @property
    def required(self) -> bool:
        """True when the caller must pass a value."""
        return self.default is REQUIRED

    @property
    def cpp_type(self) -> str:
        """The C++ type a kernel binds this attribute as."""
        return self.codec.cpp_type

    def coerce(self, value: Any, *, op: str) -> Any:
        """Check ``value`` and return it as the typed NumPy value kernels receive.

        Raises :class:`OpTypeError` for a value of the wrong kind and
        :class:`OpInputError` for one out of the type's range.
        """
        return self.codec.coerce(value, op=op, name=self.name)


def mlir_text(value: Any) -> str:
    """Render a coerced attribute value as MLIR attribute text (for HLO backend_config).

    Example:
        >>> import numpy as np
        >>> mlir_text(np.float32(0.5)), mlir_text(np.array([1, 2]))
        ('5.000000e-01 : f32', 'array<i64: 1, 2>')
    """
    return attr_type_of_value(value).mlir_text(value)


def mlir_dict(values: dict[str, Any], types: dict[str, AttrType] | None = None) -> str:
    """Render coerced attributes as the MLIR dictionary XLA's typed FFI reads.

    ``types`` gives each attribute's codec (an op's declaration); values without one are
    rendered by the codec of their NumPy type.

    Example:
        >>> import numpy as np
        >>> mlir_dict({"n": np.int64(3), "flag": np.bool_(True)})
        '{flag = true, n = 3 : i64}'
    """
    types = types or {}
    parts = [f"{k} = {(types.get(k) or attr_type_of_value(v, name=k)).mlir_text(v)}"
             for k, v in sorted(values.items())]
    return "{" + ", ".join(parts) + "}"
