"""Every environment variable xla_kernels reads, in one place.

The library reads the environment only here (:func:`get`, :func:`is_set`, :func:`build_env`);
the CUDA kernels read the one variable marked ``reader="cuda kernel"``. A variable is read
where its value is used, so a test or a program may change it between calls; the only one
read once per process is ``XLA_KERNELS_POISON_OUTPUTS`` (at import of the torch eager
frontend). Variables the library only *sets* for other programs (vLLM's, JAX's platform
list in :mod:`xla_kernels.vllm.check`) are not listed.

Example:
    >>> from xla_kernels import env
    >>> env.VARIABLES["XLA_KERNELS_CACHE_DIR"].doc.split(";")[0]
    'where built kernel libraries are kept'
    >>> env.get("XLA_KERNELS_CUDA_ARCHS", {"XLA_KERNELS_CUDA_ARCHS": "90a"})
    '90a'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, what an unset variable means, what it does and
    who reads it (``library``: Python code through this module; ``compiler``: nvcc or the
    C++ compiler, recorded in the kernel cache's key; ``cuda kernel``: the CUDA sources)."""

    name: str
    default: str | None
    doc: str
    reader: str = "library"


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    # Building kernels.
    Variable("XLA_KERNELS_CACHE_DIR", None,
             "where built kernel libraries are kept; default $XDG_CACHE_HOME/xla_kernels, "
             "else ~/.cache/xla_kernels"),
    Variable("XDG_CACHE_HOME", None, "the user's cache folder (see XLA_KERNELS_CACHE_DIR)"),
    Variable("XLA_KERNELS_NVCC", None, "the nvcc to build CUDA kernels with (default: nvcc "
             "from PATH, CUDA_HOME or CUDA_PATH, or the pip nvidia-cuda-nvcc package)"),
    Variable("CUDA_HOME", None, "a CUDA toolkit: its nvcc and headers"),
    Variable("CUDA_PATH", None, "a CUDA toolkit, where CUDA_HOME is not set"),
    Variable("CXX", None, "the C++ compiler for CPU kernels and host code (default: c++/g++)"),
    Variable("XLA_KERNELS_CUDA_ARCHS", None,
             "comma-separated GPU architectures to build for, e.g. \"90a,80\" (default: the "
             "visible GPUs', else a built-in list)"),
    Variable("XLA_KERNELS_BUILD", "auto",
             "auto: a prebuilt library shipped in the package, else the cache, else build; "
             "always: never a prebuilt library; never: no compiling (a needed build is an "
             "error); read at every library load (docs/prebuilt.md)"),
    Variable("XLA_KERNELS_FFI_INCLUDE_DIR", None,
             "the XLA FFI headers builds compile against (default: the installed jaxlib's, "
             "jax.ffi.include_dir()), e.g. an older jaxlib's for libraries that serve newer "
             "ones"),
    Variable("XLA_KERNELS_CUTLASS_DIR", None,
             "a folder with CUTLASS's headers (include/cute, include/cutlass) for the kernels "
             "that build on them (linear's Hopper path); default: the nvidia-cutlass "
             "package's, else built without (xla_kernels.builder.cutlass)"),
    Variable("XLA_KERNELS_QUIET", None,
             "set (not 0/false/no): no 'building ...' messages on stderr"),
    Variable("CPATH", None, "include folders for the compilers", reader="compiler"),
    Variable("CPLUS_INCLUDE_PATH", None, "C++ include folders for the compilers",
             reader="compiler"),
    Variable("NVCC_PREPEND_FLAGS", None, "flags nvcc puts before its own", reader="compiler"),
    Variable("NVCC_APPEND_FLAGS", None, "flags nvcc adds after its own", reader="compiler"),
    Variable("NVCC_CCBIN", None, "the host compiler nvcc uses", reader="compiler"),
    # Running kernels.
    Variable("XLA_KERNELS_RAGGED_WGMMA", None,
             "ragged_paged_attention's Hopper prefill kernel: 0 never takes it (the mma.sync "
             "kernel runs, as on pre-Hopper cards); require makes a call it should serve fail "
             "where it cannot run; read at every launch", reader="cuda kernel"),
    Variable("XLA_KERNELS_TORCH_NATIVE", "1",
             "0: torch eager calls go through the Python kernels instead of the native "
             "(C++) dispatcher path"),
    Variable("XLA_KERNELS_POISON_OUTPUTS", None,
             "set (not 0): torch eager outputs are filled with NaN (all-ones bits for ints) "
             "before the kernel runs, so an element a kernel leaves unwritten shows; read "
             "at import"),
    Variable("PJRT_DEVICE", None, "torch_xla's device kind (CPU, CUDA, TPU); read to pick the "
             "platform of the torch_xla registration"),
    # The vLLM integration.
    Variable("XLA_KERNELS_VLLM", None,
             "1 or 0: vLLM runs on the xla-kernels platform or not; otherwise it does "
             "unless the host has TPUs (JAX_PLATFORMS naming tpu, or TPU device files)"),
    Variable("JAX_PLATFORMS", None, "JAX's platforms (read by the vLLM platform plugin)"),
    Variable("XLA_KERNELS_VLLM_DEVICE_MEMORY_GB", "4",
             "GB of device memory the vLLM integration reports to vLLM"),
)}


def _declared(name: str) -> Variable:
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"xla_kernels.env: {name} is not declared; add it to "
                       f"xla_kernels.env.VARIABLES with what it does") from None


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of declared variable ``name`` (from ``environ``, default ``os.environ``),
    or its default when unset.

    Example:
        >>> get("XLA_KERNELS_TORCH_NATIVE", {})
        '1'
        >>> get("NOT_DECLARED", {})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        KeyError: 'xla_kernels.env: NOT_DECLARED is not declared; add it to ...'
    """
    var = _declared(name)
    return (os.environ if environ is None else environ).get(name, var.default)


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether declared variable ``name`` is set to something other than empty, 0, false or
    no (case-insensitive).

    Example:
        >>> is_set("XLA_KERNELS_QUIET", {"XLA_KERNELS_QUIET": "False"})
        False
        >>> is_set("XLA_KERNELS_QUIET", {"XLA_KERNELS_QUIET": "1"})
        True
    """
    value = get(name, environ)
    return (value or "").strip().lower() not in ("", "0", "false", "no")


def build_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """``NAME=value`` of every set variable that the compilers read: part of a kernel
    build's cache key.

    Example:
        >>> build_env({"NVCC_APPEND_FLAGS": "-lineinfo", "HOME": "/root"})
        ['NVCC_APPEND_FLAGS=-lineinfo']
    """
    environ = os.environ if environ is None else environ
    return [f"{v.name}={environ[v.name]}" for v in VARIABLES.values()
            if v.reader == "compiler" and v.name in environ]
