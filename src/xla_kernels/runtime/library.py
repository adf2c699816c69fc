"""Build an op's kernel for a platform and load its handler symbol.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> kernel = load_kernel(simple_add, "cpu")      # doctest: +SKIP
    >>> kernel.handler, kernel.address > 0           # doctest: +SKIP
    ('XlaKernelsSimpleAddCpu', True)
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from xla_kernels import builder, platforms
from xla_kernels.errors import RegistrationError

if TYPE_CHECKING:
    from xla_kernels.op import Kernel, Op

_LEGACY_MACRO = {"cpu": "XLA_KERNELS_LEGACY_CPU_HANDLER", "cuda": "XLA_KERNELS_LEGACY_CUDA_HANDLER"}


@dataclasses.dataclass(frozen=True)
class LoadedKernel:
    """A handler loaded into this process: where it came from and its address."""

    op: str
    platform: str
    handler: str
    library: Path
    function: ctypes._CFuncPtr

    @property
    def address(self) -> int:
        """The handler's function address."""
        return ctypes.cast(self.function, ctypes.c_void_p).value or 0


def load_kernel(op: Op, platform: str) -> LoadedKernel:
    """Build (or take from the cache) ``op``'s kernel for ``platform`` and load it.

    Each call loads anew: callers go through ``op.record.kernel(platform)``, which loads
    once per process.
    """
    kernel = op.kernels.get(platform)
    if kernel is None:
        raise platforms.no_kernel_error(
            op.name, platform, op.kernels, "run it on a platform it supports, or declare "
            f"kernels={{'{platform}': Kernel(...)}}")
    sources = _sources(op, kernel, platform)
    path = builder.build_library(
        op.name, sources, platform=platform,
        include_dirs=kernel.resolved_include_dirs(), defines=dict(kernel.defines),
        extra_flags=kernel.flags)
    try:
        library = ctypes.CDLL(str(path))
    except OSError as e:
        raise RegistrationError(f"{op.name}: cannot load {path}: {e}. Fix: rebuild with "
                                f"XLA_KERNELS_CACHE_DIR pointing to an empty folder.") from e
    try:
        function = getattr(library, kernel.handler)
    except AttributeError:
        raise RegistrationError(
            f"{op.name}: the {platform} library built from {[s.name for s in sources]} has no "
            f"symbol '{kernel.handler}'. Fix: define it with "
            f"XLA_FFI_DEFINE_HANDLER_SYMBOL({kernel.handler}, ...), or pass the right "
            f"handler= to Kernel.") from None
    return LoadedKernel(op.name, platform, kernel.handler, path, function)


def _sources(op: Op, kernel: Kernel, platform: str) -> list[Path]:
    sources = kernel.resolved_sources()
    if kernel.legacy_function is None:
        return sources
    return [_legacy_adapter(kernel, sources[0], platform), *sources[1:]]


def _legacy_adapter(kernel: Kernel, source: Path, platform: str) -> Path:
    """Write the translation unit that includes a legacy source and wraps its function."""
    text = (f'#include "{source}"\n#include "xla_kernels/legacy.h"\n'
            f"{_LEGACY_MACRO[platform]}({kernel.handler}, {kernel.legacy_function});\n")
    suffix = ".cu" if platform == "cuda" else ".cc"
    digest = hashlib.sha256(text.encode() + source.read_bytes()).hexdigest()[:16]
    folder = builder.default_cache_dir() / "generated"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"legacy_{kernel.legacy_function}_{digest}{suffix}"
    if not path.exists():
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path
