"""The on-disk cache of built libraries: where it lives, keys, manifests, safe installation.

The cache has two levels, like a build tool's:

* The **lookup key** hashes what is known without running a compiler: the library name and
  platform, each source's path and content, include dirs, defines, flags, CUDA archs, the
  FFI headers and the environment variables the compilers read. It names the entry
  ``<name>-<platform>-<key[:16]>``.
* The entry's **manifest** (``<entry>.json``, written last and atomically) records what only
  the compiler knew: every file the build read (from the compilers' ``-MMD -MF`` depfiles)
  with its sha256, the compilers' versions, and the artifact's file name, size and sha256.

A lookup is a hit only when the manifest is intact, every recorded dependency still has its
hash, the compilers that can be found still report the recorded versions, and the artifact
has the recorded size and hash. Nothing inside the cache refers to the cache's own path, so a
copied or moved cache still hits, and a hit runs no compiler when none is installed.

Example:
    >>> from pathlib import Path
    >>> entry_stem(Path("/tmp/c"), "simple add", "cpu", "0123456789abcdef" * 4)
    PosixPath('/tmp/c/simple_add-cpu-0123456789abcdef')
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import env

#: Bump when the way libraries are built or recorded changes, to invalidate every old entry.
CACHE_FORMAT = "xla-kernels-build-3"

#: FFI headers whose content stands for the XLA FFI version.
FFI_HEADERS = ("api.h", "ffi.h", "c_api.h")

#: Bytes read at a time when hashing files (artifacts can be tens of MB).
_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    """``$XLA_KERNELS_CACHE_DIR``, else ``$XDG_CACHE_HOME/xla_kernels``, else ``~/.cache/...``.

    Example:
        >>> import os; os.environ["XLA_KERNELS_CACHE_DIR"] = "/tmp/xk"
        >>> default_cache_dir()
        PosixPath('/tmp/xk')
        >>> del os.environ["XLA_KERNELS_CACHE_DIR"]
    """
    explicit = env.get("XLA_KERNELS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "xla_kernels"


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's content, read in chunks.

    Example:
        >>> import tempfile; p = Path(tempfile.mkdtemp()) / "f"; _ = p.write_bytes(b"")
        >>> file_sha256(p)[:12]
        'e3b0c44298fc'
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def ffi_headers_digest(ffi_include_dir: Path) -> str:
    """sha256 over ``xla/ffi/api/{api.h,ffi.h,c_api.h}``: stands for the FFI version."""
    h = hashlib.sha256()
    for name in FFI_HEADERS:
        path = ffi_include_dir / "xla" / "ffi" / "api" / name
        h.update(name.encode())
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
    return h.hexdigest()


def tree_digest(root: Path) -> str:
    """sha256 over the relative path and content of every file under ``root`` (sorted).

    Stands for headers the compilers' depfiles leave out: a folder searched with
    ``-idirafter`` is a system folder to them, so ``-MMD`` does not list its headers.

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> before = tree_digest(d); _ = (d / "a.h").write_text("//")
        >>> before == tree_digest(d)
        False
    """
    h = _Hasher()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.add(path.relative_to(root).as_posix(), path.read_bytes())
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

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def compute_key(*, fields: Mapping[str, Iterable[str]], sources: Iterable[Path]) -> str:
    """The lookup key (hex sha256): :data:`CACHE_FORMAT`, labelled ``fields``, each source.

    ``fields`` maps a label to strings (flags, archs, ``NAME=value`` settings...); each
    source contributes its path and its content. Headers are *not* part of the key: they are
    only known once a compiler has run, so they live in the entry's manifest instead.

    Example:
        >>> a = compute_key(fields={"defines": ["-DV=1"]}, sources=[])
        >>> a == compute_key(fields={"defines": ["-DV=2"]}, sources=[])
        False
    """
    h = _Hasher()
    h.add("format", CACHE_FORMAT)
    for label, values in fields.items():
        for value in values:
            h.add(label, value)
    for src in sources:
        h.add(f"source:{src}", Path(src).read_bytes())
    return h.hexdigest()


def entry_stem(cache_dir: Path, name: str, platform: str, key: str) -> Path:
    """``<cache_dir>/<name>-<platform>-<key[:16]>``, ``name`` made file-name safe.

    The manifest is ``<stem>.json``, the lock ``<stem>.lock`` and the artifact
    ``<stem>-<sha256[:12]>.so``.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "library"
    return cache_dir / f"{safe}-{platform}-{key[:16]}"


def artifact_name(stem: Path, sha256: str) -> str:
    """The artifact's file name: it includes the content hash, so a rebuilt library never
    reuses the path of an older one (``dlopen`` of a path already loaded in this process
    would hand back the old code)."""
    return f"{stem.name}-{sha256[:12]}.so"


# --------------------------------------------------------------------------- depfiles


def parse_depfile(text: str, cwd: Path) -> list[Path]:
    """The prerequisites listed in a make-style depfile (``g++ -MMD -MF``, ``nvcc -MMD -MF``).

    Handles line continuations, ``\\ `` escaped spaces and ``$$``; relative paths are taken
    from ``cwd`` (where the compiler ran) and every path is resolved to an absolute one.

    Example:
        >>> parse_depfile("a.o: /s/a.cc \\\\\\n /s/my\\\\ dir/b.h\\n", Path("/w"))
        [PosixPath('/s/a.cc'), PosixPath('/s/my dir/b.h')]
    """
    tokens: list[str] = []
    cur: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "\r\n":
            i += 3 if text[i + 1 : i + 3] == "\r\n" else 2
            if cur:
                tokens.append("".join(cur))
                cur = []
            continue
        if c == "\\" and i + 1 < n and text[i + 1] in " #\\":
            cur.append(text[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < n and text[i + 1] == "$":
            cur.append("$")
            i += 2
            continue
        if c.isspace():
            if cur:
                tokens.append("".join(cur))
                cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    if cur:
        tokens.append("".join(cur))
    # Targets come first and end with ':' (or the ':' stands alone); the rest are the deps.
    deps: list[str] = []
    seen_colon = False
    for tok in tokens:
        if not seen_colon:
            seen_colon = tok.endswith(":")
            continue
        if tok.endswith(":"):  # a further rule (e.g. from -MP): its target is not a dep
            continue
        deps.append(tok)
    out: dict[Path, None] = {}
    for dep in deps:
        p = Path(dep)
        out.setdefault((p if p.is_absolute() else cwd / p).resolve(), None)
    return list(out)


# --------------------------------------------------------------------------- manifests


@dataclass(frozen=True)
class Lookup:
    """The result of checking an entry: ``path`` when it is a hit, else why it missed.

    ``damaged`` names an artifact file that exists but fails its size/hash check (it must not
    be loaded: a truncated library can kill the process inside ``dlopen``).
    """

    path: Path | None
    reason: str
    damaged: Path | None = None


def read_manifest(stem: Path) -> dict[str, Any] | None:
    """The entry's manifest, or None when it is absent, unreadable or not this format."""
    try:
        data = json.loads(stem.with_name(stem.name + ".json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return None
    return data


def check_entry(stem: Path, compiler_versions: Callable[[str], str | None]) -> Lookup:
    """Decide whether the entry ``stem`` may be loaded; never runs a compiler itself.

    ``compiler_versions(kind)`` returns the ``--version`` text of the compiler of that kind
    (``"cxx"``/``"nvcc"``) that a build would use now, or None when none is installed; a
    recorded compiler that cannot be found is not held against the entry (so a hit needs no
    compiler), but one that reports another version is.

    Example:
        >>> check_entry(Path("/nonexistent/x-cpu-0"), lambda kind: None).reason
        'not built yet'
    """
    manifest = read_manifest(stem)
    if manifest is None:
        if stem.with_name(stem.name + ".json").exists():
            return Lookup(None, "its manifest is unreadable")
        return Lookup(None, "not built yet")
    try:
        artifact = manifest["artifact"]
        path = stem.with_name(str(artifact["file"]))
        if path.parent != stem.parent:
            return Lookup(None, "its manifest names a file outside the cache")
        for dep, digest in manifest["dependencies"].items():
            try:
                if file_sha256(Path(dep)) != digest:
                    return Lookup(None, f"{dep} changed")
            except OSError:
                return Lookup(None, f"{dep} is gone")
        for kind, recorded in manifest["compilers"].items():
            current = compiler_versions(kind)
            if current is not None and current != recorded:
                return Lookup(None, f"the {kind} compiler changed version")
        try:
            size = path.stat().st_size
        except OSError:
            return Lookup(None, "its library file is missing")
        if size != artifact["size"] or file_sha256(path) != artifact["sha256"]:
            return Lookup(None, f"{path.name} is damaged", damaged=path)
    except (KeyError, TypeError, AttributeError, OSError):
        return Lookup(None, "its manifest is unreadable")
    return Lookup(path, "hit")


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over
    ``path``: a reader sees the old file or the whole new one, never a partial one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def install_entry(
    stem: Path,
    built: Path,
    *,
    dependencies: Iterable[Path],
    compilers: Mapping[str, str],
    info: Mapping[str, Any],
    damaged: Path | None = None,
) -> Path:
    """Move the freshly built library ``built`` into the cache and write its manifest.

    The artifact is fsynced and renamed into place first, the manifest last, so a reader
    who finds a manifest also finds the complete library it describes. Call with the entry's
    lock held. ``damaged`` (from :class:`Lookup`) is deleted once replaced. Returns the
    artifact's path.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); lib = d / "tmp.so"; _ = lib.write_bytes(b"lib")
        >>> so = install_entry(d / "x-cpu-00", lib, dependencies=[], compilers={}, info={})
        >>> so.name, check_entry(d / "x-cpu-00", lambda kind: None).path == so
        ('x-cpu-00-76b5a3573912.so', True)
    """
    with open(built, "rb") as f:
        os.fsync(f.fileno())
    digest = file_sha256(built)
    size = built.stat().st_size
    final = stem.with_name(artifact_name(stem, digest))
    os.replace(built, final)
    deps = {str(p): file_sha256(p) for p in dependencies}
    manifest = {
        "format": CACHE_FORMAT,
        **info,
        "artifact": {"file": final.name, "size": size, "sha256": digest},
        "compilers": dict(compilers),
        "dependencies": deps,
    }
    write_atomically(stem.with_name(stem.name + ".json"),
                     json.dumps(manifest, indent=1, sort_keys=True).encode())
    # A damaged library this entry pointed to before goes; an intact older build stays, as a
    # caller may hold its path (builds for other keys stay too, as they always have).
    if damaged is not None and damaged != final and damaged.parent == stem.parent:
        damaged.unlink(missing_ok=True)
    return final
