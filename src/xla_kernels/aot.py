"""Ahead-of-time builds: a package's op libraries, prebuilt into ``<package>/_prebuilt/``.

``xla-kernels build --aot PACKAGE`` imports ``PACKAGE`` and its submodules, finds every op
they declare with :class:`xla_kernels.Op`, builds each distinct library once per platform
(CUDA for every arch in ``cuda_archs``), and records it in ``PACKAGE/_prebuilt/index.json``
(:mod:`xla_kernels.builder.prebuilt`). Ship that folder as package data: the declarations
then find their libraries there at run time, and users need no compiler. For
``xla_kernels`` itself, the eager FFI runtime, the JAX handler guard and the torch
dispatcher library (for the torch of the running Python) are prebuilt too.

Example:
    $ xla-kernels build --aot my_pkg --cuda-archs 80,90,100
    $ python -m build --wheel        # with my_pkg/_prebuilt/ as package data
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import pkgutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from xla_kernels.builder import BuildSpec, find_nvcc, installed_ffi_include_dir, prebuilt
from xla_kernels.errors import BuildError, CompilerNotFoundError
from xla_kernels.op import declared_ops
from xla_kernels.runtime import eager, guard
from xla_kernels.runtime.library import kernel_spec

#: The archs a wheel's CUDA libraries hold machine code for (arch-specific kernels get the
#: ``a`` variant: sm_90a, sm_100a).
DEFAULT_CUDA_ARCHS = ("80", "90", "100")


def import_package(package: str, note: Callable[[str], None] = print) -> list[str]:
    """Import ``package`` and every submodule; a submodule that needs an uninstalled
    package is skipped with a note. Returns the modules imported."""
    root = importlib.import_module(package)
    done = [package]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=package + "."):
        try:
            importlib.import_module(info.name)
            done.append(info.name)
        except ImportError as e:
            note(f"skipped {info.name}: {e}")
    return done


def package_specs(package: str, platforms: Sequence[str],
                  cuda_archs: Sequence[str]) -> list[BuildSpec]:
    """One spec per distinct library of the ops that ``package`` declares (import it
    first), for each of ``platforms`` the op has a kernel for."""
    specs: dict[BuildSpec, None] = {}
    for op in declared_ops().values():
        if op.module != package and not op.module.startswith(package + "."):
            continue
        for platform in platforms:
            if platform in op.kernels:
                spec = dataclasses.replace(kernel_spec(op, platform), for_op=None)
                if platform == "cuda":
                    spec = dataclasses.replace(spec, cuda_archs=tuple(cuda_archs))
                specs[spec] = None
    return list(specs)


def runtime_specs(with_torch: bool) -> list[BuildSpec]:
    """The eager FFI runtime's and the JAX handler guard's specs and, when ``with_torch``
    and torch imports, the torch dispatcher library's (built against that torch)."""
    specs = [eager.runtime_spec(), guard.guard_spec()]
    if with_torch:
        try:
            from xla_kernels.frontends.torch import native
        except ImportError:
            return specs
        specs.append(native.library_spec())
    return specs


@dataclasses.dataclass(frozen=True)
class Prebuilt:
    """One library written into a prebuilt folder."""

    name: str
    platform: str
    path: Path
    abi: tuple[tuple[str, str], ...]


def prebuild(specs: Iterable[BuildSpec], out: Path, *, ffi_dir: Path | None = None,
             cache_dir: Path | None = None, jobs: int = 2,
             report: Callable[[str], None] = print) -> list[Prebuilt]:
    """Build every spec (``jobs`` at a time) against the FFI headers in ``ffi_dir``
    (default: the installed jaxlib's) and add each library to the prebuilt folder ``out``."""
    ffi_dir = ffi_dir or installed_ffi_include_dir()
    ffi = prebuilt.ffi_api_version(ffi_dir)
    if ffi is None:
        raise BuildError(f"prebuilding: {ffi_dir} holds no xla/ffi/api/c_api.h. Fix: pass "
                         "the include folder of a jaxlib (jax.ffi.include_dir()).")
    specs = list(specs)
    done: list[Prebuilt] = []
    with tempfile.TemporaryDirectory(prefix="xk-aot-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        cache = cache_dir or Path(tmp)
        futures = {pool.submit(spec.build, cache_dir=cache, ffi_dir=ffi_dir): spec
                   for spec in specs}
        for future in concurrent.futures.as_completed(futures):
            spec = futures[future]
            path, deps = future.result()
            want = spec.wanted(archs=spec.wanted_archs(), ffi=ffi)
            written = prebuilt.add(out, want, path, deps)
            archs = "".join(f", sm_{a}" for a in want.archs)
            report(f"{spec.name} [{spec.platform}{archs}] -> {written} "
                   f"({written.stat().st_size / 2**20:.1f} MiB)")
            done.append(Prebuilt(spec.name, spec.platform, written, spec.abi))
    return done


def default_platforms() -> list[str]:
    """``cpu``, and ``cuda`` where nvcc is installed."""
    try:
        find_nvcc()
        return ["cpu", "cuda"]
    except CompilerNotFoundError:
        return ["cpu"]


def build_aot(package: str, *, out: Path | None = None, platforms: Sequence[str] = (),
              cuda_archs: Sequence[str] = DEFAULT_CUDA_ARCHS, ffi_dir: Path | None = None,
              only: Sequence[str] = (), cache_dir: Path | None = None, jobs: int = 2,
              report: Callable[[str], None] = print) -> list[Prebuilt]:
    """``xla-kernels build --aot``: prebuild ``package``'s libraries into ``out`` (default
    ``<package>/_prebuilt``). ``only`` keeps the libraries of those names (e.g.
    ``xk_torch_native`` to add the torch dispatcher of another torch).

    Example:
        >>> build_aot("my_pkg", cuda_archs=["80", "90"])              # doctest: +SKIP
        [Prebuilt(name='scale', platform='cpu', path=PosixPath('.../my_pkg/_prebuilt/...'), ...]
    """
    import_package(package, note=report)
    module: Any = sys.modules[package]
    if out is None:
        out = Path(module.__file__).parent / prebuilt.PREBUILT_DIR
    specs = package_specs(package, list(platforms) or default_platforms(), cuda_archs)
    if package == "xla_kernels":
        specs += runtime_specs(with_torch=True)
    if only:
        specs = [s for s in specs if s.name in only]
    if not specs:
        raise BuildError(f"prebuilding {package}: it declares no op with a kernel for "
                         f"{', '.join(platforms) or 'this machine'}"
                         + (f" named {', '.join(only)}" if only else "")
                         + ". Fix: pass the package that declares the ops (xk.Op).")
    return prebuild(specs, out, ffi_dir=ffi_dir, cache_dir=cache_dir, jobs=jobs,
                    report=report)
