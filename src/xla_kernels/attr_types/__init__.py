"""Attribute types as codecs: one class per declared type, everything else derived.

:func:`attr_type` maps a declared type (``float``, ``list[int]``, ``tuple[int, int]``,
``dict``...) to its :class:`AttrType`; :func:`attr_type_of_value` finds the codec of an
already coerced value (NumPy scalar, 1-D array, ``str``, ``dict`` of those), or with
``raw=True`` of a plain Python value (undeclared attributes, dictionary entries).

Example:
    >>> import numpy as np
    >>> attr_type(list[int]).cpp_type
    'ffi::Span<const int64_t>'
    >>> attr_type_of_value(np.float32(1)).mlir_text(np.float32(1))
    '1.000000e+00 : f32'
"""

from __future__ import annotations

from typing import Any

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
from xla_kernels.attr_types.dictionary import DictType, attr_type_of_value
from xla_kernels.attr_types.int_tuple import IntTuple
from xla_kernels.attr_types.numeric import ArrayType, BytesType, ScalarType
from xla_kernels.attr_types.text import StrType

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
