"""Registering op handlers with the running JAX/XLA, and listing what is registered.

Registration is idempotent and lazy: the JAX frontend calls :func:`ensure_registered`
when it lowers an op for a platform, so a CPU-only program never builds CUDA code.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> ensure_registered(simple_add, "cpu")        # doctest: +SKIP
    Registration(target='xla_kernels.simple_add', platform='cpu', runtime='jax', ...)
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from xla_kernels.errors import RegistrationError
from xla_kernels.runtime.library import load_kernel

if TYPE_CHECKING:
    from xla_kernels.op import Op

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


_registrations: dict[tuple[str, str, str], Registration] = {}
# The kernel declaration behind each registration: XLA cannot replace a handler, so a
# second declaration of the same target with other sources must not pass silently.
_kernels: dict[tuple[str, str, str], object] = {}
_lock = threading.Lock()


def ensure_registered(op: Op, platform: str, runtime: str = "jax") -> Registration:
    """Build, load and register ``op``'s handler for ``platform`` with ``runtime``, once."""
    key = (op.target, platform, runtime)
    with _lock:
        if key in _registrations:
            if _kernels[key] != op.kernels.get(platform):
                raise RegistrationError(
                    f"{op.name}: target already registered for {platform} by another "
                    f"declaration (handler {_registrations[key].handler} from "
                    f"{_registrations[key].library}), and XLA cannot replace a handler. "
                    "Fix: give this op another name, or reuse the first declaration.")
            return _registrations[key]
    kernel = load_kernel(op, platform)
    if runtime != "jax":
        raise RegistrationError(f"{op.name}: unknown runtime {runtime!r}. Fix: use 'jax'; "
                                "torch_xla registers through xla_kernels.frontends.torch_xla.")
    import jax

    try:
        jax.ffi.register_ffi_target(op.target, jax.ffi.pycapsule(kernel.function),
                                    platform=JAX_PLATFORM_NAMES[platform], api_version=1)
    except Exception as e:  # XLA raises plain RuntimeError/XlaRuntimeError here
        raise RegistrationError(f"{op.name}: registering handler {kernel.handler} for "
                                f"{platform} with JAX failed: {e}") from e
    registration = Registration(op.target, platform, runtime, kernel.handler, kernel.library)
    with _lock:
        _registrations[key] = registration
        _kernels[key] = op.kernels[platform]
    return registration


def registrations() -> list[Registration]:
    """Everything xla-kernels registered in this process, sorted by target and platform.

    Example:
        >>> [r.target for r in registrations()]      # doctest: +SKIP
        ['xla_kernels.simple_add']
    """
    with _lock:
        return sorted(_registrations.values(), key=lambda r: (r.target, r.platform, r.runtime))


def is_registered(target: str, platform: str, runtime: str = "jax") -> bool:
    """Whether ``target`` was registered by xla-kernels for ``platform`` with ``runtime``."""
    with _lock:
        return (target, platform, runtime) in _registrations
