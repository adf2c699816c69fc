"""The handler JAX registers for an op: a guard that names the op when the handler's
binding disagrees with the declaration.

XLA builds every call frame from the declaration; the op's handler decodes it before its
body runs and, on a disagreement (argument/result/attribute counts, buffer dtypes,
attribute names and types), returns a message naming neither the op nor the item. Each
registered op gets a guard slot (``ffi_guard.cc``): the guard calls the op's handler with
XLA's call frame, unchanged, and only when the handler returns such an error replaces the
message with :func:`~xla_kernels.runtime.bindings.explain_binding`'s. So the first call of
a mismatched op fails in plain JAX (``jax.jit(lambda x: op(x))(x)``) naming the op, the
item and both sides, while an agreeing handler runs exactly as before; a call pays one
indirect call.

Why not check the binding beforehand with a made-up call frame: the typed FFI checks the
argument count first, and a handler that binds only ``AnyBuffer`` arguments (no results,
no named attribute) decodes any frame with that many arguments and runs its body on it,
so no made-up frame can be sure to stop before the body. The guard makes no frame.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> from xla_kernels.runtime.library import kernel_of
    >>> guarded(simple_add, "cpu", kernel_of(simple_add, "cpu")) > 0
    True
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_kernels.errors import RegistrationError, XlaKernelsError
from xla_kernels.record import records
from xla_kernels.runtime.bindings import explain_binding

if TYPE_CHECKING:
    from xla_kernels.op import Op
    from xla_kernels.runtime.library import LoadedKernel

__all__ = ["guard_spec", "guarded"]

_SOURCE = Path(__file__).with_name("ffi_guard.cc")
_EXPLAIN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p,
                            ctypes.c_int64)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_unavailable = False  # the library could not be built or loaded: register bare handlers
_slots: dict[tuple[str, str], int] = {}  # (target, platform) -> slot
_by_slot: list[tuple[str, str, str]] = []  # slot -> (target, platform, handler symbol)


def guard_spec() -> Any:
    """The :class:`~xla_kernels.builder.BuildSpec` of the guard library (``ffi_guard.cc``,
    plain C++ with the XLA FFI C API): prebuilt in the wheel, cached, or built on first use.

    Example:
        >>> guard_spec().name
        'xk_ffi_guard'
    """
    from xla_kernels.builder import BuildSpec

    return BuildSpec.create("xk_ffi_guard", [_SOURCE], platform="cpu")


def _explain(slot: int, message: bytes | None, out: int, out_len: int) -> int:
    """The guard's callback (XLA's thread, with the GIL): writes the explanation of a
    decoding failure into ``out`` and returns its length, or 0 to keep XLA's message."""
    try:
        target, platform, handler = _by_slot[slot]
        record = records().get(target)
        if record is None or message is None:
            return 0
        text = explain_binding(message.decode("utf-8", "replace"), record.op, platform,
                               handler)
        if text is None:
            return 0
        data = text.encode()[:out_len - 1]
        ctypes.memmove(out, data, len(data))
        return len(data)
    except BaseException:  # must not propagate into XLA: keep its message
        return 0


_explain_fn = _EXPLAIN(_explain)  # kept alive for the process


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        path = guard_spec().load_path()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise RegistrationError(f"handler guard: cannot load {path}: {e}. Fix: rebuild "
                                    "with XLA_KERNELS_CACHE_DIR pointing to an empty "
                                    "folder.") from e
        lib.xk_guard_slots.restype = ctypes.c_int32
        lib.xk_guard_install.restype = ctypes.c_void_p
        lib.xk_guard_install.argtypes = [ctypes.c_int32, ctypes.c_void_p]
        lib.xk_guard_set_explain.restype = None
        lib.xk_guard_set_explain.argtypes = [_EXPLAIN]
        lib.xk_guard_set_explain(_explain_fn)
        _lib = lib
    return _lib


def guarded(op: Op, platform: str, kernel: LoadedKernel) -> int:
    """The address of the guard to register with XLA for ``op``'s execute handler
    ``kernel`` on ``platform``; the handler's own address when every slot is taken or the
    guard library can be neither found prebuilt nor built (``XLA_KERNELS_BUILD=never``
    without a compiler): the op then runs, with XLA's bare decoding messages.

    A target keeps its slot for the process, as XLA keeps a registered handler.
    """
    global _unavailable
    with _lock:
        if _unavailable:
            return kernel.address
        try:
            lib = _load()
        except XlaKernelsError:
            _unavailable = True
            return kernel.address
        key = (op.target, platform)
        slot = _slots.get(key)
        if slot is None:
            if len(_by_slot) >= lib.xk_guard_slots():
                return kernel.address
            slot = _slots[key] = len(_by_slot)
            _by_slot.append((op.target, platform, kernel.handler))
        return lib.xk_guard_install(slot, kernel.address) or kernel.address
