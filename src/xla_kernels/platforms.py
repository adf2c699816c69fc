"""The one table of platforms: what each runtime calls them.

xla-kernels names a platform ``"cpu"`` or ``"cuda"`` (the keys of ``Op(kernels=...)``).
Every runtime spells it its own way; this table is the only place those spellings live.

Example:
    >>> PLATFORMS["cuda"].jax_registration, PLATFORMS["cuda"].torch_dispatch_key
    ('CUDA', 'CUDA')
    >>> platform_of("gpu").name, platform_for_torch_device("cpu").name
    ('cuda', 'cpu')
"""

from __future__ import annotations

import dataclasses

from xla_kernels.errors import PlatformError


@dataclasses.dataclass(frozen=True)
class Platform:
    """How one platform is named by each runtime xla-kernels talks to.

    Attributes:
        name: xla-kernels' name, the key of ``Op(kernels=...)``.
        jax_lowering: the platform name of ``mlir.register_lowering`` (``jax.devices()``).
        jax_registration: the name ``jax.ffi.register_ffi_target`` expects.
        torch_device: ``torch.device(...).type`` of tensors that run on it eagerly.
        torch_dispatch_key: the torch dispatcher key of its eager kernel.
        eager_kind: ``XkDevice.platform`` of the eager FFI runtime (``eager_ffi.h``).
        torch_xla_registration: the platform name torch_xla's XLA FFI registry expects.
        source_suffixes: source files a kernel for it may be built from.
        aliases: other names users and runtimes give it.
    """

    name: str
    jax_lowering: str
    jax_registration: str
    torch_device: str
    torch_dispatch_key: str
    eager_kind: int
    torch_xla_registration: str
    source_suffixes: tuple[str, ...]
    aliases: tuple[str, ...] = ()


PLATFORMS: dict[str, Platform] = {
    "cpu": Platform("cpu", jax_lowering="cpu", jax_registration="cpu", torch_device="cpu",
                    torch_dispatch_key="CPU", eager_kind=0, torch_xla_registration="Host",
                    source_suffixes=(".cc", ".cpp", ".cxx", ".c++"), aliases=("host",)),
    "cuda": Platform("cuda", jax_lowering="cuda", jax_registration="CUDA", torch_device="cuda",
                     torch_dispatch_key="CUDA", eager_kind=1, torch_xla_registration="CUDA",
                     source_suffixes=(".cu", ".cc", ".cpp", ".cxx", ".c++"), aliases=("gpu",)),
}
"""Every platform xla-kernels builds kernels for, by name."""

NAMES: tuple[str, ...] = tuple(PLATFORMS)
"""``("cpu", "cuda")``: the keys ``Op(kernels=...)`` accepts."""

_BY_ALIAS = {alias: p for p in PLATFORMS.values()
             for alias in (p.name, p.jax_registration.lower(), p.torch_xla_registration.lower(),
                           *p.aliases)}


def platform_of(name: str) -> Platform:
    """The platform a runtime's name stands for (``"cpu"``, ``"Host"``, ``"gpu"``, ``"CUDA"``).

    Example:
        >>> platform_of("Host").name
        'cpu'
    """
    platform = _BY_ALIAS.get(str(name).lower())
    if platform is None:
        raise PlatformError(f"unknown platform {name!r}. Fix: use one of {', '.join(NAMES)}.")
    return platform


def platform_for_torch_device(device_type: str) -> Platform:
    """The platform whose eager kernels run tensors of ``torch.device(...).type``.

    Example:
        >>> platform_for_torch_device("cuda").torch_dispatch_key
        'CUDA'
    """
    for platform in PLATFORMS.values():
        if platform.torch_device == device_type:
            return platform
    raise PlatformError(f"tensors on {device_type!r} have no eager kernels. Fix: move them to "
                        f"{' or '.join(p.torch_device for p in PLATFORMS.values())}.")


def no_kernel_error(op: str, platform: str, has: object, fix: str) -> PlatformError:
    """The one message for an op run where it has no kernel.

    Example:
        >>> print(no_kernel_error("my.add", "cuda", ["cpu"], "use CPU inputs"))
        my.add: no kernel for platform 'cuda' (it has kernels for cpu). Fix: use CPU inputs.
    """
    kinds = ", ".join(sorted(has)) or "none"  # type: ignore[call-overload]
    return PlatformError(f"{op}: no kernel for platform '{platform}' (it has kernels for "
                         f"{kinds}). Fix: {fix}.")
