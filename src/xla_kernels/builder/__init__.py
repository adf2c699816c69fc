"""Build C++/CUDA sources into a cached shared library of XLA FFI handlers.

Example:
    >>> from xla_kernels.builder import build_library
    >>> so = build_library("simple_add", ["simple_add.cc"], platform="cpu")  # doctest: +SKIP
    >>> import ctypes; ctypes.CDLL(str(so)).SimpleAdd                       # doctest: +SKIP

The library lands in :func:`default_cache_dir`, keyed by the sources, flags and FFI headers,
with a manifest of every header the compilers read (see :mod:`.cache`); a second call with
the same inputs returns the cached file without running a compiler.

A library is the unit of build: ops whose kernels have the same sources and build settings
share one library (see ``docs/build_units.md`` and :mod:`xla_kernels.runtime.library`).
Sources with a nanobind or pybind11 registration block build unchanged against the
compile-only stand-in headers of :func:`compat_include_dir`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout

from .. import env as environment
from ..errors import BuildError, CompilerNotFoundError
from . import prebuilt
from .cache import (
    Lookup,
    check_entry,
    compute_key,
    default_cache_dir,
    entry_stem,
    ffi_headers_digest,
    install_entry,
    parse_depfile,
    read_manifest,
    tree_digest,
)
from .compiler import (
    CUDA_SUFFIXES,
    CXX_FLAGS,
    CXX_SUFFIXES,
    NVCC_FLAGS,
    Progress,
    common_flags,
    cuda_include_dir,
    gencode_flags,
    plan_steps,
    run_steps,
)
from .toolchain import (
    arch_specific_archs,
    compiler_version,
    detect_cuda_archs,
    find_cxx,
    find_nvcc,
    resolve_cuda_archs,
    short_version,
)

__all__ = [
    "BuildSpec",
    "Resolution",
    "build_library",
    "compat_include_dir",
    "default_cache_dir",
    "detect_cuda_archs",
    "find_cxx",
    "find_nvcc",
    "toolchain_report",
    "used_libraries",
]

Platform = Literal["cpu", "cuda"]



def installed_ffi_include_dir() -> Path:
    """The installed jaxlib's bundled headers (``xla/ffi/api/ffi.h``), i.e.
    ``jax.ffi.include_dir()``: their FFI version is the one this process serves."""
    import jax.ffi  # imported lazily: only needed when building or matching

    return Path(jax.ffi.include_dir())


def ffi_include_dir() -> Path:
    """The XLA FFI headers builds compile against: ``$XLA_KERNELS_FFI_INCLUDE_DIR`` (e.g.
    an older jaxlib's, so that one library serves every newer jaxlib), else the installed
    jaxlib's (:func:`installed_ffi_include_dir`)."""
    override = environment.get("XLA_KERNELS_FFI_INCLUDE_DIR")
    return Path(override).expanduser() if override else installed_ffi_include_dir()


def package_include_dir() -> Path:
    """``src/xla_kernels/include``: headers shipped with xla-kernels (same dir as
    ``Path(xla_kernels.__file__).parent / "include"``)."""
    return Path(__file__).resolve().parent.parent / "include"


def compat_include_dir() -> Path:
    """``include/xla_kernels/compat``: compile-only stand-ins for ``nanobind/nanobind.h`` and
    ``pybind11/pybind11.h``, searched after every other include dir (``-idirafter``).

    They let a source that carries a nanobind/pybind11 registration block (``NB_MODULE``,
    ``PYBIND11_MODULE``) build unchanged: the block compiles into an unused function, and
    the handlers are registered through ``xk.Op``. Real headers anywhere on the include
    path (``Kernel(include_dirs=...)``, ``CPATH``, the system's) win over them.

    Example:
        >>> (compat_include_dir() / "nanobind" / "nanobind.h").is_file()
        True
    """
    return package_include_dir() / "xla_kernels" / "compat"


#: ``#include`` lines that the stand-in headers may answer.
_BINDING_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]((?:nanobind|pybind11)/[^>"]+)[>"]', re.M)


def _stand_in_note(sources: Sequence[Path], include_dirs: Sequence[Path]) -> str:
    """For a failed build: which sources may have compiled against the stand-in headers
    (they include nanobind/pybind11 headers that no ``-I`` folder holds), and the fix."""
    found: list[str] = []
    for src in sources:
        try:
            text = src.read_text(errors="replace")
        except OSError:
            continue
        for header in dict.fromkeys(_BINDING_INCLUDE.findall(text)):
            if not any((d / header).is_file() for d in include_dirs):
                found.append(f"{src.name} includes {header}")
    if not found:
        return ""
    return (f"\nNote: {'; '.join(found)}, which no include dir given holds, so unless the "
            "compiler found it on its system path, xla-kernels' compile-only stand-in "
            f"answered it ({compat_include_dir()}). The stand-in covers what registration "
            "blocks use (module def/attr/doc, dict, list, tuple, capsule, str, int_, bytes, "
            "arg, cast, make_tuple; see xk_compat_bindings.h there), not bound classes, "
            "ndarray or the Python C API. Fix, if the errors are in the registration block: "
            "pass the real headers' folders in Kernel(include_dirs=[...]) (e.g. "
            "nanobind.include_dir() or pybind11.get_include(), and the Python headers), or "
            "wrap the block in #ifndef XLA_KERNELS_COMPAT_BINDINGS ... #endif.")


def _describe(name: str, for_op: str | None) -> str:
    """How messages name the library: ``'k'`` or ``'k' (needed by op x)``."""
    return f"'{name}'" + (f" (needed by op {for_op})" if for_op else "")


def _check_sources(what: str, platform: str, sources: Sequence[str | Path]) -> list[Path]:
    """Absolute source paths; BuildError for missing files, unknown kinds, .cu on cpu."""
    if platform not in ("cpu", "cuda"):
        raise BuildError(f"building {what}: unknown platform {platform!r}. "
                         "Fix: use platform='cpu' or platform='cuda'.")
    if isinstance(sources, (str, Path)):
        sources = [sources]
    if not sources:
        raise BuildError(f"building {what} for {platform}: no source files given.")
    paths = [Path(s).expanduser().resolve() for s in sources]
    for path in paths:
        if not path.is_file():
            raise BuildError(
                f"building {what} for {platform}: source file not found: {path}. Fix: check "
                f"the path (relative paths passed to build_library are taken from the current "
                f"directory, {Path.cwd()}; an op's Kernel sources are taken from the folder "
                "of the file that declares the op).")
        if path.suffix not in CXX_SUFFIXES + CUDA_SUFFIXES:
            raise BuildError(f"building {what} for {platform}: don't know how to compile "
                             f"{path} (expected {', '.join(CXX_SUFFIXES + CUDA_SUFFIXES)}).")
        if platform == "cpu" and path.suffix in CUDA_SUFFIXES:
            raise BuildError(f"building {what} for cpu: {path} is a CUDA source. "
                             "Fix: build it with platform='cuda', or leave it out of cpu builds.")
    return list(dict.fromkeys(paths))


def _installed_version(kind: str) -> str | None:
    """``--version`` text of the compiler of ``kind`` (``"cxx"``/``"nvcc"``) a build would use
    now, or None when it is not installed (a cache hit does not need it)."""
    try:
        return compiler_version(find_cxx() if kind == "cxx" else find_nvcc())
    except (CompilerNotFoundError, OSError):
        return None


def _read_only_error(what: str, platform: str, cache: Path, reason: str,
                     error: OSError | None = None) -> BuildError:
    detail = f" ({error})" if error else ""
    return BuildError(
        f"building {what} for {platform}: the cache folder {cache} is read-only{detail}, "
        f"and it holds no usable build of this library ({reason}). Fix: point "
        "XLA_KERNELS_CACHE_DIR (or cache_dir=) at a writable folder; a read-only cache can "
        "only serve libraries that were built into it before.")


def _file_in_the_way(cache: Path) -> Path | None:
    """The cache path itself, or the folder above it, where that exists and is not a folder
    (mkdir then fails with EEXIST/ENOTDIR, which reads like a permission problem)."""
    for path in (cache, *cache.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def _not_a_folder_error(what: str, platform: str, cache: Path, blocking: Path) -> BuildError:
    where = "is a file" if blocking == cache else f"lies under {blocking}, which is a file"
    return BuildError(
        f"building {what} for {platform}: the cache folder {cache} {where}, not a folder. "
        "Fix: point XLA_KERNELS_CACHE_DIR (or cache_dir=) at a folder (it is created if "
        f"missing), or move the file {blocking} away.")


def _lock(what: str, platform: str, cache: Path, stem: Path, reason: str) -> FileLock:
    """The entry's file lock; creating it is the first write, so EROFS/EACCES surface here."""
    lock = FileLock(str(stem) + ".lock")
    try:
        if lock.acquire(timeout=0):
            return lock
    except Timeout:
        pass
    except OSError as e:
        raise _read_only_error(what, platform, cache, reason, e) from e
    # Another process holds the lock, i.e. is building this very library: wait for it.
    progress = Progress(f"another process is building {what} for {platform}; waiting")
    with progress:
        lock.acquire()
        progress.result = (f"waited {{s}} s for another process building {what} for "
                           f"{platform}; using its result")
    return lock


Source = Literal["prebuilt", "cache", "build"]


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Where a library comes from: ``kind`` is ``"prebuilt"`` (shipped in a package),
    ``"cache"`` (built before) or ``"build"`` (the compilers must run; ``path`` is then
    None until built); ``reason`` says why the earlier places did not serve."""

    kind: Source
    path: Path | None
    reason: str


#: The last resolution of every library this process loaded, by (name, platform).
_used: dict[tuple[str, str], Resolution] = {}


def used_libraries() -> dict[tuple[str, str], Resolution]:
    """How each library this process asked for was found, by ``(name, platform)``.

    Example:
        >>> isinstance(used_libraries(), dict)
        True
    """
    return dict(_used)


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """One library to build: its sources and settings, and how to get it.

    :meth:`load_path` takes the library, in order, from a prebuilt library shipped in the
    sources' package (see :mod:`.prebuilt`; verified by size and sha256), from the build
    cache (see :mod:`.cache`), or by compiling; ``$XLA_KERNELS_BUILD`` changes the order
    (:func:`~xla_kernels.builder.prebuilt.build_mode`). ``abi`` holds the tags a prebuilt
    library must match beyond its sources, e.g. the torch build a torch extension was
    compiled against. Make one with :meth:`create`.

    Example:
        >>> spec = BuildSpec.create("add", ["add.cc"], platform="cpu")  # doctest: +SKIP
        >>> spec.resolve().kind                                          # doctest: +SKIP
        'prebuilt'
    """

    name: str
    sources: tuple[Path, ...]
    platform: Platform
    include_dirs: tuple[Path, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    extra_flags: tuple[str, ...] = ()
    cuda_archs: tuple[str, ...] | None = None
    arch_specific: bool = False
    for_op: str | None = None
    abi: tuple[tuple[str, str], ...] = ()

    @classmethod
    def create(cls, name: str, sources: Sequence[str | Path], *, platform: Platform,
               include_dirs: Sequence[str | Path] = (), defines: Mapping[str, str] = {},
               extra_flags: Sequence[str] = (), cuda_archs: Sequence[str] | str | None = None,
               for_op: str | None = None, arch_specific: bool = False,
               abi: Mapping[str, str] = {}) -> BuildSpec:
        """A spec with the sources checked (BuildError for missing or unknown files)."""
        srcs = _check_sources(_describe(name, for_op), platform, sources)
        if isinstance(cuda_archs, str):
            cuda_archs = cuda_archs.split(",")
        return cls(name, tuple(srcs), platform,
                   tuple(Path(d).expanduser().resolve() for d in include_dirs),
                   tuple(sorted(defines.items())), tuple(extra_flags),
                   None if cuda_archs is None else tuple(str(a) for a in cuda_archs),
                   arch_specific, for_op, tuple(sorted(abi.items())))

    def wanted_archs(self) -> list[str]:
        """The CUDA archs this process builds for (empty for CPU)."""
        if self.platform != "cuda":
            return []
        archs, _ = resolve_cuda_archs(self.cuda_archs)
        return arch_specific_archs(archs) if self.arch_specific else archs

    def wanted(self, archs: Sequence[str] | None = None,
               ffi: tuple[int, int] | None = None) -> prebuilt.Wanted:
        """What a prebuilt library must be to serve this process (or, with ``archs`` and
        ``ffi``, what one built for them is)."""
        if ffi is None:
            try:
                ffi = prebuilt.ffi_api_version(installed_ffi_include_dir())
            except ImportError:
                ffi = None
        return prebuilt.Wanted(self.name, self.platform, self.sources, self.defines,
                               self.extra_flags, self.abi, ffi,
                               tuple(self.wanted_archs() if archs is None else archs))

    def prebuilt(self) -> prebuilt.Match:
        """The shipped prebuilt library that serves this process, or why none does."""
        return prebuilt.find(self.wanted())

    def resolve(self, *, cache_dir: str | Path | None = None) -> Resolution:
        """Where :meth:`load_path` would take the library from now, running no compiler.

        Example:
            >>> spec.resolve()                                     # doctest: +SKIP
            Resolution(kind='prebuilt', path=PosixPath('.../_prebuilt/...so'), reason='...')
        """
        mode = prebuilt.build_mode()
        reason = "XLA_KERNELS_BUILD=always"
        if mode != "always":
            match = self.prebuilt()
            if match.path is not None:
                return Resolution("prebuilt", match.path, match.reason)
            reason = match.reason
        _, found = self._cache_lookup(cache_dir, ffi_include_dir())
        if found.path is not None:
            return Resolution("cache", found.path, f"{reason}; the cache holds a build")
        return Resolution("build", None, f"{reason}; the cache has none ({found.reason})")

    def load_path(self, *, cache_dir: str | Path | None = None) -> Path:
        """The library's path: prebuilt, else cached, else built now (see the class doc).

        Raises:
            BuildError: a build was needed and failed, or ``XLA_KERNELS_BUILD=never``.
            CompilerNotFoundError: a build was needed and a compiler is missing.
        """
        mode = prebuilt.build_mode()
        reason = "XLA_KERNELS_BUILD=always"
        if mode != "always":
            match = self.prebuilt()
            if match.path is not None:
                _used[(self.name, self.platform)] = Resolution("prebuilt", match.path,
                                                               match.reason)
                return match.path
            reason = match.reason
        path, kind = self._jit(cache_dir, ffi_include_dir(), compile_ok=mode != "never",
                               why=reason)
        _used[(self.name, self.platform)] = Resolution(kind, path, reason)
        return path

    def build(self, *, cache_dir: str | Path | None = None,
              ffi_dir: Path | None = None) -> tuple[Path, list[Path]]:
        """Take the library from the cache or compile it, never from a prebuilt one
        (``ffi_dir``: the XLA FFI headers to build against). Returns its path and every
        file the compilers read, from the cache entry's manifest."""
        path, _ = self._jit(cache_dir, ffi_dir or ffi_include_dir(), compile_ok=True,
                            why="an ahead-of-time build")
        manifest = read_manifest(path.with_name(path.name.rsplit("-", 1)[0])) or {}
        return path, [Path(p) for p in manifest.get("dependencies", {})]

    def _flags(self, ffi_dir: Path) -> tuple[list[Path], list[str]]:
        pkg_dir = package_include_dir()
        # A source's own folder is searched for its headers; the shipped legacy adapter's
        # folder is not, so its neighbours (legacy.h, ...) never shadow a user's headers.
        incs = [s.parent for s in self.sources if not s.is_relative_to(pkg_dir)]
        incs += list(self.include_dirs)
        return incs, common_flags([*incs, pkg_dir, ffi_dir], dict(self.defines),
                                  self.extra_flags)

    def _key(self, ffi_dir: Path) -> tuple[str, list[str], list[str], str]:
        """The cache key, and the archs, gencode flags and arch text of this build."""
        _, flags = self._flags(ffi_dir)
        need_cxx = self.platform == "cpu" or any(s.suffix in CXX_SUFFIXES for s in self.sources)
        gencode: list[str] = []
        archs: list[str] = []
        target = ""
        if self.platform == "cuda":
            archs, origin = resolve_cuda_archs(self.cuda_archs)
            if self.arch_specific:
                archs = arch_specific_archs(archs)
            gencode = gencode_flags(archs, ptx=origin == "fallback")
            target = (", " + ", ".join(f"sm_{a}" for a in archs)
                      + (" + PTX" * (origin == "fallback")))
        env = environment.build_env()
        requested = [] if self.cuda_archs is None else [",".join(self.cuda_archs)]
        compat_dir = compat_include_dir()
        key = compute_key(
            fields={"name": [self.name], "platform": [self.platform], "flags": flags,
                    "cxx_flags": CXX_FLAGS if need_cxx else (),
                    "nvcc_flags": NVCC_FLAGS if self.platform == "cuda" else (),
                    "requested_archs": requested, "gencode": gencode, "env": env,
                    "package_include_dir": [str(package_include_dir())],
                    "ffi": [ffi_headers_digest(ffi_dir)],
                    "compat": [str(compat_dir), tree_digest(compat_dir)]},
            sources=self.sources)
        return key, archs, gencode, target

    def _cache_lookup(self, cache_dir: str | Path | None, ffi_dir: Path
                      ) -> tuple[Path, Lookup]:
        key = self._key(ffi_dir)[0]
        cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        stem = entry_stem(cache.absolute(), self.name, self.platform, key)
        return stem, check_entry(stem, _installed_version)

    def _jit(self, cache_dir: str | Path | None, ffi_dir: Path, *, compile_ok: bool,
             why: str) -> tuple[Path, Source]:
        """The cached library, else compile it (``compile_ok``); ``why``: why no prebuilt
        library served, for the error when compiling is not allowed."""
        name, platform, srcs = self.name, self.platform, list(self.sources)
        what = _describe(name, self.for_op)
        compat_dir = compat_include_dir()
        incs, flags = self._flags(ffi_dir)
        need_cxx = platform == "cpu" or any(s.suffix in CXX_SUFFIXES for s in srcs)
        # Everything up to the lookup runs without a compiler: a hit must not need one.
        key, archs, gencode, target = self._key(ffi_dir)
        cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        cache = cache.absolute()
        stem = entry_stem(cache, name, platform, key)
        found = check_entry(stem, _installed_version)
        if found.path is not None:
            return found.path, "cache"
        if not compile_ok:
            raise BuildError(
                f"building {what} for {platform}: XLA_KERNELS_BUILD=never forbids compiling, "
                f"no prebuilt library serves ({why}) and the cache has none ({found.reason}). "
                "Fix: install a wheel whose prebuilt libraries match this machine (xla-kernels "
                "doctor says what they were built for), or unset XLA_KERNELS_BUILD to build it.")
        # A miss: this process has to build, which needs a writable cache and the compilers.
        blocking = _file_in_the_way(cache)
        if blocking is not None:
            raise _not_a_folder_error(what, platform, cache, blocking)
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _read_only_error(what, platform, cache, found.reason, e) from e
        if not os.access(cache, os.W_OK):
            raise _read_only_error(what, platform, cache, found.reason)
        cxx = nvcc = None
        compilers: dict[str, str] = {}
        if need_cxx:
            path = find_cxx()
            compilers["cxx"] = compiler_version(path)
            cxx = (path, short_version(path, compilers["cxx"]))
        if platform == "cuda":
            path = find_nvcc()
            compilers["nvcc"] = compiler_version(path)
            nvcc = (path, short_version(path, compilers["nvcc"]))
        cuda_inc = cuda_include_dir(nvcc[0]) if nvcc and need_cxx else None

        lock = _lock(what, platform, cache, stem, found.reason)
        try:
            # Another process may have built (or repaired) it while this one waited for the lock.
            found = check_entry(stem, lambda kind: compilers.get(kind))
            if found.path is not None:
                return found.path, "cache"
            label = nvcc[1] if nvcc else cxx[1] if cxx else "?"
            with tempfile.TemporaryDirectory(dir=cache, prefix=".obj-") as tmp:
                obj_dir = Path(tmp)
                built = obj_dir / "library.so"
                steps = plan_steps(srcs, platform=platform, out=built, obj_dir=obj_dir,
                                   flags=flags, cxx=cxx, nvcc=nvcc, gencode=gencode,
                                   cxx_cuda_include=cuda_inc, fallback_include=compat_dir)
                with Progress(f"building {what} for {platform} ({label}{target})"):
                    try:
                        run_steps(steps, name=name, platform=platform, what=what)
                    except BuildError as e:
                        note = _stand_in_note(srcs, incs)
                        if not note:
                            raise
                        raise BuildError(str(e) + note, compiler_output=e.compiler_output,
                                         command=e.command) from None
                cwd = Path.cwd()  # the compilers ran here; depfiles may hold relative paths
                deps: dict[Path, None] = dict.fromkeys(srcs)
                for step in steps:
                    if "-MF" in step.argv:
                        depfile = Path(step.argv[step.argv.index("-MF") + 1])
                        try:
                            text = depfile.read_text()
                        except OSError as e:
                            raise BuildError(
                                f"building {what} for {platform}: {step.compiler} wrote no "
                                f"dependency file ({e}), so header changes could not be tracked. "
                                "Fix: remove -MF/-MD/-MMD/-M options from the kernel's flags."
                            ) from e
                        deps.update(dict.fromkeys(parse_depfile(text, cwd)))
                return install_entry(
                    stem, built, dependencies=deps, compilers=compilers, damaged=found.damaged,
                    info={"name": name, "platform": platform, "key": key,
                          "cuda_archs": archs, "commands": [list(s.argv) for s in steps]}
                ), "build"
        finally:
            lock.release()


def build_library(
    name: str,
    sources: Sequence[str | Path],
    *,
    platform: Platform,
    include_dirs: Sequence[str | Path] = (),
    defines: Mapping[str, str] = {},
    extra_flags: Sequence[str] = (),
    cuda_archs: Sequence[str] | str | None = None,
    cache_dir: str | Path | None = None,
    for_op: str | None = None,
    arch_specific: bool = False,
    abi: Mapping[str, str] = {},
) -> Path:
    """Compile and link ``sources`` into one shared library, or reuse a prebuilt or cached one.

    A prebuilt library shipped in the sources' package serves first when it matches
    (:mod:`.prebuilt`; ``abi`` names the tags it must match beyond its sources), then the
    cache, then the compilers run: :meth:`BuildSpec.load_path`, of which this is the
    one-call form.

    .cc/.cpp files are compiled by g++ (``-std=c++17 -O3 -fPIC``), .cu files by nvcc for
    ``cuda_archs`` (default: :func:`detect_cuda_archs`), one object per source, then linked
    with ``-shared``. The directory of each source, ``include_dirs``, xla-kernels' own
    ``include/`` and ``jax.ffi.include_dir()`` are on the include path, and last, after the
    system's, the nanobind/pybind11 stand-ins of :func:`compat_include_dir`.

    The library's identity is its sources and settings: ``name`` names the file (and is
    part of the key), so callers that pass equal arguments share one file. ``for_op`` names
    the op that needs the library, for messages. ``arch_specific`` builds each arch that has
    an architecture-specific variant as that variant (``90`` as ``90a``, see
    :func:`~xla_kernels.builder.toolchain.arch_specific_archs`), for kernels using wgmma and
    the like behind ``__CUDA_ARCH_FEAT_SM90_ALL`` guards.

    The cached library is reused only while every file the compilers read (sources and every
    header they included, wherever it lives) is unchanged, the library file is intact, and the
    compilers, when installed, are the same versions; otherwise it is rebuilt. A cache hit
    runs no compiler and works without one installed and in a read-only cache folder.
    Concurrent builds of the same library (threads or processes) are safe: one builds, the
    others wait for it and use its result.

    Example:
        >>> so = build_library("simple_add", ["simple_add.cc"], platform="cpu",
        ...                    defines={"BLOCK": "128"})        # doctest: +SKIP
        >>> so.name                                             # doctest: +SKIP
        'simple_add-cpu-3f2a9c0d1e4b5a67-0c1d2e3f4a5b.so'

    Returns:
        The path of the built ``.so``, loadable with :class:`ctypes.CDLL`. Its name holds
        the content hash, so a rebuilt library never has the path of an older one.

    Raises:
        BuildError: a source is missing or does not compile (message has the first errors),
            or the library must be built and the cache folder is read-only.
        CompilerNotFoundError: the library must be built and g++ or nvcc is not installed.
    """
    spec = BuildSpec.create(name, sources, platform=platform, include_dirs=include_dirs,
                            defines=defines, extra_flags=extra_flags, cuda_archs=cuda_archs,
                            for_op=for_op, arch_specific=arch_specific, abi=abi)
    return spec.load_path(cache_dir=cache_dir)


def toolchain_report() -> dict[str, Any]:
    """What a ``doctor`` command shows: compilers, CUDA archs, cache and header dirs.

    Each compiler entry is ``{"found": True, "path", "version"}`` or
    ``{"found": False, "error"}`` (the error says how to fix it).

    Example:
        >>> toolchain_report()["cxx"]           # doctest: +SKIP
        {'found': True, 'path': '/usr/bin/g++', 'version': 'g++ 12.2.0'}
    """
    report: dict[str, Any] = {}
    for key, finder in (("cxx", find_cxx), ("nvcc", find_nvcc)):
        try:
            path = finder()
            version = short_version(path, compiler_version(path))
            report[key] = {"found": True, "path": str(path), "version": version}
        except CompilerNotFoundError as e:
            report[key] = {"found": False, "error": str(e)}
    try:
        archs, origin = resolve_cuda_archs(None)
        report["cuda_archs"] = {"archs": archs, "source": origin, "ptx": origin == "fallback"}
    except BuildError as e:
        report["cuda_archs"] = {"archs": [], "source": "error", "error": str(e)}
    report["cache_dir"] = str(default_cache_dir())
    try:
        ffi_dir = ffi_include_dir()
        ffi_ok = (ffi_dir / "xla" / "ffi" / "api" / "ffi.h").is_file()
        report["ffi_include_dir"] = {"path": str(ffi_dir), "found": ffi_ok}
    except ImportError as e:
        report["ffi_include_dir"] = {"path": None, "found": False, "error": str(e)}
    report["package_include_dir"] = str(package_include_dir())
    report["compat_include_dir"] = str(compat_include_dir())
    return report
