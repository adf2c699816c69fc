"""``dict`` attributes: an ``ffi::Dictionary`` in the handler, nested dictionaries too.

A declared ``dict`` (or ``dict[str, Any]``) takes a Python mapping whose keys are
identifiers and whose values are what :func:`attr_type_of_value` (defined here, since a
dict's codec is one of its answers) knows: ``bool``, ``int`` (int64), ``float`` (f32, as
a declared ``float``), ``str``, ``bytes``, NumPy scalars, lists of numbers and 1-D NumPy
arrays, and nested mappings. The handler binds ``.Attr<ffi::Dictionary>("name")`` and reads
entries with ``dict.get<T>("key")``, where ``T`` is the entry's C++ type (``int64_t``,
``float``, ``std::string_view``, ``ffi::Span<const int64_t>``, ``ffi::Dictionary``...).

A declared ``dict[str, T]`` (``T`` any attribute type: ``int``, ``float``, ``np.int32``,
``list[int]``, ``str``, ``dict[str, U]``...) takes entries of that type only, each coerced
as a declared ``T`` is (so ``dict[str, float]`` makes every entry an f32 and rejects a
``str``); ``dict[str, Any]`` and plain ``dict`` take mixed entries as above.

A torch schema cannot spell a dictionary of mixed values, so an op with a ``dict``
attribute has no torch operator (``torch_op`` says so); JAX, the torch_xla lowering text
and the eager runtime carry it.

Example:
    >>> t = DictType()
    >>> opts = t.coerce({"tag": "x", "n": 3, "inner": {"k": 1.5}}, op="op", name="opts")
    >>> t.mlir_text(opts)
    '{inner = {k = 1.500000e+00 : f32}, n = 3 : i64, tag = "x"}'
    >>> import numpy as np
    >>> sizes = DictType.for_declared(dict[str, np.int32])
    >>> sizes.mlir_text(sizes.coerce({"rows": 4}, op="op", name="sizes"))
    '{rows = 4 : i32}'
"""

from __future__ import annotations

import re
import struct
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np

from xla_kernels.attr_types.base import (
    FFI_DICTIONARY,
    AttrType,
    AttrTypeRegistry,
    EagerAttr,
    register,
    register_refusal,
    reject_traced,
)
from xla_kernels.attr_types.numeric import ArrayType, BytesType, ScalarType
from xla_kernels.attr_types.text import StrType
from xla_kernels.errors import OpDeclarationError, OpTypeError

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


def _entry_type(declared: Any) -> Any:
    """``T`` of a declared ``dict[str, T]``; None for ``dict`` and ``dict[str, Any]``
    (entries of any type), ``NotImplemented`` when the declaration is no ``str``-keyed dict."""
    if declared is dict:
        return None
    args = typing.get_args(declared)
    if typing.get_origin(declared) is not dict or len(args) != 2 or args[0] is not str:
        return NotImplemented
    return None if args[1] is Any else args[1]


def _entry_codec(declared: Any) -> AttrType | None:
    try:
        return AttrTypeRegistry.lookup(declared, attr="<entry>")
    except OpDeclarationError:
        return None


@register
class DictType(AttrType):
    """A mapping of identifiers to attribute values, nested mappings included; ``entries``
    is the codec of every value of a declared ``dict[str, T]`` (None: any value)."""

    cpp_type = "ffi::Dictionary"
    torch_schema_type = None
    torch_refusal = ("a torch schema cannot spell a dictionary of mixed values; run the op "
                     "through JAX (or torchax/torch_xla), or declare each entry as its own "
                     "typed attribute (xk.Attr(name, int), ...) and read them with "
                     ".Attr<T>(name) in the handler")

    def __init__(self, entries: AttrType | None = None):
        self.entries = entries
        self.python_name = "dict" if entries is None else f"dict[str, {entries.python_name}]"

    @classmethod
    def for_declared(cls, declared: Any) -> DictType | None:
        entry = _entry_type(declared)
        if entry is NotImplemented:
            return None
        if entry is None:
            return cls()
        codec = _entry_codec(entry)
        return None if codec is None else cls(codec)

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        reject_traced(value, op=op, name=name)
        if not isinstance(value, Mapping):
            raise OpTypeError(op, name, f"expected a dict, got {type(value).__name__}",
                              f"pass a {self._takes()}")
        out = {}
        for key in sorted(value, key=lambda k: str(k).encode()):
            if not isinstance(key, str) or not _KEY.match(key):
                raise OpTypeError(op, name, f"dictionary key {key!r} is not an identifier",
                                  "use str keys of letters, digits and '_' (not first digit)")
            item = value[key]
            path = f"{name}.{key}"
            if self.entries is None:
                codec = _value_codec(item, raw=True, op=op, name=path)
                out[key] = codec.coerce(item, op=op, name=path)
            else:
                out[key] = self._coerce_entry(item, op=op, name=path)
        return out

    def _coerce_entry(self, item: Any, *, op: str, name: str) -> Any:
        """One entry as the declared entry type coerces it; a refusal says what the
        declaration takes."""
        assert self.entries is not None
        try:
            return self.entries.coerce(item, op=op, name=name)
        except OpTypeError as e:
            if isinstance(self.entries, DictType):  # a nested entry's error says it already
                raise
            raise OpTypeError(op, e.arg or name, f"{e.problem} (its dictionary is declared "
                                        f"{self.python_name})",
                              e.fix or f"pass {self.entries.python_name} values, or declare "
                                       "dict[str, Any] for entries of mixed types") from None

    def _takes(self) -> str:
        if self.entries is not None:
            return f"dict of str keys to {self.entries.python_name} values"
        return ("dict of str keys to int, float, bool, str, bytes, lists of numbers, NumPy "
                "values or nested dicts")

    def _codec(self, value: Any) -> AttrType:
        """The codec of one coerced entry: the declared entry type's, else the value's."""
        return self.entries or _value_codec(value)

    def mlir_text(self, value: Any) -> str:
        return "{" + ", ".join(f"{k} = {self._codec(v).mlir_text(v)}"
                               for k, v in value.items()) + "}"

    def eager(self, value: Any) -> EagerAttr:
        block = encode_block([(k, self._codec(v).eager(v)) for k, v in value.items()])
        return EagerAttr(FFI_DICTIONARY, 0, "8s", b"", block, len(value))

    def hashable(self, value: Any) -> Any:
        return ("dict", tuple((k, type(self._codec(v)).__name__, self._codec(v).hashable(v))
                              for k, v in value.items()))

    def probe(self) -> Any:
        return {}


def _value_codec(value: Any, **how: Any) -> AttrType:
    """The codec of an entry's value (``how``: ``raw``, ``op``, ``name`` of
    :func:`attr_type_of_value`)."""
    return attr_type_of_value(value, **how)


@register_refusal
def _unsupported_entries(declared: Any) -> str | None:
    """Why a ``dict[str, T]`` whose ``T`` is no attribute type is refused."""
    entry = _entry_type(declared)
    if entry is NotImplemented or entry is None or _entry_codec(entry) is not None:
        return None
    return (f"its entry type {entry!r} is not an attribute type; Fix: declare dict[str, T] "
            f"with T one of {AttrTypeRegistry.supported}, or dict[str, Any] for entries of "
            "mixed types")


def attr_type_of_value(value: Any, *, op: str = "<attrs>", name: str | None = None,
                       raw: bool = False) -> AttrType:
    """The codec of a coerced value: a NumPy scalar, a 1-D NumPy array, a ``str`` or a
    ``dict`` of those.

    With ``raw=True`` also the codec that coerces a plain Python value, as a declaration
    of its type would: ``bool``, ``int`` (int64), ``float`` (f32), ``str``, ``bytes``, a
    list or tuple of ints (int64) or of numbers (f32), a mapping (``dict``).

    It lives with :class:`DictType`: a dict's entries are typed by it, and the codec of a
    dict value is a DictType.

    Example:
        >>> import numpy as np
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
        AttrTypeRegistry.lookup(declared, attr="<attr>")
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
