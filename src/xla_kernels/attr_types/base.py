"""What every attribute type must say: the contract of an attribute codec.

An :class:`AttrType` is everything xla-kernels knows about one declared attribute type:
how to check and coerce a user's value, what C++ type the handler binds, how the value is
written in MLIR (the JAX lowering and torch_xla both parse that text), how it is spelled in
a torch schema, how the eager FFI runtime receives it, and how to hash it. Adding a type
is writing one subclass and decorating it with :func:`register`.

Example:
    >>> from xla_kernels.attr_types import attr_type
    >>> t = attr_type(float)
    >>> t.cpp_type, t.torch_schema_type, t.mlir_text(t.coerce(0.5, op="op", name="eps"))
    ('float', 'float', '5.000000e-01 : f32')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from xla_kernels.errors import OpDeclarationError, OpTypeError

# XLA_FFI_AttrType (xla/ffi/api/c_api.h): how the eager runtime tags an attribute.
FFI_ARRAY, FFI_DICTIONARY, FFI_SCALAR, FFI_STRING = 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class EagerAttr:
    """An attribute as the eager FFI runtime reads it (``XkAttr`` in ``eager_ffi.h``).

    Attributes:
        kind: ``FFI_ARRAY``, ``FFI_DICTIONARY``, ``FFI_SCALAR`` or ``FFI_STRING``.
        dtype: ``XLA_FFI_DataType`` of the scalar or the array's elements (0 for strings
            and dictionaries).
        inline_format: ``struct`` format of the 8-byte inline value (``"8s"`` when unused).
        inline: the value packed inline (scalars up to 8 bytes).
        payload: bytes passed by pointer (strings, arrays, wide scalars, a dictionary's
            relocatable block: see ``eager_ffi.h``).
        count: element count of an array, byte length of a string, entry count of a
            dictionary.
    """

    kind: int
    dtype: int
    inline_format: str
    inline: Any
    payload: bytes
    count: int


class AttrType:
    """Base class of attribute codecs; one instance per declared type.

    Subclasses set :attr:`cpp_type`, :attr:`torch_schema_type` and :attr:`python_name`
    and implement :meth:`coerce`, :meth:`mlir_text` and :meth:`eager`; the torch hooks
    have defaults that pass values through.
    """

    cpp_type: str
    """The C++ type a handler binds with ``.Attr<T>("name")``."""
    torch_schema_type: str | None
    """The type in a torch operator schema (``int``, ``float[]``, ...); None when a torch
    schema cannot spell it (then :attr:`torch_refusal` says why and what to do)."""
    torch_refusal: str = ""
    """Why and how to do without, when :attr:`torch_schema_type` is None."""
    python_name: str
    """How messages name the expected Python value."""

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        """Check ``value`` and return the canonical value kernels receive (NumPy typed)."""
        raise NotImplementedError

    def mlir_text(self, value: Any) -> str:
        """The coerced ``value`` as MLIR attribute text (``5.000000e-01 : f32``)."""
        raise NotImplementedError

    def eager(self, value: Any) -> EagerAttr:
        """The coerced ``value`` as the eager FFI runtime reads it."""
        raise NotImplementedError

    def hashable(self, value: Any) -> Any:
        """A hashable stand-in of the coerced ``value`` (JAX primitive parameters)."""
        return value

    def torch_literal(self, value: Any) -> str | None:
        """The schema spelling of a default value, or None if the schema cannot spell it."""
        return None

    def to_torch(self, value: Any) -> Any:
        """A user's (or a coerced) value as the torch schema takes it: Python scalars and
        lists (``bytes`` -> ``list[int]``)."""
        return value.tolist() if hasattr(value, "tolist") else value

    def from_torch(self, value: Any, *, op: str, name: str) -> Any:
        """A torch call's value as :meth:`coerce` takes it."""
        return value

    def probe(self) -> Any:
        """A small valid value, for running a shape rule before any call."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.python_name})"


def reject_traced(value: Any, *, op: str, name: str) -> None:
    """Attributes are static: a JAX tracer in their place gets a message that says so."""
    if hasattr(value, "aval") or type(value).__name__.endswith("Tracer"):
        raise OpTypeError(op, name, "attributes are static, but it got a traced value",
                          "pass a Python value: mark it static (jax.jit(..., "
                          "static_argnames=...)) or close over it")


_Factory = Callable[[Any], "AttrType | None"]
_factories: list[_Factory] = []


def register(factory: _Factory) -> _Factory:
    """Add an attribute type: ``factory(declared) -> AttrType | None`` (None: not mine).

    Used as a decorator on a classmethod-like function or a class with a ``for_declared``
    classmethod. Later registrations are asked first, so a new type can refine an old one.

    Example:
        >>> @register
        ... def _never(declared):
        ...     return None
    """
    target = getattr(factory, "for_declared", factory)
    _factories.insert(0, target)
    return factory


_Refusal = Callable[[Any], "str | None"]
_refusals: list[_Refusal] = []


def register_refusal(explain: _Refusal) -> _Refusal:
    """Add a reason a declared type is not supported: ``explain(declared) -> str | None``.

    The text (problem and fix, as ``"...; Fix: ..."``) replaces the generic "unsupported
    type" message for types that look supported but that XLA's typed FFI cannot carry.

    Example:
        >>> @register_refusal
        ... def _nothing(declared):
        ...     return None
    """
    _refusals.insert(0, explain)
    return explain


class AttrTypeRegistry:
    """Finds the :class:`AttrType` of a declared type (``float``, ``list[int]``, ...)."""

    supported: ClassVar[str] = ("int, float, bool, str, bytes, dict, a NumPy scalar type, "
                                "list[T] of a numeric T, or tuple[int, ...] of fixed length")

    @staticmethod
    def lookup(declared: Any, *, attr: str) -> AttrType:
        for factory in _factories:
            try:
                found = factory(declared)
            except TypeError:
                found = None
            if found is not None:
                return found
        for explain in _refusals:
            reason = explain(declared)
            if reason:
                problem, _, fix = reason.partition("; Fix: ")
                raise OpDeclarationError(None, f"attribute '{attr}' has unsupported type "
                                               f"{declared!r}: {problem}", fix or None)
        raise OpDeclarationError(None, f"attribute '{attr}' has unsupported type {declared!r}",
                                 f"use {AttrTypeRegistry.supported}")
