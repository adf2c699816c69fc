"""Native (C++) eager kernels for torch operators: dispatch at the cost of a torch op.

The Python eager kernels of :mod:`xla_kernels.frontends.torch.eager` spend most of a small
call in Python (argument parsing, the plan cache, packing the call). This module builds
``native.cc`` against the installed torch (together with the eager FFI runtime,
``runtime/eager_ffi.cc``) and registers, per operator and dispatch key, a boxed C++
kernel that does the whole call without Python once a call shape has been seen:

* first call of a shape (input sizes, dtypes, device, attribute values), and every call
  whose tensors are not all on one device: the kernel takes the GIL and asks a Python
  *planner* for a :class:`NativePlan` (the library's validation runs there, so errors are
  the library's own exceptions, unchanged; such a call is never cached);
* every later call: a C++ cache lookup, ``at::empty`` for the outputs, the handler on
  torch's current stream (CUDA) with scratch from torch's caching allocator.

When torch's headers are missing, the build fails, or ``XLA_KERNELS_TORCH_NATIVE=0``,
:func:`install` returns False and :func:`native_status` says why: callers keep their
Python kernels.

Example:
    >>> import torch
    >>> from xla_kernels.frontends.torch import native as torch_native
    >>> def planner(tensors, kwargs):                             # doctest: +SKIP
    ...     x = tensors[0]
    ...     return NativePlan.create(handler=address, outputs=[(x.dtype, tuple(x.shape))],
    ...                              visible=[0], attrs={}, op_name="my_lib.copy")
    >>> torch_native.install("my_lib::copy", "cpu", planner)      # doctest: +SKIP
    True
    >>> torch_native.native_status()                              # doctest: +SKIP
    'active: /tmp/xk-cache/xk_torch_native-cpu-....so'
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from xla_kernels import dtypes, env
from xla_kernels.diagnostics import explain_kernel_error
from xla_kernels.runtime import eager
from xla_kernels.runtime.eager import KernelError

__all__ = ["NativePlan", "available", "clear_plans", "install", "install_autograd",
           "install_version_bump", "native_status"]

_SOURCE = Path(__file__).with_name("native.cc")
_EAGER_SOURCE = Path(eager.__file__).with_name("eager_ffi.cc")
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}
_ERR_LEN = 2048

#: One encoded attribute: (UTF-8 name, XLA_FFI_AttrType, XLA_FFI_DataType, 8 inline
#: value bytes, payload bytes, element count or byte length), as ``XkAttr`` holds it.
EncodedAttr = tuple[bytes, int, int, bytes, bytes, int]


def encode_attrs(attrs: Mapping[str, Any], op_name: str) -> tuple[EncodedAttr, ...]:
    """Attributes (coerced values, or a call plan's ``eager_attrs()``) encoded for the FFI
    call frame, with :mod:`xla_kernels.runtime.eager`'s own encoding (the codecs').

    Example:
        >>> import numpy as np
        >>> encode_attrs({"n": np.int32(3)}, "docs.op")
        ((b'n', 3, 4, b'\\x03\\x00\\x00\\x00\\x00\\x00\\x00\\x00', b'', 0),)
    """
    out = []
    for name, value in attrs.items():
        e = eager._encode_attr(name, value, op_name)
        out.append((name.encode(), e.kind, e.dtype, struct.pack("<" + e.inline_format, e.inline),
                    e.payload, e.count))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class NativePlan:
    """What the native kernel needs to run one call shape without Python.

    Attributes:
        handler: address of the typed XLA FFI handler.
        outputs: ``(torch.dtype, shape)`` of every output the handler writes, in order
            (workspace outputs included).
        visible: indices into ``outputs`` of those the operator returns.
        attrs: the attributes, encoded (see :func:`encode_attrs`).
        op_name: names the op in error messages (``"<op_name>: kernel failed: ..."``).
        poison: fill outputs with NaN (floats) or all-ones bits before the call.

    Example:
        >>> import torch
        >>> plan = NativePlan.create(handler=1, outputs=[(torch.float32, (3,))],
        ...                          visible=[0], attrs={}, op_name="docs.op")
        >>> plan.outputs
        ((torch.float32, (3,)),)
    """

    handler: int
    outputs: tuple[tuple[torch.dtype, tuple[int, ...]], ...]
    visible: tuple[int, ...]
    attrs: tuple[EncodedAttr, ...]
    op_name: str
    poison: bool = False

    @classmethod
    def create(cls, *, handler: int, outputs: Iterable[tuple[torch.dtype, Iterable[int]]],
               visible: Iterable[int], attrs: Mapping[str, Any], op_name: str,
               poison: bool = False) -> NativePlan:
        """A plan from coerced attribute values (encoded here)."""
        return cls(int(handler), tuple((dt, tuple(int(d) for d in shape)) for dt, shape in outputs),
                   tuple(int(i) for i in visible), encode_attrs(attrs, op_name), op_name,
                   bool(poison))


_FFI_CODES: dict[torch.dtype, int] = {}


def _ffi_code(dtype: torch.dtype) -> int:
    code = _FFI_CODES.get(dtype)
    if code is None:
        code = _FFI_CODES[dtype] = dtypes.ffi_code(dtype)
    return code


def _flatten(plan: NativePlan, tensors: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    """The plan as the C++ side parses it (plain tuples, ints and bytes)."""
    if plan.handler not in eager._verified:  # refuse handlers of newer FFI headers, once
        eager._verify(plan.handler, plan.op_name)
    outputs = tuple((dt, _ffi_code(dt), shape, dt.is_floating_point or dt.is_complex)
                    for dt, shape in plan.outputs)
    inputs = tuple(_ffi_code(t.dtype) for t in tensors)
    return plan.handler, inputs, outputs, plan.visible, plan.attrs, plan.op_name, plan.poison


def _make_kernel_error(op: bytes | str, message: bytes | str, code: int) -> KernelError:
    """The exception of a failed handler, explained as the Python path explains it (an
    attribute the handler cannot decode: :func:`~xla_kernels.diagnostics.explain_kernel_error`)."""
    if isinstance(op, bytes):
        op = op.decode("utf-8", "replace")
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    return explain_kernel_error(KernelError(op, message, code))


# ------------------------------------------------------------------------ the library

_lock = threading.Lock()
_lib: ctypes.PyDLL | None = None
_status = "not loaded yet"
_tried = False
_keep: list[Any] = []  # planners and the error factory, alive as long as the kernels


def _enabled() -> bool:
    value = (env.get("XLA_KERNELS_TORCH_NATIVE") or "").strip().lower()
    return value not in ("0", "false", "no", "off")


def _torch_build_options() -> tuple[list[Path], dict[str, str], list[str]]:
    """Include dirs, defines and link flags that compile and link against this torch."""
    try:
        from torch.utils.cpp_extension import include_paths
        includes = [Path(p) for p in include_paths()]
    except Exception:  # an odd install without cpp_extension: headers may still be there
        root = Path(torch.__file__).parent / "include"
        includes = [root, root / "torch" / "csrc" / "api" / "include"]
    lib_dir = Path(torch.__file__).parent / "lib"
    python_include = Path(sysconfig.get_paths()["include"])
    defines = {
        "_GLIBCXX_USE_CXX11_ABI": str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
        # Headers change with torch while their paths may not: key the build on the version.
        "XK_TORCH_VERSION": '"' + torch.__version__ + '"',
    }
    # torch's own extension builder compiles with C++20 (its headers use C++20 features);
    # this flag comes after the builder's -std=c++17, so it wins.
    flags = ["-std=c++20", "-w", f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}",
             # The libraries come before the sources on the command line: keep them needed.
             "-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python"]
    return [*includes, python_include], defines, flags


def _check_headers(includes: list[Path]) -> None:
    """FileNotFoundError naming torch's or Python's missing headers (needed to build only)."""
    if not (includes[0] / "torch" / "library.h").is_file():
        raise FileNotFoundError(f"torch headers not found (no {includes[0]}/torch/library.h)")
    if not (includes[-1] / "Python.h").is_file():
        raise FileNotFoundError(f"Python headers not found (no {includes[-1]}/Python.h)")


def torch_abi() -> dict[str, str]:
    """What a prebuilt native library must have been built against to load here: this
    torch build (its version, local tag included), the Python ABI and the C++ ABI flag.

    Example:
        >>> sorted(torch_abi())
        ['cxx11abi', 'python', 'torch']
    """
    return {"torch": torch.__version__,
            "python": f"cp{sys.version_info.major}{sys.version_info.minor}",
            "cxx11abi": str(int(torch._C._GLIBCXX_USE_CXX11_ABI))}


def library_spec() -> Any:
    """The :class:`~xla_kernels.builder.BuildSpec` of the native library (``native.cc`` with
    the eager FFI runtime), built against this torch: a prebuilt one is used when its
    :func:`torch_abi` tags are this process's.

    Example:
        >>> library_spec().name                                      # doctest: +SKIP
        'xk_torch_native'
    """
    from xla_kernels.builder import BuildSpec

    includes, defines, flags = _torch_build_options()
    return BuildSpec.create("xk_torch_native", [_SOURCE, _EAGER_SOURCE], platform="cpu",
                            include_dirs=includes, defines=defines, extra_flags=flags,
                            abi=torch_abi())


def _load() -> ctypes.PyDLL | None:
    """Build and load the native library once; None (and a status) when it cannot be."""
    global _lib, _status, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        try:
            spec = library_spec()
            if spec.prebuilt().path is None:
                _check_headers(list(spec.include_dirs))
            path = spec.load_path()
            lib = ctypes.PyDLL(str(path))
            lib.xk_native_init.argtypes = [ctypes.py_object]
            lib.xk_native_init.restype = ctypes.c_int32
            lib.xk_native_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                              ctypes.py_object, ctypes.c_char_p,
                                              ctypes.c_int64]
            lib.xk_native_install.restype = ctypes.c_int32
            lib.xk_native_install_autograd.argtypes = [ctypes.c_char_p, ctypes.py_object,
                                                       ctypes.c_char_p, ctypes.c_int64]
            lib.xk_native_install_autograd.restype = ctypes.c_int32
            lib.xk_native_install_version_bump.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                                           ctypes.c_int64]
            lib.xk_native_install_version_bump.restype = ctypes.c_int32
            lib.xk_native_clear.argtypes = [ctypes.c_char_p]
            lib.xk_native_clear.restype = ctypes.c_int32
            _keep.append(_make_kernel_error)
            lib.xk_native_init(_make_kernel_error)
            _lib, _status = lib, f"active: {path}"
        except Exception as e:  # any failure keeps the Python kernels: say why
            # The head of the message (a BuildError's has the first compiler errors).
            head = " | ".join(str(e).strip().splitlines()[:6])
            _status = f"unavailable: {type(e).__name__}: {head}"
        _tried = True
        return _lib


def available() -> bool:
    """Whether native kernels can be installed here (builds the library on first use).

    False when ``XLA_KERNELS_TORCH_NATIVE=0`` or the library cannot be built or loaded;
    :func:`native_status` says which.

    Example:
        >>> available()                                             # doctest: +SKIP
        True
    """
    return _enabled() and _load() is not None


def native_status() -> str:
    """Why the native path is, or is not, in use: ``"active: <library>"``,
    ``"disabled: XLA_KERNELS_TORCH_NATIVE=0"`` or ``"unavailable: <reason>"``.

    Example:
        >>> native_status().split(":")[0] in ("active", "disabled", "unavailable")
        True
    """
    if not _enabled():
        return f"disabled: XLA_KERNELS_TORCH_NATIVE={env.get('XLA_KERNELS_TORCH_NATIVE')}"
    _load()
    return _status


Planner = Callable[[tuple[torch.Tensor, ...], dict[str, Any]], NativePlan]


def install(qualname: str, platform: str, planner: Planner) -> bool:
    """Register the native kernel of ``qualname`` for ``platform`` (``"cpu"``/``"cuda"``).

    ``planner(tensors, kwargs)`` gets the call's (contiguous) tensors and its keyword
    arguments as torch passes them (``None`` for optional attributes not given), and
    returns a :class:`NativePlan` or raises the library's error; it runs once per call
    shape, with the GIL. Returns False, with the reason in :func:`native_status`, when
    the native path is unavailable (the caller then registers its Python kernel).

    Example:
        >>> install("xla_kernels::simple_add", "cpu", planner)        # doctest: +SKIP
        True
    """
    global _status
    key = _DISPATCH_KEYS.get(platform)
    if key is None:
        raise ValueError(f"platform must be 'cpu' or 'cuda', got {platform!r}")
    if not available():
        return False

    def c_planner(tensors: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        return _flatten(planner(tensors, kwargs), tensors)

    err = ctypes.create_string_buffer(_ERR_LEN)
    with _lock:
        assert _lib is not None
        if _lib.xk_native_install(qualname.encode(), key.encode(), c_planner, err, _ERR_LEN):
            _status = (f"unavailable: registering {qualname} for {key} failed: "
                       f"{err.value.decode('utf-8', 'replace')}")
            return False
        _keep.append(c_planner)
    return True


def install_autograd(qualname: str, differentiable: Callable[..., Any]) -> bool:
    """Register the Autograd kernel of ``qualname``: a C++ gate that runs the backend
    kernel directly when no input needs a gradient, and otherwise calls
    ``differentiable(*tensors, **attrs)`` (which records the op for backward). Returns
    False, with the reason in :func:`native_status`, when the native path is unavailable.

    Example:
        >>> install_autograd("xla_kernels::simple_add", differentiable)  # doctest: +SKIP
        True
    """
    if not _install("autograd gate", qualname, lambda lib, err: lib.xk_native_install_autograd(
            qualname.encode(), differentiable, err, _ERR_LEN)):
        return False
    _keep.append(differentiable)  # the C++ gate calls it: it must stay alive
    return True


def install_version_bump(qualname: str) -> bool:
    """Register the ADInplaceOrView kernel of ``qualname``, an operator that updates
    inputs in place: it bumps their version counters before the backend kernel runs, so
    that autograd refuses a backward that needs their old values. Returns False, with
    the reason in :func:`native_status`, when the native path is unavailable.

    Example:
        >>> install_version_bump("xla_kernels::reshape_and_cache")       # doctest: +SKIP
        True
    """
    return _install("version bump", qualname, lambda lib, err: lib.xk_native_install_version_bump(
        qualname.encode(), err, _ERR_LEN))


def _install(what: str, qualname: str, register: Callable[[Any, Any], int]) -> bool:
    """Run ``register(lib, err)``, one of the native library's ``xk_native_install_*``
    calls; on failure record why in :func:`native_status` and return False."""
    global _status
    if not available():
        return False
    err = ctypes.create_string_buffer(_ERR_LEN)
    with _lock:
        assert _lib is not None
        if register(_lib, err):
            _status = (f"unavailable: registering the {what} of {qualname} failed: "
                       f"{err.value.decode('utf-8', 'replace')}")
            return False
    return True


def clear_plans(qualname: str | None = None) -> None:
    """Forget the cached plans of ``qualname`` (every operator when None), e.g. after
    the op behind an operator changed.

    Example:
        >>> clear_plans("xla_kernels::simple_add")
    """
    if _lib is not None:
        _lib.xk_native_clear(qualname.encode() if qualname is not None else None)
