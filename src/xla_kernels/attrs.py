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
==================  ===============================  ==========================

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
import math
import typing
from typing import Any

import numpy as np

from xla_kernels.errors import OpDeclarationError, OpInputError, OpTypeError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Marker default of an attribute the caller must always pass."""

_SCALARS: dict[Any, np.dtype] = {
    int: np.dtype(np.int64),
    float: np.dtype(np.float32),
    bool: np.dtype(np.bool_),
    **{t: np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                np.uint32, np.uint64, np.float32, np.float64, np.bool_)},
}
_ARRAYS: dict[Any, np.dtype] = {
    list[int]: np.dtype(np.int64),
    list[float]: np.dtype(np.float32),
    bytes: np.dtype(np.uint8),
    list[np.int32]: np.dtype(np.int32),
    list[np.float64]: np.dtype(np.float64),
}
_CPP = {"int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
        "uint64": "uint64_t", "uint32": "uint32_t", "uint16": "uint16_t", "uint8": "uint8_t",
        "float32": "float", "float64": "double", "bool": "bool"}


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) if typing.get_origin(t) is None else repr(t)


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

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise OpDeclarationError(None, f"attribute name {self.name!r} is not an identifier")
        if self.type is not str and self.type not in _SCALARS and self.type not in _ARRAYS:
            raise OpDeclarationError(
                None, f"attribute '{self.name}' has unsupported type {self.type!r}",
                "use int, float, bool, str, list[int], list[float], bytes or a NumPy scalar type")
        if self.default is not REQUIRED:
            self.coerce(self.default, op="<declaration>")

    @property
    def required(self) -> bool:
        """True when the caller must pass a value."""
        return self.default is REQUIRED

    @property
    def cpp_type(self) -> str:
        """The C++ type a kernel binds this attribute as."""
        if self.type is str:
            return "std::string_view"
        if self.type in _SCALARS:
            return _CPP[_SCALARS[self.type].name]
        return f"ffi::Span<const {_CPP[_ARRAYS[self.type].name]}>"

    def coerce(self, value: Any, *, op: str) -> Any:
        """Check ``value`` and return it as the typed NumPy value kernels receive.

        Raises :class:`OpTypeError` for a value of the wrong kind and
        :class:`OpInputError` for one out of the type's range.
        """
        want = _type_name(self.type)
        if hasattr(value, "aval") or type(value).__name__.endswith("Tracer"):
            raise OpTypeError(op, self.name, "attributes are static, but it got a traced value",
                              "pass a Python value: mark it static (jax.jit(..., "
                              "static_argnames=...)) or close over it")
        if self.type is str:
            if not isinstance(value, str):
                raise OpTypeError(op, self.name, f"expected a str, got {type(value).__name__}")
            return value
        if self.type in _SCALARS:
            return self._coerce_scalar(value, _SCALARS[self.type], op, want)
        return self._coerce_array(value, _ARRAYS[self.type], op, want)

    def _coerce_scalar(self, value: Any, dtype: np.dtype, op: str, want: str) -> Any:
        if isinstance(value, (np.ndarray, list, tuple, str, bytes)) or value is None:
            raise OpTypeError(op, self.name,
                              f"expected a {want} scalar, got {type(value).__name__}")
        if dtype.kind == "b":
            if not isinstance(value, (bool, np.bool_)):
                raise OpTypeError(op, self.name, f"expected a bool, got {type(value).__name__}")
            return np.bool_(value)
        if dtype.kind in "iu":
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise OpTypeError(op, self.name, f"expected an integer ({want}), got {value!r}")
            info = np.iinfo(dtype)
            if not info.min <= int(value) <= info.max:
                raise OpInputError(op, self.name, f"{value} does not fit in {dtype.name}")
            return dtype.type(value)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
            raise OpTypeError(op, self.name, f"expected a number ({want}), got {value!r}")
        with np.errstate(over="ignore"):
            cast = dtype.type(value)
        if math.isfinite(float(value)) and not np.isfinite(cast):
            raise OpInputError(op, self.name, f"{value} overflows {dtype.name}")
        return cast

    def _coerce_array(self, value: Any, dtype: np.dtype, op: str, want: str) -> np.ndarray:
        if self.type is bytes:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise OpTypeError(op, self.name, f"expected bytes, got {type(value).__name__}")
            return np.frombuffer(bytes(value), dtype=np.uint8).copy()
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise OpTypeError(op, self.name, f"expected a sequence ({want}), got {value!r}")
        items = list(np.asarray(value).ravel()) if isinstance(value, np.ndarray) else list(value)
        elem = self._coerce_scalar
        return np.array([elem(v, dtype, op, want) for v in items], dtype=dtype)


def mlir_text(value: Any) -> str:
    """Render a coerced attribute value as MLIR attribute text (for HLO backend_config).

    Example:
        >>> mlir_text(np.float32(0.5)), mlir_text(np.array([1, 2]))
        ('5.000000e-01 : f32', 'array<i64: 1, 2>')
    """
    if isinstance(value, str):
        escaped = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else
                          "".join(f"\\{b:02X}" for b in c.encode()) for c in value)
        return f'"{escaped}"'
    arr = np.asarray(value)
    code = {"b": "i1", "i": f"i{arr.dtype.itemsize * 8}", "u": f"ui{arr.dtype.itemsize * 8}",
            "f": f"f{arr.dtype.itemsize * 8}"}[arr.dtype.kind]
    def one(v: Any) -> str:
        if arr.dtype.kind == "b":
            return "true" if v else "false"
        if arr.dtype.kind == "f":
            return f"{float(v):e}" if np.isfinite(v) else repr(float(v))
        return str(int(v))
    if arr.ndim == 0:
        return "true" if arr.dtype.kind == "b" and value else (
            "false" if arr.dtype.kind == "b" else f"{one(arr)} : {code}")
    return f"array<{code}: {', '.join(one(v) for v in arr)}>" if arr.size else f"array<{code}>"


def mlir_dict(values: dict[str, Any]) -> str:
    """Render coerced attributes as the MLIR dictionary XLA's typed FFI reads.

    Example:
        >>> mlir_dict({"n": np.int64(3), "flag": np.bool_(True)})
        '{flag = true, n = 3 : i64}'
    """
    return "{" + ", ".join(f"{k} = {mlir_text(v)}" for k, v in sorted(values.items())) + "}"
