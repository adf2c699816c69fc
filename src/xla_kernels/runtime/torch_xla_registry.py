"""Registering typed XLA FFI handlers with torch_xla's runtime.

torch_xla 2.9 links XLA (and its PJRT CPU client) statically into ``_XLAC.so``. Its
``_XLAC._xla_register_custom_call_target`` raises "not implemented", and the only public
PJRT CPU plugin (``xla-cpu-pjrt`` 0.0.1, PJRT C API 0.81) is newer than the PJRT C API
torch_xla 2.9 was built with, so it cannot execute there (see ``docs/torch_xla.md``).

What works is XLA's own FFI registry inside ``_XLAC.so``: the CPU client looks handlers
up there when it compiles a custom call with ``api_version=API_VERSION_TYPED_FFI``.
``xla::ffi::GetXlaFfiApi()`` is not exported, but ``_XLAC.so`` keeps its full ELF symbol
table, so :func:`register_handler` finds the function's offset there, turns it into an
address with an exported anchor symbol (``PyInit__XLAC``) of the already-loaded module,
gets the ``XLA_FFI_Api`` and calls its ``XLA_FFI_Handler_Register`` with ``platform="Host"``.
That is exactly what ``jax.ffi.register_ffi_target`` does inside jaxlib.

XLA checks at registration that the handler was compiled against the same XLA FFI API
version as the runtime (torch_xla 2.9: 0.1, the headers of ``jaxlib==0.7.1``); a handler
built against newer headers (jaxlib 0.10: 0.3) is refused with a clear message.

Example:
    >>> import ctypes
    >>> lib = ctypes.CDLL("libmy_kernels.so")                          # doctest: +SKIP
    >>> addr = ctypes.cast(lib.MyAdd, ctypes.c_void_p).value           # doctest: +SKIP
    >>> register_handler("my_lib.add", addr, "cpu")                    # doctest: +SKIP
    >>> ffi_api_version()                                              # doctest: +SKIP
    (0, 1)
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os
import struct
import threading
from pathlib import Path

from xla_kernels import env
from xla_kernels.errors import RegistrationError

#: Mangled name of ``xla::ffi::GetXlaFfiApi()`` (a local symbol in ``_XLAC.so``).
GET_FFI_API_SYMBOL = "_ZN3xla3ffi12GetXlaFfiApiEv"
#: Mangled name of ``xla::ffi::api``, the ``XLA_FFI_Api`` that GetXlaFfiApi returns.
FFI_API_SYMBOL = "_ZN3xla3ffi3apiE"
#: An exported symbol of ``_XLAC.so`` whose run-time address anchors the others.
ANCHOR_SYMBOL = "PyInit__XLAC"
#: The XLA FFI API major version this module's struct layouts follow.
SUPPORTED_FFI_MAJOR = 0
#: XLA FFI API version -> a jaxlib whose ``jax.ffi.include_dir()`` holds those headers.
HEADERS_FOR_FFI_VERSION = {(0, 1): "jaxlib==0.7.1", (0, 3): "jaxlib==0.10.2"}

# Offsets in XLA_FFI_Api (xla/ffi/api/c_api.h, stable across FFI 0.x):
#   size_t struct_size; void* extension_start; XLA_FFI_Api_Version api_version (24 bytes:
#   struct_size, extension_start, int major, int minor); const void* internal_api; then
#   function pointers: Error_Create, Error_GetMessage, Error_Destroy, Handler_Register, ...
_API_MAJOR_OFFSET = 32
_API_MINOR_OFFSET = 36
_API_FIRST_FN_OFFSET = 48
_FN_ERROR_GET_MESSAGE, _FN_ERROR_DESTROY, _FN_HANDLER_REGISTER = 1, 2, 3
_API_MIN_STRUCT_SIZE = _API_FIRST_FN_OFFSET + 8 * (_FN_HANDLER_REGISTER + 1)

_PLATFORMS = {"cpu": "Host", "host": "Host", "cuda": "CUDA", "gpu": "CUDA"}

_VoidP = ctypes.c_void_p


class _ByteSpan(ctypes.Structure):
    _fields_ = (("ptr", ctypes.c_char_p), ("len", ctypes.c_size_t))


class _HandlerBundle(ctypes.Structure):
    _fields_ = (("instantiate", _VoidP), ("prepare", _VoidP), ("initialize", _VoidP),
                ("execute", _VoidP))


class _HandlerRegisterArgs(ctypes.Structure):
    _fields_ = (("struct_size", ctypes.c_size_t), ("extension_start", _VoidP),
                ("name", _ByteSpan), ("platform", _ByteSpan), ("bundle", _HandlerBundle),
                ("traits", ctypes.c_uint32))


class _ErrorGetMessageArgs(ctypes.Structure):
    _fields_ = (("struct_size", ctypes.c_size_t), ("extension_start", _VoidP),
                ("error", _VoidP), ("message", ctypes.c_char_p))


class _ErrorDestroyArgs(ctypes.Structure):
    _fields_ = (("struct_size", ctypes.c_size_t), ("extension_start", _VoidP),
                ("error", _VoidP))


# XLA_FFI_DEFINE_STRUCT_TRAITS(T, last_field): size = offsetof(last) + sizeof(last).
_REGISTER_ARGS_SIZE = _HandlerRegisterArgs.traits.offset + 4
_GET_MESSAGE_ARGS_SIZE = ctypes.sizeof(_ErrorGetMessageArgs)
_DESTROY_ARGS_SIZE = ctypes.sizeof(_ErrorDestroyArgs)


@dataclasses.dataclass(frozen=True)
class TorchXlaRegistration:
    """One handler registered with torch_xla's built-in XLA runtime."""

    target: str
    platform: str
    address: int
    ffi_version: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class _FfiApi:
    address: int
    version: tuple[int, int]
    register: ctypes._CFuncPtr
    get_message: ctypes._CFuncPtr
    destroy: ctypes._CFuncPtr


_lock = threading.Lock()
_api: _FfiApi | None = None
_registered: dict[tuple[str, str], TorchXlaRegistration] = {}


def elf_symbol_values(path: str | Path, names: list[str]) -> dict[str, int]:
    """``st_value`` of each of ``names`` in the ELF ``.symtab`` (local symbols included).

    Names missing from the table, or a file without a ``.symtab`` (stripped), are left out
    of the result.

    Example:
        >>> elf_symbol_values("/usr/lib/x86_64-linux-gnu/libc.so.6", ["nope"])  # doctest: +SKIP
        {}
    """
    import numpy as np

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as f:
        if f[:4] != b"\x7fELF" or f[4] != 2 or f[5] != 1:
            raise RegistrationError(f"{path} is not a little-endian 64-bit ELF file")
        shoff = struct.unpack_from("<Q", f, 0x28)[0]
        shentsize, shnum = struct.unpack_from("<HH", f, 0x3A)
        # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
        sections = [struct.unpack_from("<IIQQQQIIQQ", f, shoff + i * shentsize)
                    for i in range(shnum)]
        symtab = next((s for s in sections if s[1] == 2), None)  # SHT_SYMTAB
        if symtab is None:
            return {}
        strtab = sections[symtab[6]]
        wanted: dict[int, str] = {}
        for name in names:
            pos = f.find(b"\0" + name.encode() + b"\0", strtab[4], strtab[4] + strtab[5])
            if pos >= 0:
                wanted[pos + 1 - strtab[4]] = name
        if not wanted:
            return {}
        sym = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                        ("value", "<u8"), ("size", "<u8")])
        raw = f[symtab[4]:symtab[4] + symtab[5] // sym.itemsize * sym.itemsize]  # a copy
    table = np.frombuffer(raw, dtype=sym)
    hits = np.nonzero(np.isin(table["name"], list(wanted)) & (table["shndx"] != 0))[0]
    return {wanted[int(table["name"][i])]: int(table["value"][i]) for i in hits}


def _find_ffi_api() -> _FfiApi:
    try:
        import torch_xla
    except ImportError as e:
        raise RegistrationError(
            f"torch_xla is not importable ({e}). Fix: run scripts/torch_xla_env.sh, or "
            "pip install torch==2.9.0 torch_xla==2.9.0.") from e
    so = torch_xla._XLAC.__file__
    version = getattr(torch_xla, "__version__", "?")
    values = elf_symbol_values(so, [GET_FFI_API_SYMBOL, ANCHOR_SYMBOL, FFI_API_SYMBOL])
    if GET_FFI_API_SYMBOL not in values or ANCHOR_SYMBOL not in values:
        raise RegistrationError(
            f"torch_xla {version}: {so} has no symbol table entry for xla::ffi::GetXlaFfiApi "
            "(stripped build?), so typed FFI handlers cannot be registered with its runtime. "
            "Fix: use torch_xla 2.9.0 from PyPI (its _XLAC.so keeps .symtab), or run the op "
            "through JAX/torchax.")
    module = ctypes.CDLL(so, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # the instance torch uses
    anchor = ctypes.cast(getattr(module, ANCHOR_SYMBOL), _VoidP).value or 0
    base = anchor - values[ANCHOR_SYMBOL]
    address = ctypes.CFUNCTYPE(_VoidP)(base + values[GET_FFI_API_SYMBOL])() or 0
    expected = base + values[FFI_API_SYMBOL] if FFI_API_SYMBOL in values else address
    if not address or address != expected:
        raise RegistrationError(
            f"torch_xla {version}: xla::ffi::GetXlaFfiApi() returned {address:#x}, expected "
            f"{expected:#x} (xla::ffi::api). Fix: reinstall torch_xla 2.9.0.")
    size = ctypes.c_size_t.from_address(address).value
    major = ctypes.c_int.from_address(address + _API_MAJOR_OFFSET).value
    minor = ctypes.c_int.from_address(address + _API_MINOR_OFFSET).value
    if major != SUPPORTED_FFI_MAJOR or size < _API_MIN_STRUCT_SIZE:
        raise RegistrationError(
            f"torch_xla {version}: its XLA FFI API is version {major}.{minor} with a "
            f"{size}-byte XLA_FFI_Api; xla-kernels knows major version {SUPPORTED_FFI_MAJOR}. "
            "Fix: use torch_xla 2.9.0, or extend runtime/torch_xla_registry.py for this version.")

    def fn(index: int, argtype: type) -> ctypes._CFuncPtr:
        ptr = _VoidP.from_address(address + _API_FIRST_FN_OFFSET + 8 * index).value
        return ctypes.CFUNCTYPE(_VoidP, ctypes.POINTER(argtype))(ptr)

    return _FfiApi(address, (major, minor),
                   fn(_FN_HANDLER_REGISTER, _HandlerRegisterArgs),
                   fn(_FN_ERROR_GET_MESSAGE, _ErrorGetMessageArgs),
                   fn(_FN_ERROR_DESTROY, _ErrorDestroyArgs))


def _ffi_api() -> _FfiApi:
    global _api
    with _lock:
        if _api is None:
            _api = _find_ffi_api()
        return _api


def ffi_api_version() -> tuple[int, int]:
    """The XLA FFI API version (major, minor) of torch_xla's built-in XLA runtime.

    Handlers must be compiled against FFI headers of exactly this version.

    Example:
        >>> ffi_api_version()     # torch_xla 2.9.0          # doctest: +SKIP
        (0, 1)
    """
    return _ffi_api().version


def _take_error(api: _FfiApi, error: int) -> str:
    args = _ErrorGetMessageArgs(_GET_MESSAGE_ARGS_SIZE, None, error, None)
    api.get_message(ctypes.byref(args))
    message = (args.message or b"unknown XLA FFI error").decode(errors="replace")
    api.destroy(ctypes.byref(_ErrorDestroyArgs(_DESTROY_ARGS_SIZE, None, error)))
    return message


def _check_runtime_device() -> None:
    device = (env.get("PJRT_DEVICE") or "").upper()
    if device and device != "CPU":
        raise RegistrationError(
            f"PJRT_DEVICE={device}: handlers registered by xla-kernels land in the XLA FFI "
            "registry built into torch_xla's _XLAC.so, which only its built-in CPU client "
            "consults; a PJRT plugin or TPU runtime has its own registry. "
            "Fix: run with PJRT_DEVICE=CPU.")


def check_platform(platform: str, target: str = "<op>") -> None:
    """Raise :class:`RegistrationError` unless torch_xla can execute typed FFI on ``platform``.

    Example:
        >>> check_platform("cpu")
        >>> check_platform("cuda")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        xla_kernels.errors.RegistrationError: <op>: typed FFI custom calls cannot execute ...
    """
    key = platform.lower()
    if key not in _PLATFORMS:
        raise RegistrationError(f"{target}: unknown platform {platform!r}. Fix: use 'cpu'.")
    if _PLATFORMS[key] == "CUDA":
        import importlib.metadata as md

        try:
            have = f"torch_xla {md.version('torch_xla')}"
        except md.PackageNotFoundError:
            have = "torch_xla (not installed)"
        raise RegistrationError(
            f"{target}: typed FFI custom calls cannot execute on CUDA through torch_xla "
            f"({have}): torch_xla 2.9 dropped CUDA (no GPU client, and "
            "_xla_register_custom_call_target raises 'not implemented'); torch_xla <= 2.8 "
            "registers CUDA targets with api_version=0 (untyped) only. Fix: run on "
            "torch_xla's CPU client (platform='cpu'), or use the JAX/torchax frontends on GPU.")


def register_handler(target: str, handler_address: int, platform: str) -> TorchXlaRegistration:
    """Register a typed XLA FFI handler for ``target`` with torch_xla's current runtime.

    Args:
        target: the ``custom_call_target`` name the HLO uses.
        handler_address: address of the ``XLA_FFI_Handler`` (the symbol defined by
            ``XLA_FFI_DEFINE_HANDLER_SYMBOL``), e.g. from ``ctypes.cast(fn, c_void_p)``.
        platform: ``"cpu"`` (the only one torch_xla 2.9 can execute); ``"cuda"`` raises.

    Returns the registration. Registering the same handler again is a no-op; a different
    handler under the same name raises. Raises :class:`RegistrationError` where the
    combination cannot execute: CUDA (torch_xla 2.9 has no CUDA runtime, and earlier
    releases register only untyped ``api_version=0`` targets), a non-CPU ``PJRT_DEVICE``,
    a torch_xla without the symbol this route needs, or a handler compiled against XLA FFI
    headers of another version than the runtime's.

    Example:
        >>> import ctypes
        >>> lib = ctypes.CDLL("/tmp/libxk_test.so")                      # doctest: +SKIP
        >>> register_handler("xk_test_add",
        ...                  ctypes.cast(lib.xk_test_add, ctypes.c_void_p).value, "cpu")
        ...                                                               # doctest: +SKIP
        TorchXlaRegistration(target='xk_test_add', platform='cpu', address=..., ...)
    """
    check_platform(platform, target)
    if not isinstance(handler_address, int) or handler_address <= 0:
        raise RegistrationError(f"{target}: handler_address must be a positive int, got "
                                f"{handler_address!r}")
    _check_runtime_device()
    api = _ffi_api()
    with _lock:
        known = _registered.get((target, "cpu"))
        if known is not None:
            if known.address == handler_address:
                return known
            raise RegistrationError(
                f"{target}: already registered with torch_xla for cpu with another handler "
                f"({known.address:#x}, now {handler_address:#x}). Fix: register each target "
                "name once per process, or give the new kernel its own target name.")
        name, plat = target.encode(), _PLATFORMS[platform.lower()].encode()
        args = _HandlerRegisterArgs(
            _REGISTER_ARGS_SIZE, None, _ByteSpan(name, len(name)), _ByteSpan(plat, len(plat)),
            _HandlerBundle(None, None, None, handler_address), 0)
        error = api.register(ctypes.byref(args))
        if error:
            message = _take_error(api, error)
            fix = "check the handler symbol"
            if "API version" in message:
                headers = HEADERS_FOR_FFI_VERSION.get(api.version, "matching XLA FFI headers")
                fix = (f"rebuild the handler against XLA FFI {api.version[0]}.{api.version[1]} "
                       f"headers (jax.ffi.include_dir() of {headers}; scripts/torch_xla_env.sh "
                       "installs it)")
            raise RegistrationError(f"{target}: torch_xla refused the handler: {message}. "
                                    f"Fix: {fix}.")
        registration = TorchXlaRegistration(target, "cpu", handler_address, api.version)
        _registered[(target, "cpu")] = registration
        return registration


def registered_handlers() -> list[TorchXlaRegistration]:
    """Handlers registered with torch_xla by :func:`register_handler` in this process."""
    with _lock:
        return sorted(_registered.values(), key=lambda r: r.target)
