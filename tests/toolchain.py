"""What the test machine's toolchain can do (CI has nvcc and no GPU)."""

from __future__ import annotations

import pytest

from xla_kernels import builder
from xla_kernels.errors import CompilerNotFoundError


def nvcc_available() -> bool:
    """Whether nvcc can be found the way xla-kernels looks for it."""
    try:
        builder.find_nvcc()
        return True
    except CompilerNotFoundError:
        return False


requires_nvcc = pytest.mark.skipif(not nvcc_available(), reason="nvcc not installed")
