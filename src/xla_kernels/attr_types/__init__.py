"""Attribute types as codecs: one class per declared type, everything else derived.

:func:`attr_type` maps a declared type (``float``, ``list[int]``, ``tuple[int, int]``,
``dict``...) to its :class:`AttrType`; :func:`attr_type_of_value` finds the codec of an
already coerced value (NumPy scalar, 1-D array, ``str``, ``dict`` of those), or with
``raw=True`` of a plain Python value (undeclared attributes, dictionary entries).

Example:
    >>> attr_type(list[int]).cpp_type
    'ffi::Span<const int64_t>'
    >>> attr_type_of_value(np.float32(1)).mlir_text(np.float32(1))
    '1.000000e+00 : f32'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from xla_kernels.attr_types.base import (
    FFI_ARRAY,
    FFI_DICTIONARY,
    FFI_SCALAR,
    FFI_STRING,
    AttrType,
    AttrTypeRegistry,
    EagerAttr,
    register,
    register_refusal,
)
from xla_kernels.attr_types.dictionary import DictType
from xla_kernels.attr_types.int_tuple import IntTuple
from xla_kernels.attr_types.numeric import ArrayType, BytesType, ScalarType
from xla_kernels.attr_types.text import StrType
from xla_kernels.errors import OpDeclarationError, OpTypeError

__all__ = ["FFI_ARRAY", "FFI_DICTIONARY", "FFI_SCALAR", "FFI_STRING", "ArrayType", "AttrType",
           "BytesType", "DictType", "EagerAttr", "IntTuple", "ScalarType", "StrType",
           "attr_type", "attr_type_of_value", "register", "register_refusal"]


def attr_type(declared: Any, *, attr: str = "<attr>") -> AttrType:
    """The codec of a declared attribute type; OpDeclarationError if none takes it.

    Example:
        >>> attr_type(bytes).torch_schema_type
        'int[]'
    """
    return AttrTypeRegistry.lookup(declared, attr=attr)


def attr_type_of_value(value: Any, *, op: str = "<attrs>", name: str | None = None,
                       raw: bool = False) -> AttrType:
    """The codec of a coerced value: a NumPy scalar, a 1-D NumPy array, a ``str`` or a
    ``dict`` of those.

    With ``raw=True`` also the codec that coerces a plain Python value, as a declaration
    of its type would: ``bool``, ``int`` (int64), ``float`` (f32), ``str``, ``bytes``, a
    list or tuple of ints (int64) or of numbers (f32), a mapping (``dict``).

    Example:
        >>> attr_type_of_value(np.array([1, 2], np.int32)).cpp_type
        'ffi::Span<const int32_t>'
        >>> attr_type_of_value([1, 2.5], raw=True).cpp_type
        'ffi::Span<const float>'
    """
    if isinstance(value, str):
        return StrType()
    if isinstance(value, dict) or (raw and isinstance(value, Mapping)):
        return DictType()
    found = _numeric_codec(value, op=op, name=name)
    if found is None and raw:
        found = _raw_codec(value, op=op, name=name)
    if found is not None:
        return found
    raise OpTypeError(op, name, f"expected a NumPy scalar of an integer, float or bool type, a "
                                f"str, a dict or a 1-D numeric NumPy array, got "
                                f"{type(value).__name__} {value!r}",
                      "coerce it with xla_kernels.Attr(...).coerce(value, op=...)")


def _refused(op: str, name: str | None, what: str, declared: Any) -> OpTypeError | None:
    try:
        attr_type(declared)
    except OpDeclarationError as e:
        problem = str(e).split(": ", 1)[1] if ": " in str(e) else str(e)
        return OpTypeError(op, name, f"{what}: {problem.rstrip('.')}")
    return None


def _numeric_codec(value: Any, *, op: str, name: str | None) -> AttrType | None:
    if isinstance(value, np.generic):
        try:
            return ScalarType(value.dtype)
        except (KeyError, TypeError):
            error = _refused(op, name, f"a {value.dtype.name} value", type(value))
            if error is not None:
                raise error from None
            return None
    if isinstance(value, np.ndarray) and value.ndim == 1:
        try:
            if value.dtype.kind != "b":
                return ArrayType(value.dtype)
        except (KeyError, TypeError):
            pass
        error = _refused(op, name, f"a 1-D {value.dtype.name} array", list[value.dtype.type])
        if error is not None:
            raise error from None
    return None


def _raw_codec(value: Any, *, op: str, name: str | None) -> AttrType | None:
    if isinstance(value, bool):
        return ScalarType(np.dtype(np.bool_))
    if isinstance(value, int):
        return ScalarType(np.dtype(np.int64))
    if isinstance(value, float):
        return ScalarType(np.dtype(np.float32))
    if isinstance(value, (bytes, bytearray)):
        return BytesType()
    if isinstance(value, (list, tuple)):
        if not value:
            raise OpTypeError(op, name, "an empty list has no element type",
                              "pass a typed empty array, e.g. np.array([], np.int64)")
        if all(isinstance(v, (bool, np.bool_)) for v in value):
            raise _refused(op, name, "a list of bools", list[bool]) or OpTypeError(op, name, "")
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in value):
            return ArrayType(np.dtype(np.int64))
        if all(isinstance(v, (int, float, np.integer, np.floating))
               and not isinstance(v, (bool, np.bool_)) for v in value):
            return ArrayType(np.dtype(np.float32))
        raise OpTypeError(op, name, f"a list attribute must hold numbers of one kind, got "
                                    f"{value!r}", "pass a list of ints or of floats")
    if isinstance(value, complex):
        raise _refused(op, name, "a complex value", complex) or OpTypeError(op, name, "")
    return None
