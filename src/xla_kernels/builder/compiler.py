"""Compile commands, running them with a progress line, and turning failures into BuildError.

Example:
    >>> gencode_flags(["90a"], ptx=False)
    ['-gencode=arch=compute_90a,code=sm_90a']
    >>> gencode_flags(["80", "90"], ptx=True)[-1]
    '-gencode=arch=compute_90,code=compute_90'
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self, TextIO

from .. import env
from ..errors import BuildError

CXX_FLAGS = ("-std=c++17", "-O3", "-fPIC")
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "-lineinfo")
CXX_SUFFIXES = (".cc", ".cpp", ".cxx", ".c++")
CUDA_SUFFIXES = (".cu",)

#: How many lines of compiler output a BuildError message shows (all of it is on the error).
MAX_OUTPUT_LINES = 100


@dataclass(frozen=True)
class Step:
    """One compiler invocation; ``compiler`` is a label such as ``"nvcc 13.0"``."""

    argv: tuple[str, ...]
    compiler: str


# --------------------------------------------------------------------------- commands


def gencode_flags(archs: Sequence[str], *, ptx: bool) -> list[str]:
    """``-gencode`` flags: SASS per arch, plus PTX of the newest arch when ``ptx``. The PTX
    is always the generic one (``compute_90``, not ``compute_90a``): arch-specific PTX can
    be JIT-compiled for that one arch only, which defeats embedding it.

    Example:
        >>> gencode_flags(["80", "90a"], ptx=True)[-1]
        '-gencode=arch=compute_90,code=compute_90'
    """
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    if ptx and archs:
        newest = max(archs, key=lambda a: int(re.match(r"\d+", a).group()))  # type: ignore[union-attr]
        generic = re.match(r"\d+", newest).group()  # type: ignore[union-attr]
        flags.append(f"-gencode=arch=compute_{generic},code=compute_{generic}")
    return flags


def cuda_include_dir(nvcc: Path) -> Path | None:
    """The CUDA toolkit's include dir (for .cc files in a CUDA library), or None."""
    candidates = [Path(nvcc).resolve().parent.parent / "include"]
    candidates += [Path(env.get(v)) / "include" for v in ("CUDA_HOME", "CUDA_PATH")
                   if env.get(v)]
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda_runtime.h").is_file()), None)


def common_flags(
    include_dirs: Sequence[Path], defines: Mapping[str, str], extra_flags: Sequence[str]
) -> list[str]:
    """``-I`` per include dir (deduplicated, in order), sorted ``-DK=V``, then extra flags."""
    flags = [f"-I{d}" for d in dict.fromkeys(include_dirs)]
    flags += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    return flags + list(extra_flags)


def plan_steps(
    sources: Sequence[Path],
    *,
    platform: str,
    out: Path,
    obj_dir: Path,
    flags: Sequence[str],
    cxx: tuple[Path, str] | None,
    nvcc: tuple[Path, str] | None,
    gencode: Sequence[str] = (),
    cxx_cuda_include: Path | None = None,
    fallback_include: Path | None = None,
) -> list[Step]:
    """The compiler invocations that build ``sources`` into the shared library ``out``.

    ``cxx``/``nvcc`` are ``(path, label)`` pairs. Each source is compiled on its own into
    ``obj_dir/<i>_<stem>.o`` with ``-MMD -MF obj_dir/<i>_<stem>.d``, so the compiler
    writes down every header it read (nvcc accepts a depfile only with one input per
    command); .cc files go to g++ (with the CUDA include dir in CUDA builds), .cu files to
    nvcc. A last step links the objects: g++ for CPU, nvcc for CUDA. ``flags`` (includes,
    defines, extra flags) go to every command, so link flags such as ``-lfoo`` work too.
    ``fallback_include`` is searched last, after the system's own include dirs
    (``-idirafter``; through ``-Xcompiler`` for nvcc), so any other header of the same
    name wins over it.

    Example:
        >>> steps = plan_steps([Path("/s/a.cc")], platform="cpu", out=Path("/o/a.so"),
        ...                    obj_dir=Path("/t"), flags=[], cxx=(Path("g++"), "g++ 12"),
        ...                    nvcc=None)
        >>> [s.argv[-4:] for s in steps][0], steps[1].argv[-3:]
        (('-c', '/s/a.cc', '-o', '/t/0_a.o'), ('/t/0_a.o', '-o', '/o/a.so'))
    """
    if platform == "cuda":
        assert nvcc is not None
    else:
        assert cxx is not None
    nvcc_base = [str(nvcc[0]), *NVCC_FLAGS, *gencode] if nvcc else []
    cuda_inc = [f"-I{cxx_cuda_include}"] if cxx_cuda_include else []
    after_cxx = ["-idirafter", str(fallback_include)] if fallback_include else []
    after_nvcc = ["-Xcompiler", f"-idirafter,{fallback_include}"] if fallback_include else []
    steps: list[Step] = []
    objects: list[str] = []
    for i, src in enumerate(sources):
        obj = obj_dir / f"{i}_{src.stem}.o"
        objects.append(str(obj))
        dep = ["-MMD", "-MF", str(depfile_of(obj))]
        if src.suffix in CUDA_SUFFIXES:
            assert nvcc is not None
            steps.append(Step((*nvcc_base, *flags, *after_nvcc, *dep, "-c", str(src), "-o",
                               str(obj)), nvcc[1]))
        else:
            assert cxx is not None
            argv = (str(cxx[0]), *CXX_FLAGS, *flags, *cuda_inc, *after_cxx, *dep, "-c",
                    str(src), "-o", str(obj))
            steps.append(Step(argv, cxx[1]))
    if platform == "cuda":
        assert nvcc is not None
        link = (str(nvcc[0]), "-shared", "-Xcompiler", "-fPIC", *objects, *flags, "-o",
                str(out))
        steps.append(Step(link, nvcc[1]))
    else:
        assert cxx is not None
        link = (str(cxx[0]), *CXX_FLAGS, "-shared", *objects, *flags, "-o", str(out))
        steps.append(Step(link, cxx[1]))
    return steps


def depfile_of(obj: Path) -> Path:
    """The depfile written beside object ``obj`` (``x.o`` -> ``x.d``)."""
    return obj.with_suffix(".d")


# --------------------------------------------------------------------------- errors

_GCC_ERROR = re.compile(r"^(?P<loc>\S.*?:\d+(?::\d+)?): (?:fatal )?error: (?P<msg>.*)$")
_NVCC_ERROR = re.compile(
    r"^(?P<file>\S.*?)\((?P<line>\d+)\): (?:catastrophic )?error(?: #?[\w-]+)?: (?P<msg>.*)$"
)


def first_errors(output: str, limit: int = 5) -> list[str]:
    """The first error lines of compiler ``output``, each as ``file:line[:col]: error: ...``.

    Understands g++ (``a.cc:3:5: error: ...``) and nvcc (``a.cu(3): error: ...``); falls
    back to lines mentioning "error" (e.g. linker errors), then to the first lines.

    Example:
        >>> first_errors('k.cu(7): error: identifier "y" is undefined')
        ['k.cu:7: error: identifier "y" is undefined']
    """
    found: list[str] = []
    for line in output.splitlines():
        if m := _GCC_ERROR.match(line):
            found.append(f"{m['loc']}: error: {m['msg']}")
        elif m := _NVCC_ERROR.match(line):
            found.append(f"{m['file']}:{m['line']}: error: {m['msg']}")
    if not found:
        found = [ln for ln in output.splitlines() if re.search(r"\berror\b", ln, re.IGNORECASE)]
    if not found:
        found = [ln for ln in output.splitlines() if ln.strip()]
    return found[:limit]


def build_error(name: str, platform: str, step: Step, output: str, problem: str, *,
                what: str | None = None) -> BuildError:
    """A BuildError naming library, platform and compiler, with the first errors up front.

    ``what`` replaces ``'<name>'`` in the message, e.g. ``'k' (the cpu kernel of op x)``.
    """
    lines = output.rstrip().splitlines()
    shown = lines[:MAX_OUTPUT_LINES]
    if len(lines) > MAX_OUTPUT_LINES:
        shown.append(f"[... {len(lines) - MAX_OUTPUT_LINES} more lines in "
                     "BuildError.compiler_output]")
    errors = first_errors(output)
    what = what or f"'{name}'"
    head = f"building {what} for {platform} failed: {step.compiler} ({step.argv[0]}) {problem}."
    parts = [head]
    if errors:
        parts += ["First errors:", *(f"  {e}" for e in errors)]
    parts += [f"Command: {shlex.join(step.argv)}", "Compiler output:", *shown]
    return BuildError("\n".join(parts), compiler_output=output, command=list(step.argv))


def run_steps(steps: Sequence[Step], *, name: str, platform: str,
              what: str | None = None) -> None:
    """Run each step in order; the first failure raises :class:`BuildError` (``what``: as
    for :func:`build_error`)."""
    for step in steps:
        try:
            proc = subprocess.run(
                list(step.argv), check=False, capture_output=True, text=True,
                errors="replace", stdin=subprocess.DEVNULL,
            )
        except OSError as e:
            raise build_error(name, platform, step, str(e), "could not be started",
                              what=what) from e
        if proc.returncode != 0:
            output = proc.stdout + proc.stderr
            raise build_error(name, platform, step, output, f"exited with {proc.returncode}",
                              what=what)


# --------------------------------------------------------------------------- progress


def quiet() -> bool:
    """True when ``$XLA_KERNELS_QUIET`` is set to something other than 0/false/no."""
    return env.is_set("XLA_KERNELS_QUIET")


class Progress:
    """Prints ``xla-kernels: <what>...`` once a block has run ``delay`` s, then how it ended.

    Nothing is printed for blocks that finish sooner, or when :func:`quiet`. Setting
    ``result`` inside the block replaces the closing ``done in N s`` with that text (``{s}``
    becomes the seconds), for blocks that turned out to do something else, e.g. wait.

    Example:
        >>> with Progress("building demo for cpu (g++ 12.2.0)"):
        ...     pass                           # fast: prints nothing
    """

    def __init__(self, what: str, delay: float = 1.0, stream: TextIO | None = None):
        self.what, self.delay, self.stream = what, delay, stream
        self._lock = threading.Lock()
        self._shown = False
        self._done = False
        self._timer: threading.Timer | None = None
        self._start = 0.0
        self.result: str | None = None

    def _print(self, text: str) -> None:
        stream = self.stream or sys.stderr
        print(f"xla-kernels: {text}", file=stream, flush=True)

    def _announce(self) -> None:
        with self._lock:
            if not self._done:
                self._shown = True
                self._print(f"{self.what}...")

    def __enter__(self) -> Self:
        self._start = time.monotonic()
        if not quiet():
            self._timer = threading.Timer(self.delay, self._announce)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._done = True
            if self._shown:
                took = f"{time.monotonic() - self._start:.1f}"
                if self.result is not None and not exc_type:
                    self._print(f"... {self.result.format(s=took)}")
                else:
                    outcome = "failed after" if exc_type else "done in"
                    self._print(f"... {outcome} {took} s")
