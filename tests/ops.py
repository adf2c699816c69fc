"""Ops declared for the test suite (shared by the JAX, eager and torch tests)."""

from __future__ import annotations

import numpy as np

import xla_kernels as xk

FIXTURES = "fixtures"

attrs_echo = xk.Op(
    "xk_tests.attrs_echo",
    inputs=[xk.Tensor("x", dtypes=("f32",), rank=1)],
    attrs=[xk.Attr("i", int), xk.Attr("i32", np.int32), xk.Attr("f", float),
           xk.Attr("d", np.float64), xk.Attr("b", bool), xk.Attr("s", str),
           xk.Attr("ints", list[int]), xk.Attr("floats", list[float]),
           xk.Attr("raw", bytes, default=b"")],
    outputs=lambda x, **_: xk.Spec((32,), "f64"),
    kernels={"cpu": xk.Kernel([f"{FIXTURES}/attrs_echo/attrs_echo.cc"], handler="AttrsEcho")},
)


def _same(a: xk.Spec, b: xk.Spec) -> xk.Spec:
    if a.shape != b.shape:
        raise xk.Invalid("b", f"shape {b.shape} differs from a's {a.shape}")
    return xk.like(a)


legacy_add = xk.Op(
    "xk_tests.legacy_add",
    inputs=[xk.Tensor("a", dtypes=("f32",)), xk.Tensor("b", dtypes=("f32",))],
    outputs=_same,
    kernels={
        "cpu": xk.Kernel.legacy([f"{FIXTURES}/legacy/legacy_add_cpu.cc"], function="LegacyAddCpu"),
        "cuda": xk.Kernel.legacy([f"{FIXTURES}/legacy/xla_gpu_sized_add.cu"],
                                 function="XlaGpuSizedAdd"),
    },
)

seeds_legacy_add = xk.Op(
    "xk_tests.seeds_legacy_add",
    inputs=[xk.Tensor("a", dtypes=("f32",), rank=1), xk.Tensor("b", dtypes=("f32",), rank=1)],
    outputs=_same,
    kernels={"cuda": xk.Kernel.legacy([f"{FIXTURES}/legacy/xla_gpu_simple_add.cu"],
                                      function="XlaGpuSimpleAdd")},
)


def size_opaque(n: int) -> bytes:
    """The opaque bytes the sized legacy kernels expect: the element count as int64."""
    return np.int64(n).tobytes()
