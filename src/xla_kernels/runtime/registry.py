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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_kernels import platforms
from xla_kernels.errors import RegistrationError
from xla_kernels.record import records
from xla_kernels.runtime.ffi_types import ensure_types
from xla_kernels.runtime.guard import guarded
from xla_kernels.runtime.library import kernel_of

if TYPE_CHECKING:
    from xla_kernels.op import Op

__all__ = ["JAX_PLATFORM_NAMES", "Registration", "ensure_registered", "ensure_types",
           "is_registered", "registrations"]

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

    The handler is the one the runtime loaded for the op's record (:func:`kernel_of`),
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
        kernel = kernel_of(op, platform)
        import jax

        ensure_types(kernel, platform)
        # The execute handler behind its guard, which names the op when the handler's
        # binding disagrees with the declaration (runtime/guard.py).
        execute = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
            guarded(op, platform, kernel))
        target: Any = jax.ffi.pycapsule(execute)
        if set(kernel.stages) - {"execute"}:  # one handler per stage
            target = {stage: jax.ffi.pycapsule(fn) for stage, fn in kernel.stages.items()}
            target["execute"] = jax.ffi.pycapsule(execute)
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
