"""Every CUDA kernel the package ships compiles with nvcc for Hopper (CI has nvcc, no GPU),
and declares itself safe for XLA's CUDA graphs (command buffers)."""

from __future__ import annotations

import ctypes

import pytest

from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.cli import shipped_ops
from xla_kernels.runtime.eager import handler_metadata

SHIPPED = {name: op for name, op in shipped_ops().items()
           if name.startswith("xla_kernels.") and "cuda" in op.kernels}


def test_the_shipped_ops_are_found():
    assert {"xla_kernels.simple_add", "xla_kernels.paged_attention"} <= set(SHIPPED)


@requires_nvcc
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_cuda_kernel_compiles_for_sm90_and_is_graph_safe(name, tmp_path):
    op = SHIPPED[name]
    kernel = op.kernels["cuda"]
    path = builder.build_library(op.name, kernel.resolved_sources(), platform="cuda",
                               cuda_archs=["90"], cache_dir=tmp_path,
                               arch_specific=kernel.arch_specific)
    handler = getattr(ctypes.CDLL(str(path)), kernel.handler)
    assert handler_metadata(handler, op_name=op.name).command_buffer_compatible
