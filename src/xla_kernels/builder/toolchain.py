"""Finding compilers, reading their versions, and choosing CUDA architectures.

Example:
    >>> from xla_kernels.builder.toolchain import find_cxx, compiler_version, short_version
    >>> cxx = find_cxx()                       # doctest: +SKIP
    >>> short_version(cxx, compiler_version(cxx))   # doctest: +SKIP
    'g++ 12.2.0'
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import re
import shutil
import site
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import env
from ..errors import BuildError, CompilerNotFoundError

#: Used when neither the caller, the environment, nor ``nvidia-smi`` names an architecture.
FALLBACK_CUDA_ARCHS = ("80", "90")

_ARCH_RE = re.compile(r"^\d{2,3}[af]?$")

#: Architectures whose architecture-specific feature set (``sm_90a``: wgmma, setmaxnreg...)
#: nvcc can target; :func:`arch_specific_archs` maps them to their ``a`` variant.
ARCH_SPECIFIC_CUDA_ARCHS = frozenset({"90", "100", "120"})

#: The conventional CUDA toolkit location, looked at after PATH and $CUDA_HOME/$CUDA_PATH.
STANDARD_NVCC = Path("/usr/local/cuda/bin/nvcc")


# --------------------------------------------------------------------------- compilers


def _executable(candidate: str | Path) -> Path | None:
    """Resolve ``candidate`` (a name on PATH or a path) to an executable file, or None."""
    found = shutil.which(str(candidate))
    return Path(found).absolute() if found else None


def _wheel_nvccs() -> list[Path]:
    """``nvidia/*/bin/nvcc`` inside every site-packages directory (pip ``nvidia-cuda-nvcc``)."""
    roots: list[str] = []
    with contextlib.suppress(AttributeError):  # some virtualenv flavours lack it
        roots += site.getsitepackages()
    roots.append(site.getusersitepackages())
    roots += [p for p in sys.path if p.endswith("site-packages")]
    seen: dict[str, None] = {}
    for root in roots:
        for hit in sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", "nvcc"))):
            seen.setdefault(hit, None)
    return [Path(p) for p in seen]


def find_nvcc() -> Path:
    """Locate ``nvcc``.

    Order: ``$XLA_KERNELS_NVCC``, ``nvcc`` on PATH, ``$CUDA_HOME/bin/nvcc``,
    ``$CUDA_PATH/bin/nvcc``, ``/usr/local/cuda/bin/nvcc``, then pip wheels
    (``site-packages/nvidia/*/bin/nvcc``). An ``$XLA_KERNELS_NVCC`` that does not point
    at an executable is an error rather than silently skipped.

    Example:
        >>> find_nvcc()                        # doctest: +SKIP
        PosixPath('/usr/local/cuda/bin/nvcc')

    Raises:
        CompilerNotFoundError: listing every place looked at and how to fix it.
    """
    override = env.get("XLA_KERNELS_NVCC")
    if override:
        found = _executable(override)
        if found is None:
            raise CompilerNotFoundError(
                f"XLA_KERNELS_NVCC={override!r} is not an executable file. "
                "Fix: point XLA_KERNELS_NVCC at an nvcc binary, or unset it to search PATH."
            )
        return found

    looked: list[str] = ["nvcc on PATH"]
    found = _executable("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = env.get(var)
        if root:
            looked.append(f"${var}/bin/nvcc ({root}/bin/nvcc)")
            found = _executable(Path(root) / "bin" / "nvcc")
            if found:
                return found
        else:
            looked.append(f"${var}/bin/nvcc (${var} not set)")
    looked.append(str(STANDARD_NVCC))
    found = _executable(STANDARD_NVCC)
    if found:
        return found
    looked.append("site-packages/nvidia/*/bin/nvcc (pip nvidia-cuda-nvcc)")
    for wheel in _wheel_nvccs():
        found = _executable(wheel)
        if found:
            return found
    raise CompilerNotFoundError(
        "Could not find the CUDA compiler nvcc. Looked at: "
        + "; ".join(looked)
        + ". Fix: install the CUDA toolkit (and put its bin/ on PATH or set CUDA_HOME), "
        "or `pip install nvidia-cuda-nvcc`, or set XLA_KERNELS_NVCC=/path/to/nvcc."
    )


def find_cxx() -> Path:
    """Locate the host C++ compiler: ``$CXX``, then ``g++``, then ``c++`` on PATH.

    ``$CXX`` must be a single executable (name or path); a ``$CXX`` that does not
    resolve is an error rather than silently skipped.

    Example:
        >>> find_cxx()                         # doctest: +SKIP
        PosixPath('/usr/bin/g++')

    Raises:
        CompilerNotFoundError: naming what was tried and how to fix it.
    """
    override = env.get("CXX")
    if override:
        found = _executable(override)
        if found is None:
            raise CompilerNotFoundError(
                f"CXX={override!r} is not an executable file. "
                "Fix: set CXX to a C++17 compiler such as g++, or unset it to search PATH."
            )
        return found
    for name in ("g++", "c++"):
        found = _executable(name)
        if found:
            return found
    raise CompilerNotFoundError(
        "Could not find a C++ compiler: $CXX is not set and neither g++ nor c++ is on PATH. "
        "Fix: install g++ (e.g. `apt-get install g++`) or set CXX=/path/to/compiler."
    )


@functools.cache
def _version_output(path: str, _mtime_ns: int, _size: int) -> str:
    try:
        proc = subprocess.run(
            [path, "--version"], check=False, capture_output=True, text=True,
            errors="replace", timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise CompilerNotFoundError(
            f"{path} could not be run ({e}). Fix: check the compiler installation."
        ) from e
    return (proc.stdout + proc.stderr).strip()


def compiler_version(compiler: Path) -> str:
    """Full ``--version`` output of ``compiler``; remembered per binary for this process.

    Remembering it lets a cache hit finish without running any compiler.
    """
    st = Path(compiler).stat()
    return _version_output(str(compiler), st.st_mtime_ns, st.st_size)


def short_version(compiler: Path, version_text: str) -> str:
    """A short ``"<name> <version>"`` such as ``"nvcc 13.0"`` or ``"g++ 12.2.0"``."""
    first_line = version_text.splitlines()[0] if version_text else ""
    patterns = (
        (r"release (\d+\.\d+)", version_text),  # nvcc: "Cuda compilation tools, release 13.0"
        (r"(\d+\.\d+(?:\.\d+)?)\s*$", first_line),  # gcc: "g++ (Debian ...) 12.2.0"
        (r"version (\d+\.\d+(?:\.\d+)?)", version_text),  # clang: "clang version 17.0.6"
    )
    for pattern, text in patterns:
        m = re.search(pattern, text)
        if m:
            return f"{Path(compiler).name} {m.group(1)}"
    return Path(compiler).name


# --------------------------------------------------------------------------- CUDA archs


def normalize_arch(arch: str) -> str:
    """Turn ``"90"``, ``"sm_90a"``, ``"compute_90"`` or ``"9.0"`` into ``"90"``/``"90a"``.

    Example:
        >>> normalize_arch("sm_90a"), normalize_arch("8.6")
        ('90a', '86')
    """
    a = str(arch).strip().lower()
    for prefix in ("sm_", "compute_"):
        a = a.removeprefix(prefix)
    if re.fullmatch(r"\d+\.\d[af]?", a):
        a = a.replace(".", "")
    if not _ARCH_RE.match(a):
        raise BuildError(
            f"invalid CUDA architecture {arch!r}. Fix: use a compute capability such as "
            "'90', '90a' or '80' (in cuda_archs or XLA_KERNELS_CUDA_ARCHS)."
        )
    return a


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


@functools.lru_cache(maxsize=1)
def _nvidia_smi_archs() -> tuple[str, ...]:
    """Compute capabilities of the visible GPUs via nvidia-smi; empty on any failure."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            check=False, capture_output=True, text=True, timeout=15,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    if proc.returncode != 0:
        return ()
    archs: list[str] = []
    for line in proc.stdout.splitlines():
        try:
            archs.append(normalize_arch(line))
        except BuildError:
            continue
    return tuple(_dedupe(archs))


def resolve_cuda_archs(explicit: Sequence[str] | str | None = None) -> tuple[list[str], str]:
    """Pick the architectures to build for and say where they came from.

    ``explicit`` may be a list or a comma-separated string.
    Order: ``explicit`` > ``$XLA_KERNELS_CUDA_ARCHS`` > ``nvidia-smi`` > fallback.
    The source is one of ``"argument"``, ``"env"``, ``"nvidia-smi"``, ``"fallback"``;
    only the fallback also embeds PTX.

    Example:
        >>> resolve_cuda_archs(["sm_90a"])
        (['90a'], 'argument')
    """
    if explicit is not None:
        if isinstance(explicit, str):
            explicit = explicit.split(",")
        archs = _dedupe([normalize_arch(a) for a in explicit if str(a).strip()])
        if not archs:
            raise BuildError("cuda_archs is empty. Fix: pass e.g. ['90'] or None for auto.")
        return archs, "argument"
    listed = (env.get("XLA_KERNELS_CUDA_ARCHS") or "").strip()
    if listed:
        return _dedupe([normalize_arch(a) for a in listed.split(",") if a.strip()]), "env"
    smi = _nvidia_smi_archs()
    if smi:
        return list(smi), "nvidia-smi"
    return list(FALLBACK_CUDA_ARCHS), "fallback"


def arch_specific_archs(archs: Sequence[str]) -> list[str]:
    """``archs`` with each arch that has an architecture-specific variant built as it
    (``"90"`` -> ``"90a"``); others, and archs already suffixed, are kept. For kernels that
    use such features (wgmma on Hopper) behind ``__CUDA_ARCH_FEAT_SM90_ALL`` guards: code
    for ``sm_90a`` runs only on compute capability 9.0 exactly, which is what ``90`` means.

    Example:
        >>> arch_specific_archs(["80", "90", "100a", "89"])
        ['80', '90a', '100a', '89']
    """
    return _dedupe([f"{a}a" if a in ARCH_SPECIFIC_CUDA_ARCHS else a
                    for a in (normalize_arch(x) for x in archs)])


def detect_cuda_archs() -> list[str]:
    """Architectures to build CUDA code for when the caller does not say.

    ``$XLA_KERNELS_CUDA_ARCHS`` (e.g. ``"90a,80"``), else the visible GPUs' compute
    capability from ``nvidia-smi``, else ``["80", "90"]`` (builds then also embed PTX).

    Example:
        >>> detect_cuda_archs()                # doctest: +SKIP
        ['90']
    """
    return resolve_cuda_archs(None)[0]
