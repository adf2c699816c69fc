"""Registering op handlers with the running JAX/XLA, and listing what is registered.

Registration is idempotent and lazy: the JAX frontend calls :func:`ensure_registered`
when it lowers an op for a platform, so a CPU-only program never builds CUDA code.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> ensure_registered(simple_add, "cpu")        # doctest: +SKIP
    Registration(target='xla_kernels.simple_add', platform='cpu', runtime='jax', ...)
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_kernels import platforms
from xla_kernels.errors import RegistrationError
from xla_kernels.record import records

if TYPE_CHECKING:
    from xla_kernels.op import Op
    from xla_kernels.runtime.library import LoadedKernel

# xla-kernels platform name -> the name JAX's register_ffi_target expects.
JAX_PLATFORM_NAMES = {"cpu": "cpu", "cuda": "CUDA"}


@dataclasses.dataclass(frozen=True)
class Registration:
    """One handler registered with one runtime for one platform."""

    target: str
    platform: str
    runtime: str
    handler: str
    library: Path


def ensure_registered(op: Op, platform: str, runtime: str = "jax") -> Registration:
    """Build, load and register ``op``'s handler for ``platform`` with ``runtime``, once.

    The handler is the one the op's record loaded (see :class:`xla_kernels.record.OpRecord`),
    so JAX and the eager frontends always run the same code.
    """
    if runtime != "jax":
        raise RegistrationError(f"{op.name}: unknown runtime {runtime!r}. Fix: use 'jax'; "
                                "torch_xla registers through xla_kernels.frontends.torch_xla.")
    record = op.record
    with record.lock:
        known = record.jax_registrations.get(platform)
        if known is not None:
            return known
        kernel = record.kernel(platform)
        import jax

        ensure_types(kernel, platform)
        target: Any = jax.ffi.pycapsule(kernel.function)
        if set(kernel.stages) - {"execute"}:  # one handler per stage
            target = {stage: jax.ffi.pycapsule(fn) for stage, fn in kernel.stages.items()}
        try:
            jax.ffi.register_ffi_target(
                op.target, target,
                platform=platforms.PLATFORMS[platform].jax_registration, api_version=1)
        except Exception as e:  # XLA raises plain RuntimeError/XlaRuntimeError here
            raise RegistrationError(f"{op.name}: registering handler {kernel.handler} for "
                                    f"{platform} with JAX failed: {e}") from e
        registration = Registration(op.target, platform, runtime, kernel.handler,
                                    kernel.library)
        record.jax_registrations[platform] = registration
        return registration


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
        >>> ensure_types(op.record.kernel("cpu"), assign=True)     # doctest: +SKIP
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


def registrations() -> list[Registration]:
    """Everything xla-kernels registered in this process, sorted by target and platform.

    Example:
        >>> [r.target for r in registrations()]      # doctest: +SKIP
        ['xla_kernels.simple_add']
    """
    return [r for record in records().values()
            for _, r in sorted(record.jax_registrations.items())]


def is_registered(target: str, platform: str, runtime: str = "jax") -> bool:
    """Whether ``target`` was registered by xla-kernels for ``platform`` with ``runtime``."""
    record = records().get(target)
    return runtime == "jax" and record is not None and platform in record.jax_registrations
