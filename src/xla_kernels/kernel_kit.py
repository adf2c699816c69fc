"""The Python half of the kernel author kit: constants a kernel's C++ header defines once.

Kernels keep their limits (supported sizes, tiling constants) in a plain C++ header, the
single definition; the op's declaration reads them from there instead of restating them.
The C++ half of the kit is ``include/xla_kernels/`` (dtype names, bf16/f16 conversion,
error helpers), on the include path of every kernel.

Example:
    >>> import tempfile, pathlib
    >>> header = pathlib.Path(tempfile.mkdtemp()) / "paged_attention_limits.h"
    >>> _ = header.write_text("constexpr int64_t kTile = 64;\\n"
    ...                       "constexpr int64_t kSizes[] = {16, 32};\\n")
    >>> read_constants(header)
    {'kTile': 64, 'kSizes': (16, 32)}
"""

from __future__ import annotations

import re
from pathlib import Path

from xla_kernels.errors import OpDeclarationError

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
"""``include/``: the kit's C++ headers (``#include "xla_kernels/half.h"``)."""

_CONSTANT = re.compile(
    r"^\s*constexpr\s+(?:int|int32_t|int64_t|long|size_t)\s+(?P<name>\w+)\s*"
    r"(?P<array>\[\s*\])?\s*=\s*(?P<value>\{[^}]*\}|-?\d+)\s*;", re.MULTILINE)


def read_constants(header: str | Path) -> dict[str, int | tuple[int, ...]]:
    """Integer ``constexpr`` constants and arrays of ``header``, by name.

    Reads ``constexpr int64_t kName = 64;`` and ``constexpr int64_t kNames[] = {1, 2};``
    (also ``int``, ``int32_t``, ``long``, ``size_t``); anything else is left alone.
    """
    path = Path(header)
    try:
        text = path.read_text()
    except OSError as e:
        raise OpDeclarationError(None, f"cannot read kernel constants from {path}: {e}",
                                 "ship the header next to the op's sources") from None
    out: dict[str, int | tuple[int, ...]] = {}
    for m in _CONSTANT.finditer(text):
        value = m["value"]
        if value.startswith("{"):
            out[m["name"]] = tuple(int(v) for v in value.strip("{}").split(",") if v.strip())
        else:
            out[m["name"]] = int(value)
    return out
