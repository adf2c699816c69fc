"""Registering a kernel's custom FFI types (``Kernel(types=...)``) with JAX, once each.

Both the JAX registration (:mod:`xla_kernels.runtime.registry`) and the eager runtime's
stateful kernels (:func:`xla_kernels.runtime.library.kernel_of`) need the type ids XLA
assigns; this module is below both.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

from xla_kernels import platforms
from xla_kernels.errors import RegistrationError

if TYPE_CHECKING:
    from xla_kernels.runtime.library import LoadedKernel

__all__ = ["ensure_types"]

# (type name, JAX platform) -> (XLA_FFI_TypeId address, op)
_types: dict[tuple[str, str], tuple[int, str]] = {}
_types_registered: set[tuple[str, str]] = set()  # (type name, JAX platform)
_types_lock = threading.Lock()


def _capsule(address: int) -> Any:
    import jax

    return jax.ffi.pycapsule(ctypes.cast(address, ctypes.CFUNCTYPE(None)))


def ensure_types(kernel: LoadedKernel, platform: str | None = None, *,
                 assign: bool = False) -> list[tuple[int, int]]:
    """Register ``kernel``'s custom FFI types (``Kernel(types=...)``) with JAX, once each.

    A type is registered under its declared name with its ``XLA_FFI_TypeId`` (and
    ``XLA_FFI_TypeInfo``): XLA assigns the id, which the handlers' ``ffi::State<T>`` and
    ``T::id`` then read. ``assign=True`` makes sure XLA has assigned the ids when this
    returns (JAX registers types when the platform's client starts; the eager runtime
    needs the ids without any JAX call). Returns ``(type id, type info address)`` pairs.

    Example:
        >>> ensure_types(kernel_of(op, "cpu"), assign=True)     # doctest: +SKIP
        [(1, 140523354112000)]
    """
    platform = platform or kernel.platform
    if not kernel.types:
        return []
    import jax

    jax_platform = platforms.PLATFORMS[platform].jax_registration
    with _types_lock:
        for t in kernel.types:
            known = _types.setdefault((t.name, jax_platform), (t.id_address, kernel.op))
            if known[0] != t.id_address:
                raise RegistrationError(
                    f"{kernel.op}: the FFI type '{t.name}' is already registered for "
                    f"{platform} by "
                    f"{known[1]} with another type id object than {t.symbol}() of "
                    f"{kernel.library.name} returns. Fix: give each state type its own "
                    "name in Kernel(types=...), or share one library defining it.")
            if (t.name, jax_platform) in _types_registered:
                continue
            info = {"type_info": _capsule(t.info_address)} if t.info_address else {}
            try:
                if hasattr(jax.ffi, "register_ffi_type"):
                    jax.ffi.register_ffi_type(t.name, {"type_id": _capsule(t.id_address),
                                                       **info}, platform=jax_platform)
                else:  # jax releases before register_ffi_type: ids only
                    jax.ffi.register_ffi_type_id(t.name, _capsule(t.id_address),
                                                 platform=jax_platform)
            except Exception as e:  # XLA raises plain RuntimeError/XlaRuntimeError here
                raise RegistrationError(f"{kernel.op}: registering FFI type '{t.name}' for "
                                        f"{platform} with JAX failed: {e}") from e
            _types_registered.add((t.name, jax_platform))
    if assign and any(t.type_id == 0 for t in kernel.types):
        jax.devices(platforms.PLATFORMS[platform].jax_lowering)  # starts the client
    missing = [t.name for t in kernel.types if assign and t.type_id == 0]
    if missing:
        raise RegistrationError(
            f"{kernel.op}: XLA assigned no id to the FFI types {missing} on {platform}. "
            f"Fix: make sure JAX's {platform} backend can start (jax.devices('{platform}')).")
    return [(t.type_id, t.info_address) for t in kernel.types]
