"""One vocabulary of element types for every frontend.

A dtype can be named by a short string (``"f32"``, ``"bf16"``, ``"f8e4m3fn"``), a NumPy
dtype, or a framework dtype (JAX's are NumPy's; torch dtypes are accepted too). Internally every
dtype is a canonical short name; this module converts to NumPy, torch and the
XLA FFI ``DataType`` enum.

Example:
    >>> canonical("float32"), canonical(np.dtype("float16"))
    ('f32', 'f16')
    >>> to_numpy("bf16").name
    'bfloat16'
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

# short name -> (numpy dtype, XLA_FFI_DataType value from xla/ffi/api/c_api.h)
_TABLE: dict[str, tuple[np.dtype, int]] = {
    "bool": (np.dtype(np.bool_), 1),
    "i8": (np.dtype(np.int8), 2),
    "i16": (np.dtype(np.int16), 3),
    "i32": (np.dtype(np.int32), 4),
    "i64": (np.dtype(np.int64), 5),
    "u8": (np.dtype(np.uint8), 6),
    "u16": (np.dtype(np.uint16), 7),
    "u32": (np.dtype(np.uint32), 8),
    "u64": (np.dtype(np.uint64), 9),
    "f16": (np.dtype(np.float16), 10),
    "f32": (np.dtype(np.float32), 11),
    "f64": (np.dtype(np.float64), 12),
    "c64": (np.dtype(np.complex64), 15),
    "bf16": (np.dtype(ml_dtypes.bfloat16), 16),
    "c128": (np.dtype(np.complex128), 18),
    "f8e4m3fn": (np.dtype(ml_dtypes.float8_e4m3fn), 20),
}
_BY_NUMPY = {dt: name for name, (dt, _) in _TABLE.items()}
_ALIASES = {
    "float16": "f16", "half": "f16", "float32": "f32", "float": "f32", "float64": "f64",
    "double": "f64", "bfloat16": "bf16", "int8": "i8", "int16": "i16", "int32": "i32",
    "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool_": "bool", "complex64": "c64", "complex128": "c128", "float8_e4m3fn": "f8e4m3fn",
}

ALL: tuple[str, ...] = tuple(_TABLE)
FLOATING: tuple[str, ...] = ("f16", "bf16", "f32", "f64")


def canonical(dtype: Any) -> str:
    """Return the short name (``"f32"``, ``"bf16"``, ...) of any dtype-like value.

    Accepts short names, NumPy names and dtypes, JAX dtypes and torch dtypes.

    Example:
        >>> canonical("bfloat16")
        'bf16'
    """
    if isinstance(dtype, str):
        key = dtype.removeprefix("torch.")
        if key in _TABLE:
            return key
        if key in _ALIASES:
            return _ALIASES[key]
        raise TypeError(f"unknown dtype {dtype!r}; known: {', '.join(ALL)}")
    if type(dtype).__module__ == "torch":  # torch.dtype, without importing torch
        return canonical(str(dtype))
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}; known: {', '.join(ALL)}") from None
    if np_dtype not in _BY_NUMPY:
        raise TypeError(f"dtype {np_dtype} is not supported; known: {', '.join(ALL)}")
    return _BY_NUMPY[np_dtype]


def to_numpy(dtype: Any) -> np.dtype:
    """NumPy dtype (``ml_dtypes.bfloat16`` for bf16) of a dtype-like value.

    Example:
        >>> to_numpy("f16")
        dtype('float16')
    """
    return _TABLE[canonical(dtype)][0]


def ffi_code(dtype: Any) -> int:
    """The ``XLA_FFI_DataType`` enum value of a dtype-like value.

    Example:
        >>> ffi_code("f32")
        11
    """
    return _TABLE[canonical(dtype)][1]


def to_torch(dtype: Any) -> Any:
    """The ``torch.dtype`` of a dtype-like value (imports torch).

    Example:
        >>> str(to_torch("bf16"))
        'torch.bfloat16'
    """
    import torch

    name = canonical(dtype)
    names = {"bool": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
             "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "f16": "float16",
             "f32": "float32", "f64": "float64", "c64": "complex64", "bf16": "bfloat16",
             "c128": "complex128", "f8e4m3fn": "float8_e4m3fn"}
    return getattr(torch, names[name])
