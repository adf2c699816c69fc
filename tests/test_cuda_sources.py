"""Every CUDA kernel the package ships compiles with nvcc for Hopper (CI has nvcc, no GPU),
and declares itself safe for XLA's CUDA graphs (command buffers); the sources keep no
compile-time switch, and the attention kernels walk the paged cache through one layer."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.cli import shipped_ops
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


@pytest.mark.slow
@requires_nvcc
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_cuda_kernel_compiles_for_sm90_and_is_graph_safe(name, tmp_path):
    op = SHIPPED[name]
    kernel = op.kernels["cuda"]
    path = build_for_sm90(name, tmp_path)
    handler = getattr(ctypes.CDLL(str(path)), kernel.handler)
    assert handler_metadata(handler, op_name=op.name).command_buffer_compatible


# Macros the kernel sources may define: what the compiler targets (feature tests) and the
# legacy / eager ABI glue. Anything else defaulted with #ifndef would be a compile-time
# switch, i.e. an experiment left alive: tuning decisions live in each kernel's tuning table.
FEATURE_MACROS = {"XK_HAS_WGMMA", "XK_HAS_ASYNC_PIPELINE", "XK_HOST_DEVICE"}


def test_kernel_sources_keep_no_compile_time_switches():
    root = Path(builder.__file__).parents[1]
    switches = {}
    for path in [*root.glob("kernels/**/*.cu*"), *root.glob("kernels/**/*.h"),
                 *root.glob("include/xla_kernels/*.cu*"), *root.glob("include/xla_kernels/*.h")]:
        for name in re.findall(r"^\s*#\s*ifndef\s+(XK_\w+)", path.read_text(), re.M):
            if name not in FEATURE_MACROS and not name.startswith(("XK_LEGACY", "XK_EAGER")):
                switches.setdefault(path.name, []).append(name)
    assert switches == {}


def test_the_attention_kernels_address_the_paged_cache_only_through_its_view():
    """Block ids, slots and row offsets come from xla_kernels/paged_cache.cuh alone: no
    kernel of paged_attention or ragged_paged_attention does the arithmetic itself."""
    root = Path(builder.__file__).parents[1] / "kernels"
    arithmetic = re.compile(r">>\s*\w+(\.cache)?\.log2_bs|\*\s*\w+(\.cache)?\.(sb|ss|sh)\b")
    kernels = [*(root / "paged_attention").glob("*.cuh"),
               *(root / "ragged_paged_attention").glob("*.cuh")]
    found = {p.name: arithmetic.findall(p.read_text()) for p in kernels}
    assert {name: hits for name, hits in found.items() if hits} == {}
    for d in ("paged_attention/decode_common.cuh", "ragged_paged_attention/ragged_common.cuh"):
        assert '#include "xla_kernels/paged_cache.cuh"' in (root / d).read_text()
