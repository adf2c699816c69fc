"""scripts/build_wheel.py's CUTLASS step: the wheel's CUDA libraries are built with the
CUTLASS release the kernels name, and a library built without CUTLASS's code is caught."""

from __future__ import annotations

from pathlib import Path

from xla_kernels import bench
from xla_kernels.builder import cutlass

SCRIPT = Path(__file__).parents[1] / "scripts" / "build_wheel.py"


def load_script():
    return bench.load_script(SCRIPT)


def test_the_wheel_is_built_with_the_cutlass_release_the_kernels_name():
    assert load_script().CUTLASS == cutlass.VERSION


def test_a_gemm_library_without_cutlass_code_is_named(tmp_path):
    script = load_script()
    (tmp_path / "linear-cuda-1.so").write_bytes(b"\x7fELF ... _ZN7cutlass4gemm6kernel ...")
    (tmp_path / "fp8_linear-cuda-2.so").write_bytes(b"\x7fELF ... XkFp8LinearCuda ...")
    (tmp_path / "rms_norm-cuda-3.so").write_bytes(b"\x7fELF")  # not a GEMM library
    assert script.missing_hopper_paths(tmp_path) == ["fp8_linear-cuda-2.so"]
    (tmp_path / "fp8_linear-cuda-2.so").write_bytes(b"cutlass::gemm")
    assert script.missing_hopper_paths(tmp_path) == []


def test_a_gemm_library_that_was_not_built_is_named(tmp_path):
    (tmp_path / "linear-cuda-1.so").write_bytes(b"cutlass")
    assert load_script().missing_hopper_paths(tmp_path) == ["fp8_linear (no CUDA library)"]
