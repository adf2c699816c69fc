"""The on-disk cache of built libraries: where it lives, the content key, safe installation.

A library is stored at ``<cache_dir>/<name>-<platform>-<key[:16]>.so``; the key hashes
everything that can change the binary, so a stale file is never reused and a hit needs
no compiler at all.

Example:
    >>> from pathlib import Path
    >>> output_path(Path("/tmp/c"), "simple add", "cpu", "0123456789abcdef" * 4)
    PosixPath('/tmp/c/simple_add-cpu-0123456789abcdef.so')
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from filelock import FileLock

#: Bump when the way libraries are built changes, to invalidate every old entry.
CACHE_FORMAT = "xla-kernels-build-1"

#: Files treated as headers when hashing a source's directory and the package includes.
HEADER_SUFFIXES = (".h", ".hpp", ".cuh", ".inc")

#: FFI headers whose content stands for the XLA FFI version.
FFI_HEADERS = ("api.h", "ffi.h", "c_api.h")


def default_cache_dir() -> Path:
    """``$XLA_KERNELS_CACHE_DIR``, else ``$XDG_CACHE_HOME/xla_kernels``, else ``~/.cache/...``.

    Example:
        >>> import os; os.environ["XLA_KERNELS_CACHE_DIR"] = "/tmp/xk"
        >>> default_cache_dir()
        PosixPath('/tmp/xk')
        >>> del os.environ["XLA_KERNELS_CACHE_DIR"]
    """
    explicit = os.environ.get("XLA_KERNELS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "xla_kernels"


def headers_in(directory: Path, *, recursive: bool) -> list[Path]:
    """Header files (see :data:`HEADER_SUFFIXES`) in ``directory``, sorted; [] if it is absent."""
    if not directory.is_dir():
        return []
    walk = directory.rglob("*") if recursive else directory.iterdir()
    return sorted(p for p in walk if p.suffix in HEADER_SUFFIXES and p.is_file())


def ffi_headers_digest(ffi_include_dir: Path) -> str:
    """sha256 over ``xla/ffi/api/{api.h,ffi.h,c_api.h}``: stands for the FFI version."""
    h = hashlib.sha256()
    for name in FFI_HEADERS:
        path = ffi_include_dir / "xla" / "ffi" / "api" / name
        h.update(name.encode())
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
    return h.hexdigest()


class _Hasher:
    """sha256 over labelled, length-prefixed fields, so fields cannot run into each other."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, label: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        for part in (label.encode(), raw):
            self._h.update(len(part).to_bytes(8, "little"))
            self._h.update(part)

    def add_file(self, label: str, path: Path) -> None:
        self.add(f"{label}:{path}", path.read_bytes())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def compute_key(
    *,
    sources: Sequence[Path],
    package_include_dir: Path,
    ffi_include_dir: Path,
    commands: Iterable[Sequence[str]],
    compiler_versions: Iterable[str],
    environment: Iterable[str] = (),
) -> str:
    """The cache key (hex sha256) of one library build.

    It covers each source's content; every header in each source's directory and, recursively,
    in ``package_include_dir``; the full compile commands; the compilers' ``--version`` output;
    the FFI header content; and ``environment`` (``"NAME=value"`` of variables the compilers
    read). Headers reached only through user ``include_dirs`` are not
    hashed (those directories can be large third-party trees); their paths are in the commands.
    """
    h = _Hasher()
    h.add("format", CACHE_FORMAT)
    for src in sources:
        h.add_file("source", src)
    header_files: dict[Path, None] = {}
    for src in sources:
        header_files.update(dict.fromkeys(headers_in(src.parent, recursive=False)))
    header_files.update(dict.fromkeys(headers_in(package_include_dir, recursive=True)))
    for header in sorted(header_files):
        h.add_file("header", header)
    for cmd in commands:
        h.add("command", "\0".join(cmd))
    for version in compiler_versions:
        h.add("compiler", version)
    for setting in environment:
        h.add("env", setting)
    h.add("ffi", ffi_headers_digest(ffi_include_dir))
    return h.hexdigest()


def output_path(cache_dir: Path, name: str, platform: str, key: str) -> Path:
    """``<cache_dir>/<name>-<platform>-<key[:16]>.so``, with ``name`` made file-name safe."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "library"
    return cache_dir / f"{safe}-{platform}-{key[:16]}.so"


def install_once(out: Path, build: Callable[[Path], None]) -> bool:
    """Create ``out`` with ``build(tmp)`` unless it exists; safe across processes.

    Holds a :class:`filelock.FileLock` on ``<out>.lock``, re-checks ``out`` once the lock
    is held (another process may have just built it), has ``build`` write a temporary file
    in the same directory, then moves it into place with :func:`os.replace`, so a reader
    never sees a half-written library. Returns True if this call built it.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> install_once(d / "x.so", lambda tmp: tmp.write_bytes(b"lib"))
        True
        >>> install_once(d / "x.so", lambda tmp: tmp.write_bytes(b"other"))
        False
    """
    with FileLock(str(out) + ".lock"):
        if out.exists():
            return False
        tmp = out.with_name(f".{out.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp.so")
        try:
            build(tmp)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return True
