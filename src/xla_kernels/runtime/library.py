"""Build an op's kernel for a platform and load its handler symbol.

The unit of build is the library, not the op: kernels with the same sources and build
settings (include dirs, defines, flags, platform) are one library, built once, named after
its first source and loaded once per process, so their handlers share its static state.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> kernel = load_kernel(simple_add, "cpu")      # doctest: +SKIP
    >>> kernel.handler, kernel.address > 0           # doctest: +SKIP
    ('XlaKernelsSimpleAddCpu', True)
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from xla_kernels import builder, platforms
from xla_kernels.errors import BuildError, RegistrationError
from xla_kernels.record import OpRecord, record_of
from xla_kernels.runtime import eager
from xla_kernels.runtime.ffi_types import ensure_types

if TYPE_CHECKING:
    from xla_kernels.op import Kernel, Op


@dataclasses.dataclass(frozen=True)
class LoadedType:
    """A custom FFI type of a loaded kernel: addresses of its ``XLA_FFI_TypeId`` (which
    XLA fills in when the type is registered) and ``XLA_FFI_TypeInfo`` (0 if not declared).

    Example:
        >>> LoadedType("my_lib.MyState", "MyStateId", 0x1000, 0).type_id     # doctest: +SKIP
        0
    """

    name: str
    symbol: str
    id_address: int
    info_address: int

    @property
    def type_id(self) -> int:
        """The id XLA assigned (0 until the type is registered)."""
        return ctypes.c_int64.from_address(self.id_address).value


@dataclasses.dataclass(frozen=True)
class LoadedKernel:
    """A handler loaded into this process: where it came from and its address.

    ``function``/``address`` are the execute handler's; ``stages`` holds every declared
    stage's handler (execute included), ``types`` the custom FFI types to register first.
    """

    op: str
    platform: str
    handler: str
    library: Path
    function: ctypes._CFuncPtr
    stages: Mapping[str, ctypes._CFuncPtr] = dataclasses.field(default_factory=dict)
    types: tuple[LoadedType, ...] = ()

    @property
    def address(self) -> int:
        """The execute handler's function address."""
        return ctypes.cast(self.function, ctypes.c_void_p).value or 0

    def stage_addresses(self) -> dict[str, int]:
        """Each declared stage's handler address, by stage name."""
        return {s: ctypes.cast(f, ctypes.c_void_p).value or 0 for s, f in self.stages.items()}


#: Every library this module loaded, by path: one handle (one copy of its statics) each.
_libraries: dict[Path, ctypes.CDLL] = {}
_libraries_lock = threading.Lock()


def library_name(kernel: Kernel) -> str:
    """The name of the library ``kernel`` is built into: its first source's stem.

    Kernels of several ops that name the same sources with the same settings get the same
    name and key, hence one library file (see :func:`load_kernel`).

    Example:
        >>> from xla_kernels.op import Kernel
        >>> library_name(Kernel(["src/counters.cc", "util.cc"], handler="BumpA"))
        'counters'
    """
    return Path(kernel.sources[0]).stem


def load_library(path: Path, op: str) -> ctypes.CDLL:
    """The process's one handle of the library at ``path``, loading it on first use.

    ``op`` names the op that needs it, for the error message.

    Example:
        >>> load_library(Path("/nonexistent/lib.so"), "docs.op")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        xla_kernels.errors.RegistrationError: docs.op: cannot load /nonexistent/lib.so: ...
    """
    with _libraries_lock:
        library = _libraries.get(path)
        if library is None:
            try:
                library = _libraries[path] = ctypes.CDLL(str(path))
            except OSError as e:
                raise RegistrationError(
                    f"{op}: cannot load {path}: {e}. Fix: rebuild with XLA_KERNELS_CACHE_DIR "
                    "pointing to an empty folder.") from e
        return library


def loaded_libraries() -> list[Path]:
    """The library files this process loaded kernels from, in load order.

    Example:
        >>> isinstance(loaded_libraries(), list)
        True
    """
    with _libraries_lock:
        return list(_libraries)


def kernel_spec(op: Op, platform: str) -> builder.BuildSpec:
    """The :class:`~xla_kernels.builder.BuildSpec` of the library that holds ``op``'s kernel
    for ``platform``: what ``xla-kernels build --aot`` prebuilds and :func:`load_kernel` loads.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> kernel_spec(simple_add, "cpu").name
        'simple_add_cpu'
    """
    kernel = op.kernels.get(platform)
    if kernel is None:
        raise platforms.no_kernel_error(
            op.name, platform, op.kernels, "run it on a platform it supports, or declare "
            f"kernels={{'{platform}': Kernel(...)}}")
    sources, legacy_defines = _sources(op, kernel, platform)
    return builder.BuildSpec.create(
        library_name(kernel), sources, platform=platform,
        include_dirs=kernel.resolved_include_dirs(),
        defines={**kernel.defines, **legacy_defines}, extra_flags=kernel.flags,
        for_op=op.name, arch_specific=kernel.arch_specific)


def load_kernel(op: Op, platform: str) -> LoadedKernel:
    """Build (or take from the cache) ``op``'s kernel for ``platform`` and load it.

    The library is the one of every kernel with the same sources and build settings: a
    prebuilt one shipped in the op's package when it matches (see
    :mod:`xla_kernels.builder.prebuilt`), else built once (later ops hit the cache), and
    loaded once per process (:func:`load_library`), so
    handlers of several ops share its static state. Callers go through
    :func:`kernel_of`, which looks the handler up once per op.
    """
    spec = kernel_spec(op, platform)
    kernel = op.kernels[platform]
    path = spec.load_path()
    library = load_library(path, op.name)
    built = f"the {platform} library built from {[s.name for s in spec.sources]}"
    stages = {}
    for stage, symbol in (kernel.stages or {"execute": kernel.handler}).items():
        what = "" if stage == "execute" and not kernel.stateful else f" (its {stage} handler)"
        fix = ("or pass the right handler= to Kernel" if not what else
               f"or correct handler={{'{stage}': ...}} in Kernel")
        stages[stage] = _symbol(library, symbol, f"{op.name}: {built} has no symbol "
                                f"'{symbol}'{what}. Fix: define it with "
                                f"XLA_FFI_DEFINE_HANDLER_SYMBOL({symbol}, ...), {fix}.")
    types = []
    for name, symbols in kernel.types.items():
        addresses = []
        for key, macro in (("type_id", "XLA_FFI_DECLARE_TYPE_ID_SYMBOL"),
                           ("type_info", "XLA_FFI_DECLARE_TYPE_INFO_SYMBOL")):
            symbol = symbols[key]
            if symbol is None:
                addresses.append(0)
                continue
            fn = _symbol(library, symbol, f"{op.name}: {built} has no symbol '{symbol}' (the "
                         f"{key} of FFI type '{name}'). Fix: define the function with "
                         f"{macro}({symbol}), or correct Kernel(types=...).")
            fn.restype, fn.argtypes = ctypes.c_void_p, []
            addresses.append(fn() or 0)
            if not addresses[-1]:
                raise RegistrationError(f"{op.name}: {symbol}() returned null (the {key} of "
                                        f"FFI type '{name}'). Fix: return the address of a "
                                        "static object.")
        types.append(LoadedType(name, symbols["type_id"], addresses[0], addresses[1]))
    loaded = LoadedKernel(op.name, platform, kernel.handler, path, stages["execute"],
                          stages, tuple(types))
    if kernel.stateful:  # eager calls run the other stages and keep their state
        address = loaded.address
        eager.declare_stages(address, loaded.stage_addresses(),
                             setup=lambda: ensure_types(loaded, assign=True))
        record_of(op.target).on_replace(lambda: eager.drop_states(address))
    return loaded


def kernel_of(op: Op | OpRecord | str, platform: str) -> LoadedKernel:
    """The kernel that runs ``op`` (an op, its record or its target) on ``platform``: built
    (or taken from the cache) and loaded once per process for the record's current
    declaration, then kept in :attr:`OpRecord.kernels <xla_kernels.record.OpRecord>`.

    JAX's registration, the eager frontends and torch_xla all run this one handler.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> kernel_of(simple_add, "cpu") is kernel_of("xla_kernels.simple_add", "cpu")
        True
    """
    record = op if isinstance(op, OpRecord) else record_of(op)
    with record.lock:
        loaded = record.kernels.get(platform)
        if loaded is None:
            loaded = record.kernels[platform] = load_kernel(record.op, platform)
        return loaded


def _symbol(library: ctypes.CDLL, name: str, message: str) -> ctypes._CFuncPtr:
    """A fresh function object for ``library``'s symbol ``name`` (getattr would hand every
    op of a shared library the one object it caches, so one op's ctypes settings could leak
    into another's), or a RegistrationError with ``message``."""
    try:
        return library[name]
    except AttributeError:
        raise RegistrationError(message) from None


def _sources(op: Op, kernel: Kernel, platform: str) -> tuple[list[Path], dict[str, str]]:
    """The files to compile for ``kernel`` and the defines a legacy adapter needs.

    Example:
        >>> from ops import legacy_add                                 # doctest: +SKIP
        >>> srcs, defines = _sources(legacy_add, legacy_add.kernels["cpu"], "cpu")  # doctest: +SKIP
        >>> srcs[0].name, defines["XK_LEGACY_FUNCTION"]                # doctest: +SKIP
        ('legacy_adapter.cc', 'LegacyAddCpu')
    """
    sources = kernel.resolved_sources()
    for declared, path in zip(kernel.sources, sources, strict=True):
        if not path.is_file():
            what = "legacy source" if kernel.legacy_function else "source"
            where = (f"the folder of the file that declares the op, {kernel.base_dir}"
                     if kernel.base_dir is not None else "the current directory, "
                     f"{Path.cwd()}, for an op declared in an interactive session")
            raise BuildError(
                f"{op.name}: the {platform} kernel's {what} {declared!r} does not exist "
                f"(looked for {path.absolute()}; relative paths are taken from {where}). "
                "Fix: correct the path in Kernel(...)/Kernel.legacy(...), or pass an "
                "absolute path.")
    if kernel.legacy_function is None:
        return sources, {}
    adapter, defines = _legacy_adapter(kernel, sources[0], platform)
    return [adapter, *sources[1:]], defines


def _legacy_adapter(kernel: Kernel, source: Path, platform: str) -> tuple[Path, dict[str, str]]:
    """The shipped adapter translation unit and the ``-D`` defines that aim it at ``source``.

    Nothing is generated: ``include/xla_kernels/legacy_adapter.cc`` (``.cu`` for CUDA)
    does ``#include XK_LEGACY_SOURCE``, so the compiler's depfile tracks the real source and
    its headers, and the cache holds no file that depends on where the cache lives.
    """
    suffix = ".cu" if platform == "cuda" else ".cc"
    adapter = builder.package_include_dir() / "xla_kernels" / f"legacy_adapter{suffix}"
    quoted = str(source).replace("\\", "\\\\").replace('"', '\\"')
    return adapter, {"XK_LEGACY_SOURCE": f'"{quoted}"', "XK_LEGACY_HANDLER": kernel.handler,
                     "XK_LEGACY_FUNCTION": str(kernel.legacy_function)}
