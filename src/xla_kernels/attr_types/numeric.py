"""Numeric attributes: scalars (``int``, ``float``, ``bool``, NumPy types), arrays, bytes.

Example:
    >>> ScalarType(np.dtype(np.int32)).cpp_type, ArrayType(np.dtype(np.float64)).cpp_type
    ('int32_t', 'ffi::Span<const double>')
"""

from __future__ import annotations

import math
import typing
from typing import Any

import numpy as np

from xla_kernels import dtypes
from xla_kernels.attr_types.base import (
    FFI_ARRAY,
    FFI_SCALAR,
    AttrType,
    EagerAttr,
    register,
    register_refusal,
    reject_traced,
)
from xla_kernels.errors import OpInputError, OpTypeError

# The scalar element types the typed FFI decodes (xla/ffi/api/api.h).
_ELEMENTS = ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64")
_CPP = {"bool": "bool", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
        "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t",
        "f32": "float", "f64": "double"}
_INLINE = {"bool": "?7x", "i8": "b7x", "i16": "h6x", "i32": "i4x", "i64": "q", "u8": "B7x",
           "u16": "H6x", "u32": "I4x", "u64": "Q", "f32": "f4x", "f64": "d"}
_INT64 = np.iinfo(np.int64)


def _element_dtype(declared: Any) -> np.dtype | None:
    """The NumPy dtype a declared scalar type stands for (``int`` is int64, ``float`` f32)."""
    if declared is int:
        return np.dtype(np.int64)
    if declared is float:
        return np.dtype(np.float32)
    if declared is bool:
        return np.dtype(np.bool_)
    if isinstance(declared, type) and issubclass(declared, np.generic):
        dt = np.dtype(declared)
        try:
            return dt if dtypes.canonical(dt) in _ELEMENTS else None
        except TypeError:
            return None
    return None


def _mlir_code(dt: np.dtype) -> str:
    return {"b": "i1", "i": f"i{dt.itemsize * 8}", "u": f"ui{dt.itemsize * 8}",
            "f": f"f{dt.itemsize * 8}"}[dt.kind]


def _mlir_number(dt: np.dtype, v: Any) -> str:
    if dt.kind == "b":
        return "true" if v else "false"
    if dt.kind == "f":
        typed = dt.type(v)
        if not np.isfinite(typed):  # MLIR spells inf and nan by their bit pattern
            return f"0x{int(np.asarray(typed).view(f'u{dt.itemsize}')):0{dt.itemsize * 2}X}"
        short = f"{float(typed):e}"
        # The short form unless it would round: the kernel must get exactly this value.
        return short if dt.type(short) == typed else np.format_float_scientific(typed, unique=True)
    return str(int(v))


def coerce_number(value: Any, dt: np.dtype, *, op: str, name: str, want: str) -> Any:
    """One number checked against ``dt``: kind, integer range, float overflow."""
    if isinstance(value, (np.ndarray, list, tuple, str, bytes)) or value is None:
        raise OpTypeError(op, name, f"expected a {want} scalar, got {type(value).__name__}")
    if dt.kind == "b":
        if not isinstance(value, (bool, np.bool_)):
            raise OpTypeError(op, name, f"expected a bool, got {type(value).__name__}")
        return np.bool_(value)
    if dt.kind in "iu":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise OpTypeError(op, name, f"expected an integer ({want}), got {value!r}")
        info = np.iinfo(dt)
        if not info.min <= int(value) <= info.max:
            raise OpInputError(op, name, f"{value} does not fit in {dt.name}")
        return dt.type(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise OpTypeError(op, name, f"expected a number ({want}), got {value!r}")
    with np.errstate(over="ignore"):
        cast = dt.type(value)
    if math.isfinite(float(value)) and not np.isfinite(cast):
        raise OpInputError(op, name, f"{value} overflows {dt.name}")
    return cast


def _schema_kind(dt: np.dtype) -> str:
    return "bool" if dt.kind == "b" else ("float" if dt.kind == "f" else "int")


def _schema_number(kind: str, v: Any) -> str | None:
    if kind == "bool":
        return "True" if v else "False"
    if kind == "int":
        return str(int(v)) if _INT64.min <= int(v) <= _INT64.max else None
    return repr(float(v)) if math.isfinite(float(v)) else None


@register
class ScalarType(AttrType):
    """``int`` (int64), ``float`` (f32), ``bool`` and NumPy scalar types, by value.

    Example:
        >>> ScalarType(np.dtype(np.float64)).mlir_text(np.float64(2))
        '2.000000e+00 : f64'
    """

    def __init__(self, dt: np.dtype, python_name: str | None = None):
        self.dtype = dt
        short = dtypes.canonical(dt)
        self.cpp_type = _CPP[short]
        self.torch_schema_type = _schema_kind(dt)
        self.python_name = python_name or dt.name
        self._code = dtypes.ffi_code(short)
        self._inline = _INLINE[short]

    @classmethod
    def for_declared(cls, declared: Any) -> ScalarType | None:
        dt = _element_dtype(declared)
        return None if dt is None else cls(dt, getattr(declared, "__name__", None))

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        reject_traced(value, op=op, name=name)
        return coerce_number(value, self.dtype, op=op, name=name, want=self.python_name)

    def mlir_text(self, value: Any) -> str:
        if self.dtype.kind == "b":
            return _mlir_number(self.dtype, value)
        return f"{_mlir_number(self.dtype, value)} : {_mlir_code(self.dtype)}"

    def eager(self, value: Any) -> EagerAttr:
        return EagerAttr(FFI_SCALAR, self._code, self._inline, value, b"", 0)

    def hashable(self, value: Any) -> Any:
        return (self.dtype.str, value.item())

    def torch_literal(self, value: Any) -> str | None:
        return _schema_number(self.torch_schema_type, value)

    def probe(self) -> Any:
        return {"bool": False, "int": 1, "float": 1.0}[self.torch_schema_type]


@register
class ArrayType(AttrType):
    """``list[T]`` of a numeric ``T`` (``list[int]`` is int64, ``list[float]`` f32).

    Example:
        >>> t = ArrayType(np.dtype(np.int64))
        >>> t.mlir_text(t.coerce((2, 3), op="op", name="dims"))
        'array<i64: 2, 3>'
    """

    def __init__(self, dt: np.dtype, python_name: str | None = None):
        self.element = ScalarType(dt)
        self.dtype = dt
        self.cpp_type = f"ffi::Span<const {self.element.cpp_type}>"
        self.torch_schema_type = f"{self.element.torch_schema_type}[]"
        self.python_name = python_name or f"list[{dt.name}]"

    @classmethod
    def for_declared(cls, declared: Any) -> ArrayType | None:
        if typing.get_origin(declared) is not list:
            return None
        (element,) = typing.get_args(declared)
        dt = _element_dtype(element)
        return None if dt is None or dt.kind == "b" else cls(dt, repr(declared))

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        reject_traced(value, op=op, name=name)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise OpTypeError(op, name, f"expected a sequence ({self.python_name}), "
                                        f"got {value!r}")
        items = list(np.asarray(value).ravel()) if isinstance(value, np.ndarray) else list(value)
        return np.array([coerce_number(v, self.dtype, op=op, name=name, want=self.python_name)
                         for v in items], dtype=self.dtype)

    def mlir_text(self, value: Any) -> str:
        code = _mlir_code(self.dtype)
        if self.dtype.kind == "u":  # MLIR's dense arrays are signless: unsigned need tensors
            items = ", ".join(_mlir_number(self.dtype, v) for v in value)
            return f"dense<{'[' + items + ']' if len(value) else ''}> : tensor<{len(value)}x{code}>"
        if not len(value):
            return f"array<{code}>"
        return f"array<{code}: {', '.join(_mlir_number(self.dtype, v) for v in value)}>"

    def eager(self, value: Any) -> EagerAttr:
        return EagerAttr(FFI_ARRAY, self.element._code, "8s", b"", value.tobytes(), value.size)

    def hashable(self, value: Any) -> Any:
        return (value.dtype.str, value.shape, value.tobytes())

    def torch_literal(self, value: Any) -> str | None:
        kind = self.element.torch_schema_type
        items = [_schema_number(kind, v) for v in np.asarray(value).ravel().tolist()]
        return None if None in items else "[" + ", ".join(items) + "]"  # type: ignore[arg-type]

    def probe(self) -> Any:
        return [self.element.probe()]


@register
class BytesType(ArrayType):
    """``bytes``: a ``Span<const uint8_t>``; torch carries it as ``int[]`` (one per byte).

    Example:
        >>> t = BytesType()
        >>> t.to_torch(b"hi"), t.from_torch([104, 105], op="op", name="raw")
        ([104, 105], b'hi')
    """

    def __init__(self) -> None:
        super().__init__(np.dtype(np.uint8), "bytes")
        self.torch_schema_type = "int[]"

    @classmethod
    def for_declared(cls, declared: Any) -> BytesType | None:
        return cls() if declared is bytes else None

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        reject_traced(value, op=op, name=name)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise OpTypeError(op, name, f"expected bytes, got {type(value).__name__}")
        return np.frombuffer(bytes(value), dtype=np.uint8).copy()

    def torch_literal(self, value: Any) -> str | None:
        return "[" + ", ".join(str(b) for b in bytes(value)) + "]"

    def to_torch(self, value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return list(bytes(value))
        return super().to_torch(value)

    def from_torch(self, value: Any, *, op: str, name: str) -> Any:
        if isinstance(value, (bytes, bytearray)):
            return value
        try:
            return bytes(value)
        except (TypeError, ValueError) as e:
            raise OpInputError(op, name, f"expected bytes (a list of ints 0..255), got "
                                         f"{value!r}: {e}") from None

    def probe(self) -> Any:
        return b""


def _short_name(declared: Any) -> str | None:
    """The dtype short name of a declared scalar type (``"f16"``, ``"c64"``...), or None."""
    if declared is complex:
        return "c128"
    if not isinstance(declared, type) or declared in (int, float, bool):
        return None
    try:
        dt = np.dtype(declared)
    except TypeError:
        return None
    if dt.kind == "c":
        return f"c{dt.itemsize * 8}"
    try:
        return dtypes.canonical(dt)
    except TypeError:
        return None


@register_refusal
def _not_decodable(declared: Any) -> str | None:
    """Why XLA's typed FFI (jaxlib 0.10, ``xla/ffi/api/api.h`` and ``ffi.h``) cannot take
    a type that looks numeric: it decodes scalars of bool, i8..i64, u8..u64, f32, f64 and
    complex, and arrays (``ffi::Span<const T>``) of i8..i64, u8..u64, f32 and f64 only."""
    is_list = typing.get_origin(declared) is list and len(typing.get_args(declared)) == 1
    element = typing.get_args(declared)[0] if is_list else declared
    if is_list and element in (bool, np.bool_):
        return ("XLA's typed FFI decodes no bool arrays (there is no ffi::Span<const bool> "
                "attribute decoding); Fix: declare list[np.uint8] holding 0 and 1 and bind "
                "ffi::Span<const uint8_t>")
    short = _short_name(element)
    if short is None:
        return None
    if short in ("f16", "bf16"):
        return (f"XLA's typed FFI decodes no {short} attributes (scalars or arrays); Fix: "
                f"declare {'list[float]' if is_list else 'float'} (f32) and convert in the "
                "kernel")
    if short in ("c64", "c128"):
        part, cpp = ("np.float32", "float") if short == "c64" else ("np.float64", "double")
        return ("the typed FFI decodes std::complex scalars, but XLA cannot carry a complex "
                "attribute from the JAX lowering to the handler (its backend_config parser "
                "has no complex attribute) and decodes no complex arrays; Fix: declare the "
                f"real and imaginary parts as two {part} attributes (or a list[{part}]) and "
                f"build the std::complex<{cpp}> in the handler")
    return None
