"""The all-reduce kernel (kernels/allreduce/allreduce.cuh) on one GPU, before two are at hand:
tests/gpu/allreduce_ranks_on_one_gpu.cu runs 2 and 4 ranks as concurrent kernels on one
device (a workspace and a stream each), one-shot and two-shot, plain and fused with residual
add + RMSNorm, f32 and bf16, odd sizes, many calls on one workspace; and the hang guard (a
rank that never calls makes its peer trap with a record naming it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from xla_kernels.builder import find_nvcc

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "gpu" / "allreduce_ranks_on_one_gpu.cu"


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    binary = tmp_path_factory.mktemp("allreduce") / "ranks_on_one_gpu"
    subprocess.run([str(find_nvcc()), "-std=c++17", "-O2",
                    "-gencode", "arch=compute_90a,code=sm_90a",
                    "-gencode", "arch=compute_80,code=sm_80",
                    "-I", str(ROOT / "src" / "xla_kernels" / "kernels" / "allreduce"),
                    "-I", str(ROOT / "src" / "xla_kernels" / "include"),
                    str(HARNESS), "-o", str(binary)], check=True)
    return binary


def test_ranks_on_one_gpu_match_the_host_sums(harness):
    run = subprocess.run([str(harness), "check"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 mismatches" in run.stdout


def test_a_rank_that_never_calls_is_named_by_its_peer(harness):
    run = subprocess.run([str(harness), "hang"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rank 1 named" in run.stdout
