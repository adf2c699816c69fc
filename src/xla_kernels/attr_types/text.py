"""``str`` attributes: ``std::string_view`` in the handler.

Example:
    >>> StrType().mlir_text("vllm")
    '"vllm"'
"""

from __future__ import annotations

from typing import Any

from xla_kernels.attr_types.base import FFI_STRING, AttrType, EagerAttr, register, reject_traced
from xla_kernels.errors import OpTypeError


def _printable(text: str) -> bool:
    return all(32 <= ord(c) < 127 and c not in '"\\' for c in text)


@register
class StrType(AttrType):
    """A UTF-8 string, passed by pointer and length."""

    cpp_type = "std::string_view"
    torch_schema_type = "str"
    python_name = "str"

    @classmethod
    def for_declared(cls, declared: Any) -> StrType | None:
        return cls() if declared is str else None

    def coerce(self, value: Any, *, op: str, name: str) -> Any:
        reject_traced(value, op=op, name=name)
        if not isinstance(value, str):
            raise OpTypeError(op, name, f"expected a str, got {type(value).__name__}")
        return value

    def mlir_text(self, value: Any) -> str:
        # MLIR string escapes are a backslash and two hex digits per byte.
        escaped = "".join(c if _printable(c) else "".join(f"\\{b:02X}" for b in c.encode())
                          for c in value)
        return f'"{escaped}"'

    def eager(self, value: Any) -> EagerAttr:
        data = value.encode()
        return EagerAttr(FFI_STRING, 0, "8s", b"", data, len(data))

    def torch_literal(self, value: Any) -> str | None:
        return f'"{value}"' if _printable(value) else None

    def probe(self) -> Any:
        return ""
