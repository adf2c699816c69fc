"""Every CUDA source the package ships compiles with nvcc for Hopper (CI has nvcc, no GPU)."""

from __future__ import annotations

import pytest

from xla_kernels import build
from xla_kernels.kernels.simple_add import simple_add


def _nvcc_available() -> bool:
    try:
        build.find_nvcc()
        return True
    except Exception:
        return False


SHIPPED = {"simple_add": simple_add}


@pytest.mark.skipif(not _nvcc_available(), reason="nvcc not installed")
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_cuda_kernel_compiles_for_sm90(name, tmp_path):
    op = SHIPPED[name]
    kernel = op.kernels["cuda"]
    path = build.build_library(op.name, kernel.resolved_sources(), platform="cuda",
                               cuda_archs=["90"], cache_dir=tmp_path)
    assert path.stat().st_size > 0
