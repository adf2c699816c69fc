"""``dict`` attributes: an ``ffi::Dictionary`` in the handler, nested dictionaries too.

A declared ``dict`` (or ``dict[str, Any]``) takes a Python mapping whose keys are
identifiers and whose values are what :func:`~xla_kernels.attr_types.attr_type_of_value`
knows: ``bool``, ``int`` (int64), ``float`` (f32, as a declared ``float``), ``str``,
``bytes``, NumPy scalars, lists of numbers and 1-D NumPy arrays, and nested mappings. The
handler binds ``.Attr<ffi::Dictionary>("name")`` and reads entries with
``dict.get<T>("key")``, where ``T`` is the entry's C++ type (``int64_t``, ``float``,
``std::string_view``, ``ffi::Span<const int64_t>``, ``ffi::Dictionary``...).

A torch schema cannot spell a dictionary of mixed values, so an op with a ``dict``
attribute has no torch operator (``torch_op`` says so); JAX, the torch_xla lowering text
and the eager runtime carry it.

Example:
    >>> t = DictType()
    >>> opts = t.coerce({"tag": "x", "n": 3, "inner": {"k": 1.5}}, op="op", name="opts")
    >>> t.mlir_text(opts)
    '{inner = {k = 1.500000e+00 : f32}, n = 3 : i64, tag = "x"}'
"""

from __future__ import annotations

import re
import struct
import typing
from collections.abc import Mapping
from typing import Any

from xla_kernels.attr_types.base import (
    FFI_DICTIONARY,
    AttrType,
    EagerAttr,
    register,
    reject_traced,
)
from xla_kernels.errors import OpTypeError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENTRY = struct.Struct("@PqiiPq8s")  # one XkAttr of a dictionary block (eager_ffi.h)
_HEAD = struct.Struct("@PqiiPq")


def _pad(n: int) -> int:
    return -n % 8


def encode_block(entries: list[tuple[str, EagerAttr]]) -> bytes:
    """The relocatable block of a dictionary (``eager_ffi.h``): entries sorted by name,
    their names and payloads after them, every pointer an offset from the block start.

    Example:
        >>> from xla_kernels.attr_types import attr_type_of_value
        >>> import numpy as np
        >>> len(encode_block([("n", attr_type_of_value(np.int64(3)).eager(np.int64(3)))]))
        56
    """
    entries = sorted(entries, key=lambda item: item[0].encode())
    at = _ENTRY.size * len(entries)
    packed, tail = [], []
    for name, e in entries:
        raw = name.encode()
        name_at, at = at, at + len(raw) + _pad(len(raw))
        tail += (raw, bytes(_pad(len(raw))))
        data_at = 0
        if e.payload:
            data_at, at = at, at + len(e.payload) + _pad(len(e.payload))
            tail += (e.payload, bytes(_pad(len(e.payload))))
        head = _HEAD.pack(name_at, len(raw), e.kind, e.dtype, data_at, e.count)
        packed.append(head + struct.pack("@" + e.inline_format, e.inline))
    return b"".join(packed) + b"".join(tail)


@register
class DictType(AttrType):
    """A mapping of identifiers to attribute values, nested mappings included."""

    cpp_type = "ffi::Dictionary"
    torch_schema_type = None
    torch_refusal = ("a torch schema cannot spell a dictionary of mixed values; run the op "
                     "through JAX (or torchax/torch_xla), or declare each entry as its own "
                     "typed attribute (xk.Attr(name, int), ...) and read them with "
                     ".Attr<T>(name) in the handler")
    python_name = "dict"

    @classmethod
    def for_declared(cls, declared: Any) -> DictType | None:
        if declared is dict:
            return cls()
        args = typing.get_args(declared)
        if typing.get_origin(declared) is dict and args and args[0] is str:
            return cls()
        return None

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        from xla_kernels.attr_types import attr_type_of_value

        reject_traced(value, op=op, name=name)
        if not isinstance(value, Mapping):
            raise OpTypeError(op, name, f"expected a dict, got {type(value).__name__}",
                              "pass a dict of str keys to int, float, bool, str, bytes, "
                              "lists of numbers, NumPy values or nested dicts")
        out = {}
        for key in sorted(value, key=lambda k: str(k).encode()):
            if not isinstance(key, str) or not _KEY.match(key):
                raise OpTypeError(op, name, f"dictionary key {key!r} is not an identifier",
                                  "use str keys of letters, digits and '_' (not first digit)")
            item = value[key]
            path = f"{name}.{key}"
            out[key] = attr_type_of_value(item, op=op, name=path, raw=True).coerce(
                item, op=op, name=path)
        return out

    def mlir_text(self, value: Any) -> str:
        from xla_kernels.attr_types import attr_type_of_value

        return "{" + ", ".join(f"{k} = {attr_type_of_value(v).mlir_text(v)}"
                               for k, v in value.items()) + "}"

    def eager(self, value: Any) -> EagerAttr:
        from xla_kernels.attr_types import attr_type_of_value

        block = encode_block([(k, attr_type_of_value(v).eager(v)) for k, v in value.items()])
        return EagerAttr(FFI_DICTIONARY, 0, "8s", b"", block, len(value))

    def hashable(self, value: Any) -> Any:
        from xla_kernels.attr_types import attr_type_of_value

        return ("dict", tuple((k, type(attr_type_of_value(v)).__name__,
                               attr_type_of_value(v).hashable(v)) for k, v in value.items()))

    def probe(self) -> Any:
        return {}
