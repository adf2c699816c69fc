"""Eager mode: call a typed XLA FFI handler without XLA.

PyTorch eager (CPU and CUDA tensors) runs the very handler function that XLA runs: a
small C++ runtime (``eager_ffi.cc``, built once per process) builds the
``XLA_FFI_CallFrame`` that XLA would build, with its own ``XLA_FFI_Api`` table, and
calls the handler on the calling thread. Buffers are passed by address (zero-copy);
CUDA handlers get the stream you pass from ``XLA_FFI_Stream_Get``.

What a handler gets from the eager runtime:

* ``PlatformStream``: ``stream`` on ``platform="cuda"``, ``nullptr`` on ``"cpu"``.
* ``DeviceOrdinal``: ``device_ordinal``. ``RunId``: 0.
* ``ScratchAllocator``: host memory (aligned malloc) on CPU; on CUDA the
  :class:`DeviceAllocator` passed as ``allocator=``, else allocation fails with an error.
* ``ThreadPool``: ``num_threads() == 0``; ``Schedule`` runs the task inline.
* ``State<T>``: for kernels that declare an instantiate handler
  (``Kernel(handler={"instantiate": ..., "execute": ...})``), the first call with given
  attributes (per platform and device) runs the instantiate handler (no buffers), then
  the prepare and initialize handlers if declared (with that call's buffers), and keeps
  the states they set; every call then runs execute with them. States are deleted when
  the op is redeclared and at exit (see :func:`declare_stages`, docs/stages.md).
* ``UserData`` (execution context) and asynchronous handlers (returning ``ffi::Future``):
  an error saying they are not available in eager mode.

Example:
    >>> import ctypes, numpy as np
    >>> lib = ctypes.CDLL("libmy_kernels.so")                         # doctest: +SKIP
    >>> fn = ctypes.cast(lib.MyAdd, ctypes.c_void_p).value            # doctest: +SKIP
    >>> x, y = np.ones(4, np.float32), np.empty(4, np.float32)
    >>> call_handler(fn, args=[Buffer.from_array(x)], rets=[Buffer.from_array(y)],
    ...              attrs={"alpha": np.float32(2.0)}, op_name="my_add")  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from xla_kernels import dtypes, platforms
from xla_kernels.attr_types import EagerAttr, attr_type_of_value
from xla_kernels.errors import OpInputError, OpTypeError, RegistrationError, XlaKernelsError

__all__ = [
    "AttrMismatchError",
    "BindingMismatchError",
    "Buffer",
    "DeviceAllocator",
    "HandlerMetadata",
    "KernelError",
    "call_handler",
    "declare_stages",
    "drop_states",
    "ffi_api_version",
    "handler_metadata",
    "kernel_error",
    "state_count",
]

_SOURCE = Path(__file__).with_name("eager_ffi.cc")

#: Must equal XK_EAGER_ABI_VERSION in eager_ffi.h.
_ABI_VERSION = 2

# XkDevice.platform (eager_ffi.h), from the platform table.
_PLATFORMS = {p.name: p.eager_kind for p in platforms.PLATFORMS.values()}

# XLA_FFI_Error_Code names, for messages and KernelError.code_name.
_ERROR_CODES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
)

_ERR_LEN = 2048  # bytes of error message kept

# dtype short name -> XLA_FFI_DataType, for the per-call fast path.
_BUFFER_CODES = {name: dtypes.ffi_code(name) for name in dtypes.ALL}
# The codec of each NumPy scalar type, for the per-call fast path of raw attribute values.
_SCALAR_CODECS = {dtypes.to_numpy(n).type: attr_type_of_value(dtypes.to_numpy(n).type(0))
                  for n in ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
                            "f32", "f64")}


class KernelError(XlaKernelsError, RuntimeError):
    """A handler called eagerly returned an error (or threw a C++ exception).

    Attributes:
        op: the op name passed to :func:`call_handler`.
        code: the ``XLA_FFI_Error_Code`` (e.g. 3 for ``INVALID_ARGUMENT``).
        code_name: its name, e.g. ``"INVALID_ARGUMENT"``.
        handler_message: the handler's own message.

    Example:
        >>> e = KernelError("my_op", "bad shape", 3)
        >>> str(e), e.code_name
        ('my_op: kernel failed: bad shape', 'INVALID_ARGUMENT')
    """

    def __init__(self, op: str, handler_message: str, code: int, *,
                 attrs: Mapping[str, Any] | None = None,
                 encoded: Sequence[EagerAttr] | None = None, first_attr: int | None = None):
        self.op = op
        self.code = code
        self.code_name = _ERROR_CODES[code] if 0 <= code < len(_ERROR_CODES) else str(code)
        self.handler_message = handler_message
        # What the call passed, for xla_kernels.diagnostics to explain a decoding failure.
        self.call_attrs, self.call_encoded, self.first_attr = attrs, encoded, first_attr
        super().__init__(f"{op}: kernel failed: {handler_message}")


class AttrMismatchError(KernelError, TypeError):
    """The handler binds an attribute with another type than the declaration passes.

    XLA's typed FFI reports it as "Failed to decode all FFI handler operands (bad operands
    at: N)"; :mod:`xla_kernels.diagnostics` maps that back to the declaration. Raised by
    the eager runtime and by :func:`xla_kernels.explained_errors` around JAX calls.

    Attributes:
        attr: the attribute's name.
        declared: how the declaration passes it, e.g. ``"int (int64_t)"``.
        expected: what the handler binds, e.g. ``"int32_t"``.
        xla_message: the FFI's own message.

    Example:
        >>> e = AttrMismatchError("my_op", "n", "int (int64_t)", "int32_t",
        ...                       "my_op: argument 'n': ...", "bad operands at: 2")
        >>> isinstance(e, TypeError), e.code_name
        (True, 'INVALID_ARGUMENT')
    """

    def __init__(self, op: str, attr: str, declared: str, expected: str, message: str,
                 xla_message: str, code: int = 3):
        super().__init__(op, xla_message, code)
        self.attr, self.declared, self.expected = attr, declared, expected
        self.xla_message = xla_message
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


class BindingMismatchError(KernelError, TypeError):
    """The handler binds other arguments, results or attributes than the declaration passes
    (a count, a buffer dtype or rank, an attribute name or type).

    :mod:`xla_kernels.runtime.bindings` words it; JAX calls fail with the same words.

    Attributes:
        xla_message: the FFI's own message.

    Example:
        >>> e = BindingMismatchError("my_op", "my_op: its handler ...", "Wrong number ...")
        >>> isinstance(e, TypeError), str(e)
        (True, 'my_op: its handler ...')
    """

    def __init__(self, op: str, message: str, xla_message: str, code: int = 3):
        super().__init__(op, xla_message, code)
        self.xla_message = xla_message
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


def kernel_error(op: str, message: str, code: int, *, attrs: Mapping[str, Any] | None = None,
                 encoded: Sequence[EagerAttr] | None = None, first_attr: int | None = None
                 ) -> KernelError:
    """The exception of a failed handler: a :class:`KernelError` that keeps what the call
    passed (``attrs``/``encoded``: its attributes and their encodings; ``first_attr``:
    argument + result count). The eager runtime raises it and explains nothing: the
    frontends turn a typed-FFI decoding failure into an :class:`AttrMismatchError` with
    :func:`xla_kernels.diagnostics.explain_kernel_error` (or :func:`xla_kernels.explain`).

    Example:
        >>> kernel_error("my_op", "bad shape", 3)
        KernelError('my_op: kernel failed: bad shape')
    """
    return KernelError(op, message, code, attrs=attrs, encoded=encoded, first_attr=first_attr)


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One argument or result: a dense, row-major array at ``ptr``.

    Args:
        ptr: device or host address of the first element.
        dtype: element type, a short name from :mod:`xla_kernels.dtypes` (``"f32"``,
            ``"bf16"``, ...).
        shape: dimensions, outermost first.

    Example:
        >>> import numpy as np
        >>> x = np.zeros((2, 3), np.float16)
        >>> b = Buffer.from_array(x)
        >>> b.dtype, b.shape, b.ptr == x.ctypes.data
        ('f16', (2, 3), True)
    """

    ptr: int
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def from_array(cls, array: Any, *, op: str = "<eager>", arg: str = "array") -> Buffer:
        """The buffer of a C-contiguous NumPy array or a contiguous torch tensor (zero-copy).

        The array must stay alive while a call uses the buffer.

        Example:
            >>> import numpy as np
            >>> Buffer.from_array(np.arange(3, dtype=np.int32)).shape
            (3,)
        """
        if isinstance(array, np.ndarray):
            if not array.flags.c_contiguous:
                raise OpInputError(op, arg, "the array is not C-contiguous",
                                   "pass np.ascontiguousarray(array)")
            return cls(array.ctypes.data, dtypes.canonical(array.dtype), tuple(array.shape))
        if type(array).__module__.startswith("torch") and hasattr(array, "data_ptr"):
            if not array.is_contiguous():
                raise OpInputError(op, arg, "the tensor is not contiguous",
                                   "pass tensor.contiguous()")
            return cls(array.data_ptr(), dtypes.canonical(array.dtype), tuple(array.shape))
        raise OpTypeError(op, arg, f"expected a NumPy array or torch tensor, got "
                                   f"{type(array).__name__}")


class DeviceAllocator:
    """Scratch memory for handlers called eagerly on CUDA (``ffi::ScratchAllocator``).

    ``alloc(size, alignment, device_ordinal, stream) -> address`` returns a device address
    (0 on failure); ``free(address, size, device_ordinal, stream)`` releases it. Handlers
    free their scratch before they return, while kernels they queued on ``stream`` may
    still use it: the allocator must be stream-ordered (reuse memory only for work
    queued after it on that stream), as torch's caching allocator is. An exception in a
    callback fails the allocation; it becomes the ``__cause__`` of the KernelError.

    Example:
        >>> alloc = DeviceAllocator.torch_cuda()                     # doctest: +SKIP
        >>> call_handler(fn, args=..., rets=..., attrs={}, platform="cuda",
        ...              stream=torch.cuda.current_stream().cuda_stream,
        ...              allocator=alloc)                           # doctest: +SKIP
    """

    _ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p)
    _FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_int32, ctypes.c_void_p)

    def __init__(self, alloc: Callable[[int, int, int, int], int],
                 free: Callable[[int, int, int, int], None]):
        self._local = threading.local()

        def c_alloc(_user: Any, size: int, alignment: int, device: int, stream: Any) -> int:
            try:
                return int(alloc(size, alignment, device, stream or 0) or 0)
            except BaseException as e:  # must not propagate into C
                self._local.error = e
                return 0

        def c_free(_user: Any, ptr: Any, size: int, device: int, stream: Any) -> None:
            try:
                free(ptr or 0, size, device, stream or 0)
            except BaseException as e:
                self._local.error = e

        # Keep the ctypes callbacks alive as long as the allocator.
        self._c_alloc = self._ALLOC(c_alloc)
        self._c_free = self._FREE(c_free)
        self.alloc_address: int = ctypes.cast(self._c_alloc, ctypes.c_void_p).value or 0
        self.free_address: int = ctypes.cast(self._c_free, ctypes.c_void_p).value or 0

    def _take_error(self) -> BaseException | None:
        error = getattr(self._local, "error", None)
        self._local.error = None
        return error

    @classmethod
    def torch_cuda(cls) -> DeviceAllocator:
        """Scratch from torch's CUDA caching allocator, on the call's stream."""
        import torch

        def alloc(size: int, alignment: int, device: int, stream: int) -> int:
            return torch.cuda.caching_allocator_alloc(size, device, stream)

        def free(ptr: int, size: int, device: int, stream: int) -> None:
            torch.cuda.caching_allocator_delete(ptr)

        return cls(alloc, free)


@dataclasses.dataclass(frozen=True)
class HandlerMetadata:
    """What a handler reports about itself (as XLA asks it at registration).

    Attributes:
        api_version: ``(major, minor)`` of the XLA FFI headers the handler was built with.
        traits: ``XLA_FFI_Handler_Traits`` bits.
        state_type_id: type id of the state an instantiate handler creates, else 0.
    """

    api_version: tuple[int, int]
    traits: int
    state_type_id: int

    @property
    def command_buffer_compatible(self) -> bool:
        """Whether the handler declared ``ffi::Traits::kCmdBufferCompatible``."""
        return bool(self.traits & 1)


# ------------------------------------------------------------------------ the C++ library

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()
_verified: set[int] = set()  # handler addresses whose API version was checked


def runtime_spec() -> Any:
    """The :class:`~xla_kernels.builder.BuildSpec` of the eager runtime (``eager_ffi.cc``,
    plain C++, no CUDA): prebuilt in the wheel, cached, or built on first use.

    Example:
        >>> runtime_spec().name
        'xk_eager'
    """
    from xla_kernels.builder import BuildSpec

    return BuildSpec.create("xk_eager", [_SOURCE], platform="cpu")


def _build() -> Path:
    """The eager runtime's library: prebuilt, cached or built now (:func:`runtime_spec`)."""
    return runtime_spec().load_path()


def _load() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = _build()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise RegistrationError(
                f"eager runtime: cannot load {path}: {e}. Fix: rebuild with "
                "XLA_KERNELS_CACHE_DIR pointing to an empty folder.") from e
        lib.xk_eager_abi_version.restype = ctypes.c_int32
        lib.xk_eager_abi_version.argtypes = []
        if lib.xk_eager_abi_version() != _ABI_VERSION:
            raise RegistrationError(
                f"eager runtime: {path} has ABI version {lib.xk_eager_abi_version()}, this "
                f"module expects {_ABI_VERSION}. Fix: clear the xla-kernels build cache.")
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
        lib.xk_eager_call_packed.restype = i32
        lib.xk_eager_call_packed.argtypes = [p]
        lib.xk_eager_handler_metadata.restype = i32
        lib.xk_eager_handler_metadata.argtypes = [
            p, ctypes.POINTER(i32), ctypes.POINTER(i32), ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(i64), p, i64]
        lib.xk_eager_ffi_api_version.restype = None
        lib.xk_eager_ffi_api_version.argtypes = [ctypes.POINTER(i32), ctypes.POINTER(i32)]
        lib.xk_eager_api.restype = p
        lib.xk_eager_api.argtypes = []
        lib.xk_eager_call_stage.restype = i32
        lib.xk_eager_call_stage.argtypes = [p, i32, p]
        lib.xk_eager_state_create.restype = p
        lib.xk_eager_state_create.argtypes = []
        lib.xk_eager_state_destroy.restype = None
        lib.xk_eager_state_destroy.argtypes = [p]
        lib.xk_eager_register_type.restype = i32
        lib.xk_eager_register_type.argtypes = [i64, p]
        _lib = lib
        return lib


def ffi_api_version() -> tuple[int, int]:
    """``(major, minor)`` XLA FFI API version the eager runtime implements (builds it).

    Example:
        >>> ffi_api_version()                                      # doctest: +SKIP
        (0, 3)
    """
    lib = _lib or _load()
    major, minor = ctypes.c_int32(), ctypes.c_int32()
    lib.xk_eager_ffi_api_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _address(handler: Any, op: str) -> int:
    if isinstance(handler, int) and not isinstance(handler, bool):
        address = handler
    elif isinstance(handler, ctypes._CFuncPtr):
        address = ctypes.cast(handler, ctypes.c_void_p).value or 0
    else:
        raise OpTypeError(op, "handler", f"expected a function address (int) or a ctypes "
                                         f"function, got {type(handler).__name__}")
    if address <= 0:
        raise OpInputError(op, "handler", "the handler address is null",
                           "pass ctypes.cast(lib.Symbol, ctypes.c_void_p).value")
    return address


def handler_metadata(handler: int | Any, *, op_name: str = "<handler>") -> HandlerMetadata:
    """Ask a handler for its metadata: API version, traits, state type.

    Example:
        >>> handler_metadata(fn).api_version                       # doctest: +SKIP
        (0, 3)
    """
    lib = _lib or _load()
    address = _address(handler, op_name)
    major, minor = ctypes.c_int32(), ctypes.c_int32()
    traits, state = ctypes.c_uint32(), ctypes.c_int64()
    err = ctypes.create_string_buffer(_ERR_LEN)
    code = lib.xk_eager_handler_metadata(address, ctypes.byref(major), ctypes.byref(minor),
                                         ctypes.byref(traits), ctypes.byref(state), err,
                                         _ERR_LEN)
    if code:
        raise KernelError(op_name, err.value.decode("utf-8", "replace"), code)
    return HandlerMetadata((major.value, minor.value), traits.value, state.value)


def _verify(address: int, op: str) -> None:
    """Refuse handlers built against FFI headers the runtime cannot serve (once each)."""
    meta = handler_metadata(address, op_name=op)
    ours = ffi_api_version()
    if meta.api_version[0] != ours[0] or meta.api_version[1] > ours[1]:
        raise RegistrationError(
            f"{op}: the handler was built against XLA FFI API "
            f"{meta.api_version[0]}.{meta.api_version[1]}, the eager runtime implements "
            f"{ours[0]}.{ours[1]}. Fix: rebuild both against the same jaxlib "
            "(jax.ffi.include_dir()): with a prebuilt eager runtime, set "
            "XLA_KERNELS_BUILD=always, or build the handler against the runtime's headers "
            "(XLA_KERNELS_FFI_INCLUDE_DIR).")
    _verified.add(address)


# ------------------------------------------------------------------------ calling

# One call is one block of memory, laid out as the C structs of eager_ffi.h:
#   XkCall | XkDevice | XkBuffer * (nargs + nrets) | XkAttr * nattrs | dims (int64) |
#   attribute names and payloads (8-byte aligned) | error message buffer
_CALL_FMT, _DEVICE_FMT, _BUFFER_FMT, _ATTR_FMT = "PPPqPqPqPq", "iiPPPP", "PPqii", "PqiiPq"
_CALL_SIZE, _DEVICE_SIZE = struct.calcsize("@" + _CALL_FMT), struct.calcsize("@" + _DEVICE_FMT)
_BUFFER_SIZE, _ATTR_SIZE = struct.calcsize("@" + _BUFFER_FMT), struct.calcsize("@PqiiPq8s")
_layouts: dict[tuple[Any, ...], struct.Struct] = {}


def _layout(nbuffers: int, ndims: int, inline_formats: tuple[str, ...]) -> struct.Struct:
    """The struct.Struct of the fixed-size part of a call block (cached): XkCall, XkDevice,
    the XkBuffers, the XkAttrs (each ending with its inline value's format), the dims."""
    key = (nbuffers, ndims, *inline_formats)
    layout = _layouts.get(key)
    if layout is None:
        attrs = "".join(_ATTR_FMT + f for f in inline_formats)
        layout = struct.Struct(f"@{_CALL_FMT}{_DEVICE_FMT}{_BUFFER_FMT * nbuffers}{attrs}"
                               f"{ndims}q")
        if len(_layouts) < 1024:
            _layouts[key] = layout
    return layout


class _Scratch(threading.local):
    """A per-thread call block, reused across calls (not across nested calls)."""

    block: ctypes.Array[ctypes.c_char] | None = None
    view: memoryview | None = None
    busy: bool = False


_scratch = _Scratch()
_names: dict[str, tuple[bytes, int]] = {}  # name -> (UTF-8, NUL-padded to 8 bytes; length)


def _name(name: Any, op: str) -> tuple[bytes, int]:
    entry = _names.get(name) if isinstance(name, str) else None
    if entry is None:
        if not isinstance(name, str) or not name:
            raise OpTypeError(op, None, f"attribute names must be non-empty str, got {name!r}")
        data = name.encode()
        entry = data + bytes(-len(data) % 8), len(data)
        if len(_names) < 4096:
            _names[name] = entry
    return entry


def _encode_attr(name: str, value: Any, op: str) -> EagerAttr:
    """An attribute as the runtime reads it: already encoded (a call plan's), or a raw
    value encoded by the codec of its type (:mod:`xla_kernels.attr_types`).

    Scalars travel in XkAttr.inline_value (packed with the 8-byte ``inline format``);
    strings and arrays travel in the pool.
    """
    if type(value) is EagerAttr:
        return value
    codec = _SCALAR_CODECS.get(type(value)) or attr_type_of_value(value, op=op, name=name)
    return codec.eager(value)


def _buffer_code(buf: Any, op: str, what: str) -> int:
    """XLA_FFI_DataType of a Buffer's dtype (OpTypeError for anything else)."""
    if not isinstance(buf, Buffer):
        raise OpTypeError(op, what, f"expected an eager.Buffer, got {type(buf).__name__}",
                          "wrap arrays with Buffer.from_array(x)")
    code = _BUFFER_CODES.get(buf.dtype)
    if code is None:
        try:
            code = dtypes.ffi_code(buf.dtype)
        except TypeError as e:
            raise OpTypeError(op, what, str(e)) from None
    return code


class _Device(NamedTuple):
    """Where a call runs: what XkDevice carries, and the platform name that keys states."""

    platform: str
    kind: int  # platforms' eager_kind
    ordinal: int
    stream: int
    allocator: DeviceAllocator | None


class _Packed(NamedTuple):
    """A call block ready for the runtime: the block (kept alive here), its address, where
    its error message goes, the encoded attributes and the buffer count (for messages), and
    whether it was packed within another call (which still holds the thread's scratch)."""

    block: ctypes.Array[ctypes.c_char]
    base: int
    err_off: int
    encoded: list[EagerAttr]
    nbuffers: int
    nested: bool


def call_handler(
    handler: int | Any,
    *,
    args: Sequence[Buffer],
    rets: Sequence[Buffer],
    attrs: Mapping[str, Any],
    stream: int = 0,
    device_ordinal: int = 0,
    op_name: str = "<handler>",
    platform: str = "cpu",
    allocator: DeviceAllocator | None = None,
) -> None:
    """Call a typed XLA FFI handler on the calling thread, as XLA would at stage EXECUTE.

    A handler given to :func:`declare_stages` gets its state (its other stages run first
    when these attributes have no state yet).

    Returns once the handler returns; on CUDA, when it has queued its work on ``stream``.
    Like XLA at registration, the first call with a handler asks it for its metadata (an
    empty call frame with the metadata extension) and refuses a handler built against a
    newer XLA FFI API than the runtime, so ``handler`` must be a typed FFI handler
    (``XLA_FFI_DEFINE_HANDLER_SYMBOL``) or answer metadata requests as one does.

    Args:
        handler: the handler's address (``ctypes.cast(lib.Symbol, ctypes.c_void_p).value``)
            or the ctypes function itself.
        args: argument buffers, in binding order.
        rets: result buffers the handler writes, in binding order.
        attrs: attribute values as :meth:`xla_kernels.Attr.coerce` returns them: NumPy
            scalars, ``str`` or 1-D NumPy arrays; any order (sorted by name for the handler).
        stream: ``cudaStream_t`` as an int (``platform="cuda"``; 0 is the default stream).
        device_ordinal: what ``ffi::DeviceOrdinal`` gives the handler.
        op_name: names the op in error messages.
        platform: ``"cpu"`` or ``"cuda"``.
        allocator: scratch memory for ``platform="cuda"``; see :class:`DeviceAllocator`.

    Raises:
        KernelError: the handler returned an error; the message is
            ``"{op_name}: kernel failed: {handler message}"``.
        OpTypeError, OpInputError: a buffer, attribute or option is malformed.
        RegistrationError: the handler was built against incompatible FFI headers.

    Example:
        >>> x = np.arange(6, dtype=np.float32).reshape(2, 3)
        >>> out = np.empty_like(x)
        >>> call_handler(fn, args=[Buffer.from_array(x)], rets=[Buffer.from_array(out)],
        ...              attrs={"scale": np.float32(2)}, op_name="scale")  # doctest: +SKIP
    """
    address, device = _resolve(handler, op_name, platform, stream, device_ordinal, allocator)
    state = 0
    if _stateful and address in _stateful:
        state = _state_for(address, args, rets, attrs, device, op_name)
    _call_stage(address, args, rets, attrs, device, op_name, _EXECUTE, state)


def _resolve(handler: int | Any, op_name: str, platform: str, stream: int,
             device_ordinal: int, allocator: DeviceAllocator | None) -> tuple[int, _Device]:
    """The handler's address (verified against the runtime's FFI API once) and the device
    the call runs on; OpInputError for an unknown platform or a CPU call with a stream."""
    if _lib is None:
        _load()
    address = handler if type(handler) is int and handler > 0 else _address(handler, op_name)
    if address not in _verified:
        _verify(address, op_name)
    kind = _PLATFORMS.get(platform)
    if kind is None:
        raise OpInputError(op_name, "platform", f"unknown platform {platform!r}",
                           "use 'cpu' or 'cuda'")
    if kind == 0 and stream:
        raise OpInputError(op_name, "stream", "a CPU call takes no stream", "pass stream=0")
    return address, _Device(platform, kind, device_ordinal, stream, allocator)


def _call_stage(address: int, args: Sequence[Buffer], rets: Sequence[Buffer],
                attrs: Mapping[str, Any], device: _Device, op_name: str, stage: int,
                state: int) -> None:
    """Pack the call and run ``stage`` of the handler at ``address`` with ``state``."""
    packed = _pack(address, args, rets, attrs, device, op_name)
    _run(packed, stage, state, device.allocator, op_name, attrs)


def _buffer_codes(buffers: Sequence[Buffer], nargs: int, op_name: str) -> tuple[list[int], int]:
    """Each buffer's XLA_FFI_DataType, and the number of dimensions of them all."""
    codes = []
    ndims = 0
    for i, b in enumerate(buffers):
        code = _BUFFER_CODES.get(b.dtype) if type(b) is Buffer else None
        codes.append(code or _buffer_code(
            b, op_name, f"args[{i}]" if i < nargs else f"rets[{i - nargs}]"))
        ndims += len(b.shape)
    return codes, ndims


def _pool(names: Sequence[tuple[bytes, int]], encoded: Sequence[EagerAttr]) -> bytes:
    """The pool: each name, then each payload, 8-byte aligned."""
    pool_parts: list[bytes] = []
    for (padded, _), e in zip(names, encoded, strict=True):
        pool_parts.append(padded)
        if e.payload:
            pool_parts += (e.payload, bytes(-len(e.payload) % 8))
    return b"".join(pool_parts)


def _block(size: int) -> tuple[ctypes.Array[ctypes.c_char], memoryview, bool]:
    """A call block of at least ``size`` bytes: this thread's scratch block unless a call is
    already using it (a stage run from within a call), and whether it is such a nested one."""
    scratch = _scratch
    nested = scratch.busy
    block, view = scratch.block, scratch.view
    if nested or block is None or view is None or len(block) < size:
        block = ctypes.create_string_buffer(max(size, 4096))
        view = memoryview(block).cast("B")
        if not nested:
            scratch.block, scratch.view = block, view
    return block, view, nested


def _pack(address: int, args: Sequence[Buffer], rets: Sequence[Buffer],
          attrs: Mapping[str, Any], device: _Device, op_name: str) -> _Packed:
    """Lay the call out in one block as the C structs of eager_ffi.h (see above)."""
    nargs = len(args)
    buffers = (*args, *rets)
    codes, ndims = _buffer_codes(buffers, nargs, op_name)
    names = [_name(k, op_name) for k in attrs]
    encoded = [_encode_attr(k, v, op_name) for k, v in attrs.items()]
    layout = _layout(len(buffers), ndims, tuple(e.inline_format for e in encoded))
    pool = _pool(names, encoded)
    pool_off = layout.size
    err_off = pool_off + len(pool)
    block, view, nested = _block(err_off + _ERR_LEN)
    base = ctypes.addressof(block)

    device_at = base + _CALL_SIZE
    buffers_at = device_at + _DEVICE_SIZE
    attrs_at = buffers_at + _BUFFER_SIZE * len(buffers)
    dims_at = attrs_at + _ATTR_SIZE * len(encoded)
    allocator = device.allocator
    values: list[Any] = [
        address, device_at, buffers_at, nargs, buffers_at + _BUFFER_SIZE * nargs, len(rets),
        attrs_at, len(encoded), base + err_off, _ERR_LEN,
        device.kind, device.ordinal, device.stream,
        allocator.alloc_address if allocator else 0, allocator.free_address if allocator else 0,
        0,
    ]
    dims: list[int] = []
    for b, code in zip(buffers, codes, strict=True):
        rank = len(b.shape)
        if not b.ptr and 0 not in b.shape:
            raise OpInputError(op_name, "args/rets", f"a buffer of shape {b.shape} has a null "
                                                     "address")
        values += (b.ptr, dims_at if rank else 0, rank, code, 0)
        dims += b.shape
        dims_at += 8 * rank
    at = base + pool_off
    for (padded, name_len), e in zip(names, encoded, strict=True):
        name_at = at
        at += len(padded)
        values += (name_at, name_len, e.kind, e.dtype, at if e.payload else 0, e.count,
                   e.inline)
        at += len(e.payload) + (-len(e.payload) % 8)
    if dims and min(dims) < 0:
        raise OpInputError(op_name, "args/rets", f"negative dimension in shapes "
                                                 f"{[b.shape for b in buffers]}")
    try:
        layout.pack_into(block, 0, *values, *dims)
    except (struct.error, TypeError, OverflowError) as e:
        raise OpTypeError(op_name, "args/rets", f"malformed buffer or option: {e}",
                          "ptr, shape entries, stream and device_ordinal must be ints") from None
    if pool:
        view[pool_off:err_off] = pool
    return _Packed(block, base, err_off, encoded, len(buffers), nested)


def _run(packed: _Packed, stage: int, state: int, allocator: DeviceAllocator | None,
         op_name: str, attrs: Mapping[str, Any]) -> None:
    """Run a packed call; a KernelError with the handler's message if it fails."""
    lib = _lib or _load()
    if allocator is not None:
        allocator._take_error()  # forget what an earlier call left behind
    _scratch.busy = True
    try:
        rc = (lib.xk_eager_call_stage(packed.base, stage, state) if state or stage != _EXECUTE
              else lib.xk_eager_call_packed(packed.base))
    finally:
        _scratch.busy = packed.nested
    if rc:
        message = ctypes.string_at(packed.base + packed.err_off).decode("utf-8", "replace")
        cause = allocator._take_error() if allocator is not None else None
        raise kernel_error(op_name, message, rc, attrs=attrs, encoded=packed.encoded,
                           first_attr=packed.nbuffers) from cause


# ------------------------------------------------------------------------ stages and state

_EXECUTE = 3
_SETUP_STAGES = (("instantiate", 0), ("prepare", 1), ("initialize", 2))


class _Stages:
    """The other stages of one execute handler and the states made for it, by key."""

    def __init__(self, addresses: Mapping[str, int],
                 setup: Callable[[], Sequence[tuple[int, int]]] | None):
        self.addresses = dict(addresses)
        self.setup = setup
        self.ready = False
        self.states: dict[Any, int] = {}


_stateful: dict[int, _Stages] = {}  # execute handler address -> its stages
_states_lock = threading.RLock()


def declare_stages(execute: int, stages: Mapping[str, int], *,
                   setup: Callable[[], Sequence[tuple[int, int]]] | None = None) -> None:
    """Make eager calls of the handler at ``execute`` run its other stages first.

    ``stages`` maps stage names (``"instantiate"``, ``"prepare"``, ``"initialize"``) to
    handler addresses. ``setup()`` runs once before the first state is made and returns
    ``(type id, XLA_FFI_TypeInfo address)`` of the state types (registered with XLA, which
    assigns the ids): their deleters free the states. A state is made per platform,
    device ordinal and attribute values, as XLA makes one per compiled custom call. The
    loader (:func:`xla_kernels.runtime.library.load_kernel`) declares every kernel that
    names more stages than execute.

    Example:
        >>> declare_stages(execute_address, {"instantiate": init_address})  # doctest: +SKIP
    """
    with _states_lock:
        drop_states(execute)
        _stateful[execute] = _Stages({k: v for k, v in stages.items() if k != "execute"},
                                     setup)


def drop_states(execute: int) -> int:
    """Delete the states made for the handler at ``execute``; returns how many there were.

    Example:
        >>> drop_states(execute_address)                          # doctest: +SKIP
        1
    """
    with _states_lock:
        stages = _stateful.get(execute)
        if stages is None or not stages.states:
            return 0
        states, stages.states = stages.states, {}
    lib = _lib or _load()
    for state in states.values():
        lib.xk_eager_state_destroy(state)
    return len(states)


def state_count(execute: int) -> int:
    """How many states the eager runtime keeps for the handler at ``execute``.

    Example:
        >>> state_count(kernel_of(op, "cpu").address)          # doctest: +SKIP
        1
    """
    with _states_lock:
        stages = _stateful.get(execute)
        return 0 if stages is None else len(stages.states)


def _state_key(attrs: Mapping[str, Any], op: str) -> tuple[Any, ...]:
    """The attributes as bytes (so that NaN equals NaN), sorted by name."""
    key = []
    for name, value in sorted(attrs.items()):
        e = _encode_attr(name, value, op)
        key.append((name, e.kind, e.dtype, struct.pack("@" + e.inline_format, e.inline),
                    e.payload, e.count))
    return tuple(key)


def _state_for(execute: int, args: Sequence[Buffer], rets: Sequence[Buffer],
               attrs: Mapping[str, Any], device: _Device, op_name: str) -> int:
    """The state of this call's handler and attributes, made by its stages if new."""
    stages = _stateful[execute]
    key = (device.platform, device.ordinal, _state_key(attrs, op_name))
    state = stages.states.get(key)
    if state:
        return state
    lib = _lib or _load()
    with _states_lock:
        state = stages.states.get(key)
        if state:
            return state
        if not stages.ready:
            for type_id, info in (stages.setup() if stages.setup else ()):
                lib.xk_eager_register_type(type_id, info or None)
            stages.ready = True
        state = lib.xk_eager_state_create()
        if not state:
            raise MemoryError(f"{op_name}: cannot allocate the eager handler state")
        try:
            for name, code in _SETUP_STAGES:
                handler = stages.addresses.get(name)
                if handler is None:
                    continue
                buffers = ((), ()) if name == "instantiate" else (args, rets)
                try:
                    address, _ = _resolve(handler, op_name, device.platform, device.stream,
                                          device.ordinal, device.allocator)
                    _call_stage(address, *buffers, attrs, device, op_name, code, state)
                except KernelError as e:
                    raise KernelError(op_name, f"{name} stage: {e.handler_message}",
                                      e.code) from e.__cause__
        except BaseException:
            lib.xk_eager_state_destroy(state)
            raise
        stages.states[key] = state
        return state


@atexit.register
def _drop_all_states() -> None:
    for execute in list(_stateful):
        drop_states(execute)
