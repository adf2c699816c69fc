"""Attribute types as codecs: one class per declared type, everything else derived.

:func:`attr_type` maps a declared type (``float``, ``list[int]``, ``tuple[int, int]``...) to
its :class:`AttrType`; :func:`attr_type_of_value` finds the codec of an already coerced
value (NumPy scalar, 1-D array, ``str``), for callers that pass raw values.

Example:
    >>> attr_type(list[int]).cpp_type
    'ffi::Span<const int64_t>'
    >>> attr_type_of_value(np.float32(1)).mlir_text(np.float32(1))
    '1.000000e+00 : f32'
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xla_kernels.attr_types.base import (
    FFI_ARRAY,
    FFI_SCALAR,
    FFI_STRING,
    AttrType,
    AttrTypeRegistry,
    EagerAttr,
    register,
)
from xla_kernels.attr_types.int_tuple import IntTuple
from xla_kernels.attr_types.numeric import ArrayType, BytesType, ScalarType
from xla_kernels.attr_types.text import StrType
from xla_kernels.errors import OpTypeError

__all__ = ["FFI_ARRAY", "FFI_SCALAR", "FFI_STRING", "ArrayType", "AttrType", "BytesType",
           "EagerAttr", "IntTuple", "ScalarType", "StrType", "attr_type", "attr_type_of_value",
           "register"]


def attr_type(declared: Any, *, attr: str = "<attr>") -> AttrType:
    """The codec of a declared attribute type; OpDeclarationError if none takes it.

    Example:
        >>> attr_type(bytes).torch_schema_type
        'int[]'
    """
    return AttrTypeRegistry.lookup(declared, attr=attr)


def attr_type_of_value(value: Any, *, op: str = "<attrs>", name: str | None = None) -> AttrType:
    """The codec of a coerced value: a NumPy scalar, a 1-D NumPy array or a ``str``.

    Example:
        >>> attr_type_of_value(np.array([1, 2], np.int32)).cpp_type
        'ffi::Span<const int32_t>'
    """
    if isinstance(value, str):
        return StrType()
    try:
        if isinstance(value, np.generic):
            return ScalarType(value.dtype)
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind != "b":
            return ArrayType(value.dtype)
    except (KeyError, TypeError):
        pass
    raise OpTypeError(op, name, f"expected a NumPy scalar of an integer, float or bool type, a "
                                f"str or a 1-D numeric NumPy array, got {type(value).__name__} "
                                f"{value!r}",
                      "coerce it with xla_kernels.Attr(...).coerce(value, op=...)")

