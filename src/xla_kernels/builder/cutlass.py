"""Where CUTLASS's C++ headers are, for the kernels that build on them (``linear``'s Hopper
path, ``kernels/linear/linear_sm90.cu``).

CUTLASS is optional: a library whose kernel asks for it is built with its CUTLASS code where
the headers are found (``-DXK_LINEAR_CUTLASS=1``, the include dirs below) and without it
elsewhere, where its other kernels run. The headers come from, in order:

* ``$XLA_KERNELS_CUTLASS_DIR``: a folder holding ``include/cute`` (a CUTLASS checkout, or
  the headers alone: ``benchmarks/gemm/cutlass_headers.sh`` writes ``.cutlass/``);
* the ``nvidia-cutlass`` package (``pip install --no-deps nvidia-cutlass==4.2.0.0``: only its
  headers are used, so its Python requirements are not needed).

Example:
    >>> isinstance(include_dirs(), tuple)
    True
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from xla_kernels import env

ENV = "XLA_KERNELS_CUTLASS_DIR"
VERSION = "4.2.0.0"
"""The nvidia-cutlass release the kernels are written and measured against."""


def _roots() -> list[Path]:
    roots = []
    if given := env.get(ENV):
        roots.append(Path(given).expanduser())
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        roots.append(Path(next(iter(spec.submodule_search_locations))) / "source")
    return roots


def include_dirs() -> tuple[str, ...]:
    """The ``-I`` folders of CUTLASS's headers (``include``, and ``tools/util/include`` where
    present), or ``()`` where none is found."""
    for root in _roots():
        include = root / "include"
        if (include / "cute" / "tensor.hpp").is_file():
            util = root / "tools" / "util" / "include"
            return (str(include), *((str(util),) if util.is_dir() else ()))
    return ()


def describe() -> str:
    """Doctor's CUTLASS row."""
    found = include_dirs()
    if found:
        return f"{found[0]} (linear's Hopper path is built)"
    return (f"not found: linear's Hopper path is not built (its other kernels run). Fix: pip "
            f"install --no-deps nvidia-cutlass=={VERSION}, or set {ENV}")
