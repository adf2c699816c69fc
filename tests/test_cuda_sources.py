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


def build_for_sm90(name, cache_dir):
    """The shipped op's CUDA library, built for Hopper (sm_90a where the kernel asks)."""
    kernel = SHIPPED[name].kernels["cuda"]
    return builder.build_library(name, kernel.resolved_sources(), platform="cuda",
                                 cuda_archs=["90"], cache_dir=cache_dir,
                                 arch_specific=kernel.arch_specific)


def check_switch(name, flags, refusal, cache_dir, monkeypatch):
    """Compile-time switches given through ``NVCC_APPEND_FLAGS`` reach the op's kernel: a
    supported value builds, an unsupported one is refused by the kernel's static_assert."""
    monkeypatch.setenv("NVCC_APPEND_FLAGS", flags)
    if refusal is None:
        assert build_for_sm90(name, cache_dir).exists()
    else:
        with pytest.raises(BuildError, match=refusal):
            build_for_sm90(name, cache_dir)


@requires_nvcc
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_cuda_kernel_compiles_for_sm90_and_is_graph_safe(name, tmp_path):
    op = SHIPPED[name]
    kernel = op.kernels["cuda"]
    path = build_for_sm90(name, tmp_path)
    handler = getattr(ctypes.CDLL(str(path)), kernel.handler)
    assert handler_metadata(handler, op_name=op.name).command_buffer_compatible


# The decode kernels' compile-time switches, kept for A/B runs (benchmarks/decode_ab.py):
# (macro, value, the kernel's static_assert message when it refuses the value, else None).
#   XK_DECODE_FP8_STAGES: fp8 decode's pipeline depth (default 2; 3 was the depth before
#     2026-11-26);
#   XK_DECODE_BT_AHEAD: block ids loaded that many tiles ahead (default 2; 1 is the loop
#     before 2026-11-26);
#   XK_DECODE_FP8_D256_TOKENS: tokens per fp8 warp tile at head_dim 256 (default 16; 32 was
#     the tile before 2026-11-26);
#   XK_DECODE_FP8_TOKENS_ON_ROWS: fp8 caches at up to 8 q heads per kv head on Fp8MmaCoreT
#     (default 1; 0 runs Fp8MmaCore at every ratio, as the kernel did before 2026-11-26).
DECODE_SWITCHES = [
    ("XK_DECODE_FP8_STAGES", 3, None),
    ("XK_DECODE_FP8_STAGES", 1, "at least 2 stages"),
    ("XK_DECODE_BT_AHEAD", 1, None),
    ("XK_DECODE_BT_AHEAD", 0, "at least one tile ahead"),
    ("XK_DECODE_FP8_D256_TOKENS", 32, None),
    ("XK_DECODE_FP8_D256_TOKENS", 8, "16 or 32 tokens"),
    ("XK_DECODE_FP8_TOKENS_ON_ROWS", 0, None),
]


@requires_nvcc
@pytest.mark.parametrize("macro,value,refusal", DECODE_SWITCHES)
def test_decode_switch_compiles_and_is_checked(macro, value, refusal, tmp_path, monkeypatch):
    """A decode switch given through ``NVCC_APPEND_FLAGS`` reaches the kernel: a supported
    value builds, an unsupported one is refused by the kernel's own static_assert."""
    check_switch("xla_kernels.paged_attention", f"-D{macro}={value}", refusal, tmp_path,
                 monkeypatch)


# The ragged wgmma kernel's compile-time switches (ragged_paged_attention_sm90.cuh), kept
# for A/B runs (scripts/gpu_run.sh's ragged_ab step): (nvcc flags, refusal or None).
#   XK_RAGGED_PINGPONG: 0 or 1 turns the consumers' ping-pong off or on at every shape
#     (default: per shape, Sm90Config::kPingPong);
#   XK_RAGGED_CONSUMER_REGS: the consumers' registers at every shape (default: per shape);
#   XK_RAGGED_HEAVY_FIRST=0: a sequence's row tiles first first (default: last first);
#   XK_RAGGED_O_STAGED=0: O stored from the accumulators (default: through shared memory).
RAGGED_SWITCHES = [
    ("-DXK_RAGGED_PINGPONG=0", None),
    ("-DXK_RAGGED_PINGPONG=1 -DXK_RAGGED_CONSUMER_REGS=240", None),
    ("-DXK_RAGGED_HEAVY_FIRST=0 -DXK_RAGGED_O_STAGED=0", None),
    ("-DXK_RAGGED_CONSUMER_REGS=248", "a multiple of 8 up to 240"),
]


@requires_nvcc
@pytest.mark.parametrize("flags,refusal", RAGGED_SWITCHES)
def test_ragged_switch_compiles_and_is_checked(flags, refusal, tmp_path, monkeypatch):
    """A ragged wgmma switch given through ``NVCC_APPEND_FLAGS`` reaches the kernel."""
    check_switch("xla_kernels.ragged_paged_attention", flags, refusal, tmp_path, monkeypatch)
