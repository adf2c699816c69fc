"""Build C++/CUDA sources into a cached shared library of XLA FFI handlers.

Example:
    >>> from xla_kernels.builder import build_library
    >>> so = build_library("simple_add", ["simple_add.cc"], platform="cpu")  # doctest: +SKIP
    >>> import ctypes; ctypes.CDLL(str(so)).SimpleAdd                       # doctest: +SKIP

The library lands in :func:`default_cache_dir` under a name keyed by the content of the
sources and headers, the flags, the compiler and the FFI headers; a second call with the
same inputs returns the cached file without running a compiler.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ..errors import BuildError, CompilerNotFoundError
from .cache import compute_key, default_cache_dir, install_once, output_path
from .compiler import (
    CUDA_SUFFIXES,
    CXX_SUFFIXES,
    Progress,
    Step,
    common_flags,
    cuda_include_dir,
    gencode_flags,
    plan_steps,
    run_steps,
)
from .toolchain import (
    compiler_version,
    detect_cuda_archs,
    find_cxx,
    find_nvcc,
    resolve_cuda_archs,
    short_version,
)

__all__ = [
    "build_library",
    "default_cache_dir",
    "detect_cuda_archs",
    "find_cxx",
    "find_nvcc",
    "toolchain_report",
]

Platform = Literal["cpu", "cuda"]

#: Environment variables the compilers read that change what they produce; part of the key.
_ENV_AFFECTING_BUILDS = (
    "CPATH", "CPLUS_INCLUDE_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN",
)


def ffi_include_dir() -> Path:
    """jaxlib's bundled headers (``xla/ffi/api/ffi.h``), i.e. ``jax.ffi.include_dir()``."""
    import jax.ffi  # imported lazily: only needed when building

    return Path(jax.ffi.include_dir())


def package_include_dir() -> Path:
    """``src/xla_kernels/include``: headers shipped with xla-kernels (same dir as
    ``Path(xla_kernels.__file__).parent / "include"``)."""
    return Path(__file__).resolve().parent.parent / "include"


def _check_sources(name: str, platform: str, sources: Sequence[str | Path]) -> list[Path]:
    """Absolute source paths; BuildError for missing files, unknown kinds, .cu on cpu."""
    if platform not in ("cpu", "cuda"):
        raise BuildError(f"building '{name}': unknown platform {platform!r}. "
                         "Fix: use platform='cpu' or platform='cuda'.")
    if isinstance(sources, (str, Path)):
        sources = [sources]
    if not sources:
        raise BuildError(f"building '{name}' for {platform}: no source files given.")
    paths = [Path(s).expanduser().resolve() for s in sources]
    for path in paths:
        if not path.is_file():
            raise BuildError(f"building '{name}' for {platform}: source file not found: {path}. "
                             "Fix: check the path (relative paths are taken from the current "
                             "directory).")
        if path.suffix not in CXX_SUFFIXES + CUDA_SUFFIXES:
            raise BuildError(f"building '{name}' for {platform}: don't know how to compile "
                             f"{path} (expected {', '.join(CXX_SUFFIXES + CUDA_SUFFIXES)}).")
        if platform == "cpu" and path.suffix in CUDA_SUFFIXES:
            raise BuildError(f"building '{name}' for cpu: {path} is a CUDA source. "
                             "Fix: build it with platform='cuda', or leave it out of cpu builds.")
    return list(dict.fromkeys(paths))


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
) -> Path:
    """Compile and link ``sources`` into one shared library, or reuse the cached one.

    .cc/.cpp files are compiled by g++ (``-std=c++17 -O3 -fPIC -shared``), .cu files by nvcc
    for ``cuda_archs`` (default: :func:`detect_cuda_archs`). The directory of each source,
    ``include_dirs``, xla-kernels' own ``include/`` and ``jax.ffi.include_dir()`` are on
    the include path. Concurrent builds of the same library (threads or processes) are safe.

    Example:
        >>> so = build_library("simple_add", ["simple_add.cc"], platform="cpu",
        ...                    defines={"BLOCK": "128"})        # doctest: +SKIP
        >>> so.name                                             # doctest: +SKIP
        'simple_add-cpu-3f2a9c0d1e4b5a67.so'

    Returns:
        The path of the built ``.so``, loadable with :class:`ctypes.CDLL`.

    Raises:
        BuildError: a source is missing or does not compile (message has the first errors).
        CompilerNotFoundError: g++ or nvcc is not installed, with how to get it.
    """
    srcs = _check_sources(name, platform, sources)
    ffi_dir, pkg_dir = ffi_include_dir(), package_include_dir()
    incs = [s.parent for s in srcs] + [Path(d).expanduser().resolve() for d in include_dirs]
    flags = common_flags([*incs, pkg_dir, ffi_dir], defines, extra_flags)

    need_cxx = platform == "cpu" or any(s.suffix in CXX_SUFFIXES for s in srcs)
    cxx = nvcc = None
    versions: list[str] = []
    if need_cxx:
        path = find_cxx()
        versions.append(compiler_version(path))
        cxx = (path, short_version(path, versions[-1]))
    gencode: list[str] = []
    target = ""
    if platform == "cuda":
        path = find_nvcc()
        versions.append(compiler_version(path))
        nvcc = (path, short_version(path, versions[-1]))
        archs, origin = resolve_cuda_archs(cuda_archs)
        gencode = gencode_flags(archs, ptx=origin == "fallback")
        target = ", " + ", ".join(f"sm_{a}" for a in archs) + (" + PTX" * (origin == "fallback"))
    cuda_inc = cuda_include_dir(nvcc[0]) if nvcc and need_cxx else None

    def plan(out: Path, obj_dir: Path) -> list[Step]:
        return plan_steps(srcs, platform=platform, out=out, obj_dir=obj_dir, flags=flags,
                          cxx=cxx, nvcc=nvcc, gencode=gencode, cxx_cuda_include=cuda_inc)

    template = plan(Path("<out>"), Path("<obj_dir>"))
    env = [f"{k}={os.environ[k]}" for k in _ENV_AFFECTING_BUILDS if k in os.environ]
    key = compute_key(sources=srcs, package_include_dir=pkg_dir, ffi_include_dir=ffi_dir,
                      commands=[s.argv for s in template], compiler_versions=versions,
                      environment=env)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cache = cache.absolute()
    out = output_path(cache, name, platform, key)
    if out.exists():
        return out
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"building '{name}' for {platform}: cannot create cache dir {cache} "
                         f"({e}). Fix: set XLA_KERNELS_CACHE_DIR to a writable directory.") from e

    def build(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(dir=cache, prefix=".obj-") as obj_dir:
            run_steps(plan(tmp, Path(obj_dir)), name=name, platform=platform)

    label = nvcc[1] if nvcc else cxx[1] if cxx else "?"
    with Progress(f"building {name} for {platform} ({label}{target})"):
        install_once(out, build)
    return out


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
    return report
