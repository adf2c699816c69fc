"""Prebuilt libraries shipped inside a package: finding, verifying and writing them.

A package that declares ops (xla-kernels itself, or a user's ``my_pkg``) may carry, next to
its sources, a folder ``<package>/_prebuilt/`` with built libraries and one ``index.json``
describing them (``xla-kernels build --aot PACKAGE`` writes both). A library is looked up
there before the build cache (see :class:`xla_kernels.builder.BuildSpec`), and an entry is
used only when all of these hold:

* same library name and platform, same sources (their paths inside the package and their
  content), same defines and flags (flags that name a path on the building machine, such
  as ``-I/...`` or ``-L/...``, are left out: what they pointed at is covered below);
* every header the compilers read inside the package still has its recorded hash;
* the same ``abi`` tags (e.g. the torch build and the Python ABI a torch extension needs);
* the XLA FFI API it was built against is served by the installed jaxlib (same major
  version, minor version not newer than the installed headers');
* for CUDA, its architectures cover the wanted ones (``90a`` covers ``90``);
* the library file has its recorded size and sha256.

Headers outside the package (jaxlib's FFI headers, torch's, CUDA's, the system's) are not
hashed: the FFI version and the ``abi`` tags stand for them.

Example:
    >>> portable_flags(["-O2", "-I/home/me/inc", "-DX=1", "-L", "/usr/lib"])
    ['-O2', '-DX=1']
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import env
from ..errors import BuildError
from .cache import file_sha256, write_atomically

#: The folder inside a package that holds its prebuilt libraries and their index.
PREBUILT_DIR = "_prebuilt"
INDEX = "index.json"
#: Bump when the index's meaning changes; an index of another format is ignored.
FORMAT = "xla-kernels-prebuilt-1"

#: Flags followed by a separate path argument (``-I /x``), dropped with it.
_PATH_FLAGS = ("-I", "-L", "-isystem", "-idirafter", "-include", "-Xlinker")
#: An absolute path inside a flag: at its start, after ``-X`` letters, or after ``=``/``,``.
_ABS = re.compile(r'(^|^-[A-Za-z_]+|[=,"])/')


def portable_flags(flags: Iterable[str]) -> list[str]:
    """``flags`` without those that name an absolute path on the building machine.

    Example:
        >>> portable_flags(["-Wl,-rpath,/opt/torch/lib", "-ltorch", "-std=c++20"])
        ['-ltorch', '-std=c++20']
    """
    out: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
            continue
        if flag in _PATH_FLAGS:
            skip = True
            continue
        if _ABS.search(flag):
            continue
        out.append(flag)
    return out


def package_root(path: Path) -> Path | None:
    """The folder of the top-level package that holds ``path`` (the highest folder above
    it with an ``__init__.py``), or None when ``path`` lies in no package.

    Example:
        >>> import xla_kernels
        >>> package_root(Path(xla_kernels.__file__)).name
        'xla_kernels'
    """
    found = None
    for parent in Path(path).resolve().parents:
        if (parent / "__init__.py").is_file():
            found = parent
        elif found is not None:
            break
    return found


def ffi_api_version(ffi_include_dir: Path) -> tuple[int, int] | None:
    """``(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR)`` read from ``xla/ffi/api/c_api.h``, or None.

    Example:
        >>> ffi_api_version(Path("/nonexistent")) is None
        True
    """
    try:
        text = (Path(ffi_include_dir) / "xla" / "ffi" / "api" / "c_api.h").read_text()
    except OSError:
        return None
    major = re.search(r"#define\s+XLA_FFI_API_MAJOR\s+(\d+)", text)
    minor = re.search(r"#define\s+XLA_FFI_API_MINOR\s+(\d+)", text)
    if not (major and minor):
        return None
    return int(major.group(1)), int(minor.group(1))


def archs_cover(built: Sequence[str], wanted: Sequence[str]) -> bool:
    """Whether a library with machine code for ``built`` runs on every arch in ``wanted``
    (``90a`` code runs on compute capability 9.0, as ``90`` code does).

    Example:
        >>> archs_cover(["80", "90a"], ["90"]), archs_cover(["80"], ["90"])
        (True, False)
    """
    have = set(built) | {a[:-1] for a in built if a.endswith("a")}
    return all(w in have or w.rstrip("af") in have for w in wanted)


@functools.lru_cache(maxsize=4096)
def _sha256(path: str, _mtime_ns: int, _size: int) -> str:
    return file_sha256(Path(path))


def cached_sha256(path: Path) -> str:
    """sha256 of ``path``, computed once per process for the same mtime and size."""
    st = path.stat()
    return _sha256(str(path), st.st_mtime_ns, st.st_size)


@dataclasses.dataclass(frozen=True)
class Wanted:
    """What a library must be to serve this process: from a :class:`BuildSpec` plus the
    installed FFI version and, for CUDA, the wanted archs."""

    name: str
    platform: str
    sources: tuple[Path, ...]
    defines: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]
    abi: tuple[tuple[str, str], ...]
    ffi: tuple[int, int] | None
    archs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Match:
    """A prebuilt library that serves, or why none does (``path`` None)."""

    path: Path | None
    reason: str


def _relative(path: Path, root: Path) -> str | None:
    try:
        return Path(path).resolve().relative_to(root.parent).as_posix()
    except ValueError:
        return None


def read_index(prebuilt_dir: Path) -> list[dict[str, Any]] | None:
    """The entries of ``<prebuilt_dir>/index.json``, or None when it is absent or unreadable."""
    try:
        data = json.loads((prebuilt_dir / INDEX).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    entries = data.get("entries")
    return entries if isinstance(entries, list) else None


def _describe_abi(abi: Mapping[str, str] | Sequence[Sequence[str]]) -> str:
    items = abi.items() if isinstance(abi, Mapping) else abi
    return ", ".join(f"{k} {v}" for k, v in items) or "no ABI tags"


def _mismatch(entry: Mapping[str, Any], want: Wanted, root: Path) -> str | None:
    """Why ``entry`` cannot serve ``want`` (None when it can), cheapest checks first."""
    if sorted(entry["defines"].items()) != sorted(want.defines):
        return "it was built with other defines"
    if entry["flags"] != portable_flags(want.flags):
        return "it was built with other flags"
    if sorted(entry["abi"].items()) != sorted(want.abi):
        return (f"it was built for {_describe_abi(sorted(entry['abi'].items()))}, this "
                f"process has {_describe_abi(want.abi)}")
    built_ffi = tuple(entry["ffi"])
    if want.ffi is None:
        return "the installed jaxlib's XLA FFI headers (c_api.h) were not found"
    if built_ffi[0] != want.ffi[0] or built_ffi[1] > want.ffi[1]:
        return (f"it was built against XLA FFI API {built_ffi[0]}.{built_ffi[1]}, the "
                f"installed jaxlib has {want.ffi[0]}.{want.ffi[1]}")
    if want.platform == "cuda" and not archs_cover(entry["archs"], want.archs):
        return (f"it holds code for {', '.join('sm_' + a for a in entry['archs'])}, this "
                f"process wants {', '.join('sm_' + a for a in want.archs)}")
    for rel, digest in entry["dependencies"].items():
        path = root.parent / rel
        try:
            if cached_sha256(path) != digest:
                return f"{rel} changed since it was built"
        except OSError:
            return f"{rel} is gone"
    return None


def find(want: Wanted) -> Match:
    """The prebuilt library of ``want``'s package that serves it, verified, or why none.

    Example:
        >>> find(Wanted("x", "cpu", (Path("/nonexistent/x.cc"),), (), (), (), (0, 3), ()))
        Match(path=None, reason='/nonexistent/x.cc lies in no Python package')
    """
    root = package_root(want.sources[0])
    if root is None:
        return Match(None, f"{want.sources[0]} lies in no Python package")
    folder = root / PREBUILT_DIR
    entries = read_index(folder)
    if entries is None:
        return Match(None, f"package {root.name} ships no prebuilt libraries "
                           f"({folder / INDEX} is missing)")
    sources = [_relative(s, root) for s in want.sources]
    if None in sources:
        return Match(None, f"the sources of {want.name} lie in more than one package")
    candidates = [e for e in entries if e.get("name") == want.name
                  and e.get("platform") == want.platform and e.get("sources") == sources]
    if not candidates:
        return Match(None, f"package {root.name} ships no {want.platform} build of "
                           f"{want.name} from these sources")
    reason = ""
    for entry in candidates:
        try:
            why = _mismatch(entry, want, root)
            if why is None:
                path = folder / entry["artifact"]["file"]
                if path.parent != folder:
                    why = "its index names a file outside the prebuilt folder"
                elif not path.is_file():
                    why = f"{path.name} is missing"
                elif (path.stat().st_size != entry["artifact"]["size"]
                      or cached_sha256(path) != entry["artifact"]["sha256"]):
                    why = f"{path.name} is damaged (size or sha256 differ from its index)"
                else:
                    return Match(path, f"prebuilt {path.name} in package {root.name}")
        except (KeyError, TypeError, ValueError, AttributeError, OSError):
            why = "its index entry is unreadable"
        reason = reason or why
    return Match(None, f"the prebuilt {want.platform} {want.name} of package {root.name} does "
                       f"not serve this process: {reason}")


def add(prebuilt_dir: Path, want: Wanted, artifact: Path, dependencies: Iterable[Path]) -> Path:
    """Copy the built library ``artifact`` into ``prebuilt_dir`` and record it in the index,
    replacing an entry for the same library, platform, ABI tags and archs. Dependencies are
    kept only where they lie inside the sources' package. Returns the copy's path.

    Example:
        >>> add(Path("/tmp/p"), want, Path("lib.so"), deps)          # doctest: +SKIP
        PosixPath('/tmp/p/simple_add_cpu-cpu-1a2b3c4d5e6f.so')
    """
    root = package_root(want.sources[0])
    if root is None or want.ffi is None:
        raise ValueError(f"{want.name}: its sources lie in no package, or the FFI version is "
                         "unknown")
    prebuilt_dir.mkdir(parents=True, exist_ok=True)
    digest = file_sha256(artifact)
    target = prebuilt_dir / f"{want.name}-{want.platform}-{digest[:12]}.so"
    shutil.copyfile(artifact, target)
    deps = {}
    for dep in dependencies:
        rel = _relative(dep, root)
        if rel is not None:
            deps[rel] = file_sha256(Path(dep))
    entry = {
        "name": want.name, "platform": want.platform,
        "sources": [_relative(s, root) for s in want.sources],
        "defines": dict(want.defines), "flags": portable_flags(want.flags),
        "abi": dict(want.abi), "ffi": list(want.ffi), "archs": list(want.archs),
        "dependencies": deps,
        "artifact": {"file": target.name, "size": target.stat().st_size, "sha256": digest},
    }
    entries = read_index(prebuilt_dir) or []
    same = ("name", "platform", "sources", "abi", "archs")
    entries = [e for e in entries if any(e.get(k) != entry[k] for k in same)]
    entries.append(entry)
    entries.sort(key=lambda e: (e["name"], e["platform"], json.dumps(e["abi"], sort_keys=True)))
    write_atomically(prebuilt_dir / INDEX, json.dumps(
        {"format": FORMAT, "entries": entries}, indent=1, sort_keys=True).encode())
    used = {e["artifact"]["file"] for e in entries}
    for old in prebuilt_dir.glob("*.so"):
        if old.name not in used:
            old.unlink()
    return target


def build_mode() -> str:
    """``$XLA_KERNELS_BUILD``: ``auto`` (default: a prebuilt library, else the cache, else
    build), ``always`` (never use prebuilt libraries: the cache, else build) or ``never``
    (a prebuilt library or the cache; a needed compile is an error).

    Example:
        >>> build_mode() in ("auto", "always", "never")
        True
    """
    raw = env.get("XLA_KERNELS_BUILD") or ""
    mode = raw.strip().lower() or "auto"
    if mode not in ("auto", "always", "never"):
        raise BuildError(f"XLA_KERNELS_BUILD={raw!r} is not a "
                         "build mode. Fix: set it to auto, always or never, or unset it.")
    return mode
