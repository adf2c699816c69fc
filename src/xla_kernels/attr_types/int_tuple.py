"""``tuple[int, int]`` (any fixed length): a shape-like attribute whose length is checked.

This whole type is this one class: the declaration, the JAX and torch_xla lowerings, the
torch schema and the eager runtime all learn it from here.

Example:
    >>> t = IntTuple(2)
    >>> t.coerce((3, 4), op="op", name="tile")
    array([3, 4])
    >>> t.cpp_type, t.torch_schema_type, t.torch_literal(t.coerce((3, 4), op="op", name="tile"))
    ('ffi::Span<const int64_t>', 'int[2]', '[3, 4]')
"""

from __future__ import annotations

import typing
from typing import Any

import numpy as np

from xla_kernels.attr_types.base import register
from xla_kernels.attr_types.numeric import ArrayType
from xla_kernels.errors import OpInputError


@register
class IntTuple(ArrayType):
    """``tuple[int, ..., int]`` of a fixed length ``n``, as int64 values."""

    def __init__(self, n: int):
        super().__init__(np.dtype(np.int64), f"tuple of {n} ints")
        self.length = n
        self.torch_schema_type = f"int[{n}]"

    @classmethod
    def for_declared(cls, declared: Any) -> IntTuple | None:
        args = typing.get_args(declared)
        if typing.get_origin(declared) is not tuple or not args or Ellipsis in args:
            return None
        return cls(len(args)) if all(a is int for a in args) else None

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        out = super().coerce(value, op=op, name=name)
        if out.size != self.length:
            raise OpInputError(op, name, f"expected {self.length} ints, got {out.size}",
                               f"pass a tuple of {self.length} ints")
        return out

    def probe(self) -> Any:
        return [1] * self.length
