"""Every CUDA kernel the package ships compiles with nvcc for Hopper (CI has nvcc, no GPU),
and declares itself safe for XLA's CUDA graphs (command buffers)."""

from __future__ import annotations

import ctypes

import pytest

from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.cli import shipped_ops
from xla_kernels.errors import BuildError
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


@requires_nvcc
@pytest.mark.parametrize("stages", [3, 1])
def test_fp8_decode_stage_switch_compiles_and_is_checked(stages, tmp_path, monkeypatch):
    """``-DXK_DECODE_FP8_STAGES`` (fp8 decode's pipeline depth: 2 by default, 3 the depth
    before 2026-11-26, kept for A/B runs) reaches the kernel: 3 builds, 1 is refused by the
    kernel's own static_assert."""
    op = SHIPPED["xla_kernels.paged_attention"]
    kernel = op.kernels["cuda"]
    monkeypatch.setenv("NVCC_APPEND_FLAGS", f"-DXK_DECODE_FP8_STAGES={stages}")
    build = lambda: builder.build_library(  # noqa: E731
        op.name, kernel.resolved_sources(), platform="cuda", cuda_archs=["90"],
        cache_dir=tmp_path, arch_specific=kernel.arch_specific)
    if stages >= 2:
        assert build().exists()
    else:
        with pytest.raises(BuildError, match="at least 2 stages"):
            build()


@requires_nvcc
@pytest.mark.parametrize("ahead", [1, 0])
def test_decode_block_id_lookahead_switch_compiles_and_is_checked(ahead, tmp_path, monkeypatch):
    """``-DXK_DECODE_BT_AHEAD`` (block ids loaded that many tiles ahead; 1 is the loop before
    2026-11-26, kept for A/B runs) reaches the kernel: 1 builds, 0 is refused by its
    static_assert."""
    op = SHIPPED["xla_kernels.paged_attention"]
    kernel = op.kernels["cuda"]
    monkeypatch.setenv("NVCC_APPEND_FLAGS", f"-DXK_DECODE_BT_AHEAD={ahead}")
    build = lambda: builder.build_library(  # noqa: E731
        op.name, kernel.resolved_sources(), platform="cuda", cuda_archs=["90"],
        cache_dir=tmp_path, arch_specific=kernel.arch_specific)
    if ahead >= 1:
        assert build().exists()
    else:
        with pytest.raises(BuildError, match="at least one tile ahead"):
            build()


@requires_nvcc
@pytest.mark.parametrize("tokens", [32, 8])
def test_fp8_d256_tile_switch_compiles_and_is_checked(tokens, tmp_path, monkeypatch):
    """``-DXK_DECODE_FP8_D256_TOKENS`` (tokens per fp8 warp tile at head_dim 256; 32 is the
    tile before 2026-11-26) reaches the kernel: 32 builds, 8 is refused by its static_assert."""
    op = SHIPPED["xla_kernels.paged_attention"]
    kernel = op.kernels["cuda"]
    monkeypatch.setenv("NVCC_APPEND_FLAGS", f"-DXK_DECODE_FP8_D256_TOKENS={tokens}")
    build = lambda: builder.build_library(  # noqa: E731
        op.name, kernel.resolved_sources(), platform="cuda", cuda_archs=["90"],
        cache_dir=tmp_path, arch_specific=kernel.arch_specific)
    if tokens in (16, 32):
        assert build().exists()
    else:
        with pytest.raises(BuildError, match="16 or 32 tokens"):
            build()
