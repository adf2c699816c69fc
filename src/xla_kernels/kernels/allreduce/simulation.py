"""The all-reduce protocol of ``protocol.h`` on the CPU: ranks are processes (or threads), the
workspaces are shared-memory files, each block of the CUDA kernel is a thread.

It is the executable specification of the GPU op of issue 53 (docs/design/allreduce.md):
the same workspace layout, unit/share/block partition, epoch barrier and memory orders
(``std::atomic_ref`` release/acquire where the kernel uses ``st.release.sys`` /
``ld.acquire.sys``), and the same arithmetic (f32 sums in rank order, one rounding).
No op is declared yet: the CUDA kernel needs two GPUs to be tested.

Example (two ranks as threads of one process; processes work the same way)::

    >>> import threading, numpy as np
    >>> group, out = f"doc{os.getpid()}", {}
    >>> def rank(r):
    ...     with Communicator(group, r, 2, capacity=1 << 12) as comm:
    ...         out[r] = comm.all_reduce(np.full(5, r + 1, np.float32))
    >>> threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    >>> for t in threads: t.start()
    >>> for t in threads: t.join()
    >>> out[0]
    array([3., 3., 3., 3., 3.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import mmap
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from xla_kernels.builder import cache, toolchain

HERE = Path(__file__).parent
SOURCES = (HERE / "protocol_cpu.cc", HERE / "protocol.h")
DTYPES = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1}
MODES = {"oneshot": 0, "twoshot": 1}
#: Above this many bytes a group of more than two ranks takes two-shot (each rank reads
#: (ranks - 1) / ranks of the message twice instead of (ranks - 1) times); two ranks read the
#: same bytes either way and keep one-shot's single barrier. To be tuned on the GPUs.
ONE_SHOT_MAX_BYTES = 256 * 1024
MAX_RANKS = 8


class AllReduceError(RuntimeError):
    """An all-reduce group cannot go on (a peer is lost, or the group broke before)."""


class PeerTimeoutError(AllReduceError):
    """Peers did not arrive within the group's timeout: ``missing`` lists their ranks."""

    def __init__(self, message: str, *, rank: int, missing: tuple[int, ...],
                 epoch: int | None = None, block: int | None = None):
        super().__init__(message)
        self.rank, self.missing, self.epoch, self.block = rank, missing, epoch, block

    def __reduce__(self):  # crosses process boundaries whole (multiprocessing pickles it)
        return _rebuild_timeout, (str(self), self.rank, self.missing, self.epoch, self.block)


def _rebuild_timeout(message: str, rank: int, missing: tuple[int, ...], epoch: int | None,
                     block: int | None) -> PeerTimeoutError:
    return PeerTimeoutError(message, rank=rank, missing=missing, epoch=epoch, block=block)


def plan(nbytes: int, ranks: int, capacity: int) -> str:
    """``"oneshot"``, ``"twoshot"`` or ``"fallback"`` (XLA's all-reduce, i.e. NCCL) for a
    message of ``nbytes`` over ``ranks`` ranks with workspaces of ``capacity`` bytes a region.

    Example:
        >>> plan(4096, 2, 1 << 20), plan(1 << 19, 4, 1 << 20), plan(1 << 21, 2, 1 << 20)
        ('oneshot', 'twoshot', 'fallback')
    """
    if not 2 <= ranks <= MAX_RANKS or nbytes > capacity:
        return "fallback"
    return "oneshot" if ranks == 2 or nbytes <= ONE_SHOT_MAX_BYTES else "twoshot"


@functools.cache
def library() -> ctypes.CDLL:
    """The simulation's shared library, built on first use into the kernel cache (keyed by
    the sources and the compiler)."""
    cxx = toolchain.find_cxx()
    flags = ["-std=c++20", "-O2", "-fPIC", "-shared", "-pthread"]
    key = hashlib.sha256()
    for part in [toolchain.compiler_version(cxx), *flags, *(p.read_text() for p in SOURCES)]:
        key.update(part.encode() + b"\0")
    target = cache.default_cache_dir() / "allreduce_protocol" / f"{key.hexdigest()[:24]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            done = subprocess.run([str(cxx), *flags, str(SOURCES[0]), "-o", str(built)],
                                  capture_output=True, text=True)
            if done.returncode:
                raise AllReduceError(f"building {SOURCES[0].name} failed:\n{done.stderr}")
            os.replace(built, target)
    lib = ctypes.CDLL(str(target))
    lib.XkAllReduceWorkspaceBytes.restype = ctypes.c_int64
    lib.XkAllReduceWorkspaceBytes.argtypes = [ctypes.c_int64]
    lib.XkAllReduceRun.restype = ctypes.c_int32
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    lib.XkAllReduceRun.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), i32, i32, i32, i32, i32, i32, i64, i64, i64, i64,
        p, p, p, ctypes.c_float, p, p, ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_int32)]
    return lib


def _address(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _shm_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def workspace_path(group: str, rank: int) -> Path:
    """Where rank ``rank`` of ``group`` publishes its workspace (the CUDA IPC handle's
    stand-in: a name any process of the host can open)."""
    return _shm_dir() / f"xk_allreduce_{group}_{rank}"


class Communicator:
    """Rank ``rank`` of an all-reduce group of ``ranks``: its workspace, created and zeroed
    once, published under the group's name, and every peer's workspace mapped once.

    Args:
        group: the group's name, the same on every rank and unique on the host.
        rank, ranks: this rank and the group's size (2 to 8).
        capacity: the largest message in bytes (larger ones are XLA's all-reduce).
        max_blocks: the most threads (CUDA blocks) a call runs.
        timeout_s: how long a rank waits for its peers, at the rendezvous and at each
            barrier, before it raises :class:`PeerTimeoutError` naming the missing ranks.
    """

    def __init__(self, group: str, rank: int, ranks: int, *, capacity: int = 1 << 20,
                 max_blocks: int = 4, timeout_s: float = 10.0):
        if not 2 <= ranks <= MAX_RANKS or not 0 <= rank < ranks:
            raise ValueError(f"rank {rank} of {ranks}: need 2 <= ranks <= {MAX_RANKS} and "
                             "0 <= rank < ranks")
        self.group, self.rank, self.ranks = group, rank, ranks
        self.capacity, self.max_blocks, self.timeout_s = capacity, max_blocks, timeout_s
        self.broken: str | None = None
        self._lib = library()
        self._size = int(self._lib.XkAllReduceWorkspaceBytes(capacity))
        self._maps: list[mmap.mmap] = []
        self._views: list[np.ndarray] = []
        self._own = workspace_path(group, rank)
        self._publish()
        try:
            self._open_peers()
        except BaseException:
            self.close()
            raise
        self._bases = (ctypes.c_void_p * ranks)(*(v.ctypes.data for v in self._views))

    def _publish(self) -> None:
        # Sized and zeroed under a private name, then linked under the public one: a peer
        # never maps a workspace that is not whole.
        private = self._own.with_name(f"{self._own.name}.{os.getpid()}.tmp")
        fd = os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self._size)
            os.link(private, self._own)
        except FileExistsError:
            raise AllReduceError(
                f"all-reduce group {self.group!r}: rank {self.rank}'s workspace {self._own} "
                "already exists (a stale run, or two ranks with one number). Fix: give the "
                "group a name unique on the host, or remove the stale file.") from None
        finally:
            os.close(fd)
            private.unlink()

    def _open_peers(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        fds: dict[int, int] = {}
        while len(fds) < self.ranks:
            for r in range(self.ranks):
                if r not in fds:
                    with contextlib.suppress(FileNotFoundError):
                        fds[r] = os.open(workspace_path(self.group, r), os.O_RDWR)
            if len(fds) < self.ranks and time.monotonic() > deadline:
                for fd in fds.values():
                    os.close(fd)
                missing = tuple(r for r in range(self.ranks) if r not in fds)
                raise PeerTimeoutError(
                    f"all-reduce group {self.group!r}: rank {self.rank} waited "
                    f"{self.timeout_s} s for the workspaces of rank(s) {list(missing)}, which "
                    "never appeared. Fix: start every rank of the group, with the same group "
                    "name and size.", rank=self.rank, missing=missing)
            time.sleep(0.001)
        for r in range(self.ranks):
            self._maps.append(mmap.mmap(fds[r], self._size))
            os.close(fds[r])
            self._views.append(np.frombuffer(self._maps[-1], np.uint8))

    def close(self) -> None:
        """Unmap the workspaces and withdraw this rank's."""
        self._views.clear()
        for m in self._maps:
            m.close()
        self._maps.clear()
        self._own.unlink(missing_ok=True)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def all_reduce(self, x: Any, *, mode: str = "auto") -> np.ndarray:
        """The sum over the group's ranks of each rank's ``x`` (f32 or bf16, any shape; the
        same shape and dtype on every rank), summed in f32 in rank order, rounded once."""
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        width = 16 // x.dtype.itemsize if x.dtype in DTYPES else 1
        self._run(x, None, None, 0.0, out, None, width, mode)
        return out

    def all_reduce_add_rms_norm(self, x: Any, residual: Any, weight: Any, *,
                                eps: float = 1e-6, mode: str = "auto"
                                ) -> tuple[np.ndarray, np.ndarray]:
        """``fused_add_rms_norm(all_reduce(x), residual, weight, eps=eps)``: ``(out,
        residual_out)``, x and residual ``[..., hidden]``, weight ``[hidden]``."""
        x, residual, weight = (np.ascontiguousarray(a) for a in (x, residual, weight))
        if residual.shape != x.shape or residual.dtype != x.dtype or x.ndim < 1:
            raise ValueError(f"residual: expected x's shape {x.shape} and dtype {x.dtype}, got "
                             f"{residual.shape} {residual.dtype}")
        if weight.shape != x.shape[-1:] or weight.dtype != x.dtype:
            raise ValueError(f"weight: expected shape {x.shape[-1:]} and dtype {x.dtype}, got "
                             f"{weight.shape} {weight.dtype}")
        out, residual_out = np.empty_like(x), np.empty_like(x)
        self._run(x, residual, weight, eps, out, residual_out, max(x.shape[-1], 1), mode)
        return out, residual_out

    def _run(self, x: np.ndarray, residual: np.ndarray | None, weight: np.ndarray | None,
             eps: float, out: np.ndarray, residual_out: np.ndarray | None, width: int,
             mode: str) -> None:
        if self.broken:
            raise AllReduceError(f"all-reduce group {self.group!r}: rank {self.rank} cannot "
                                 f"run: the group broke earlier ({self.broken})")
        if x.dtype not in DTYPES:
            raise ValueError(f"x: dtype {x.dtype} is not f32 or bf16")
        chosen = plan(x.nbytes, self.ranks, self.capacity) if mode == "auto" else mode
        if chosen not in MODES:
            raise ValueError(f"mode {mode!r}: the message of {x.nbytes} bytes takes {chosen} "
                             f"(capacity {self.capacity}); pass 'oneshot' or 'twoshot' within "
                             "the capacity")
        if x.nbytes > self.capacity:
            raise ValueError(f"x: {x.nbytes} bytes exceed the workspace's {self.capacity}")
        if x.size == 0:
            return
        missing, epoch, block = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_int32()
        failed = self._lib.XkAllReduceRun(
            self._bases, self.ranks, self.rank, self.max_blocks, MODES[chosen], DTYPES[x.dtype],
            int(residual is not None), x.size, width, self.capacity,
            int(self.timeout_s * 1e9), _address(x), _address(residual), _address(weight), eps,
            _address(out), _address(residual_out), ctypes.byref(missing), ctypes.byref(epoch),
            ctypes.byref(block))
        if failed:
            lost = tuple(r for r in range(self.ranks) if missing.value >> r & 1)
            self.broken = f"rank(s) {list(lost)} never arrived at epoch {epoch.value}"
            raise PeerTimeoutError(
                f"all-reduce group {self.group!r}: rank {self.rank} waited {self.timeout_s} s "
                f"at barrier epoch {epoch.value} (block {block.value}, {chosen}) for rank(s) "
                f"{list(lost)}, which never arrived; the group is unusable now. Fix: make every "
                "rank run the same calls in the same order (a rank died, or skipped a call), "
                "or raise timeout_s if a rank is legitimately late.",
                rank=self.rank, missing=lost, epoch=epoch.value, block=block.value)
