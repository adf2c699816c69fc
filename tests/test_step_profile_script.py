"""benchmarks/step_profile.py: its doctests, the analysis of a made-up two-step trace (one
layer: q/k/v, cache write, attention, o, gate/up, down, LM head), and the tiny preset on
the CPU, where no kernel is recorded but the HLO's counts and labels are written."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xla_kernels.bench import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "step_profile.py"


@pytest.fixture
def module(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # its sibling imports
    return load_script(SCRIPT)


def test_doctests(module):
    assert doctest.testmod(module).failed == 0


LAYER = [("nvjet_q", 10), ("nvjet_kv", 2), ("nvjet_kv", 2),
         ("void xla_kernels::kv_cache::CopyRowsKernel<4>", 1),
         ("void xla_kernels::ragged_paged_attention::ragged_mma_kernel", 5), ("nvjet_o", 8),
         ("loop_add_fusion", 1), ("nvjet_gu", 12), ("nvjet_gu", 12), ("splitKreduce_kernel", 2),
         ("loop_multiply_fusion", 1), ("nvjet_d", 12), ("nvjet_lm", 20)]
LABELS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
          "lm_head"]


def trace(steps: int) -> list[dict]:
    events, t = [], 0.0
    for step in range(steps):
        for i, (name, dur) in enumerate(LAYER):
            t += 1 if i else 5                  # 1 µs between kernels, 5 before each step
            events.append({"name": name, "cat": "kernel", "ts": t, "dur": dur,
                           "args": {"correlation": step, "device": 0}})
            t += dur
    # The host's read of the last step's tokens: one copy in the whole trace.
    return [*events, {"name": "Memcpy DtoH", "cat": "gpu_memcpy", "ts": t + 1, "dur": 2,
                      "args": {"correlation": 99, "device": 0}}]


def test_a_made_up_trace_is_cut_into_steps_categories_and_projections(module):
    import numpy as np

    from xla_kernels.serving.config import preset
    from xla_kernels.serving.weights import weight_shapes

    weights = {n: np.zeros(s, np.float32) for n, s in weight_shapes(preset("tiny")).items()}
    labels = [{"label": label} for label in LABELS]
    result = module.analyze(trace(2), 2, labels, weights, copy_gbs=1000.0)
    tl = result["timeline"]
    assert tl["busy_us"] == 89 and tl["events"] == 13.5 and tl["launches"] == 1.5
    assert tl["gaps_inside_launches_us"] == 12 and tl["gaps_between_launches_us"] == 3
    cats = {c["category"]: c["us_per_step"] for c in result["categories"]}
    assert cats == {"gemm": 80, "attention": 5, "kv_cache_write": 1, "xla_fusion": 2,
                    "memcpy/memset": 1}
    rows = {r["projection"]: r for r in result["projections"]["rows"]}
    assert result["projections"]["labelled"] and list(rows) == LABELS
    assert rows["up_proj"]["median_us"] == 14          # the split-K reduce counts with it
    assert rows["q_proj"]["weight_bytes"] == 256 * 128 * 4
    assert rows["q_proj"]["gb_per_s"] == round(256 * 128 * 4 / 10 / 1e3, 1)
    assert rows["lm_head"]["share_of_copy"] == round(512 * 128 * 4 / 20 / 1e3 / 1000, 4)


def test_a_count_mismatch_reports_per_kernel_name_and_one_layer(module):
    result = module.analyze(trace(2), 2, [{"label": "q_proj"}], {}, copy_gbs=1000.0)
    proj = result["projections"]
    assert not proj["labelled"] and "8 GEMM/fp8_linear kernels" in proj["note"]
    assert {r["projection"] for r in proj["rows"]} == {"nvjet_q", "nvjet_kv", "nvjet_o",
                                                       "nvjet_gu", "nvjet_d", "nvjet_lm"}
    assert proj["one_layer"][0].startswith("attention: ")
    report = module.markdown({"config": {"preset": "tiny", "frontend": "jax",
                                         "attention": "xla-kernels", "weights": "model",
                                         "batch": 1, "context": 1, "device": "fake"},
                              "step_ms": 0.1, "copy_gbs": 1000.0, "weight_bytes_per_step": 1,
                              "kv_bytes_per_step": 1, "roofline": {
                                  "floor_us": 1.0, "busy_over_floor": 88.0,
                                  "step_ms_over_floor": 100.0}, **result})
    assert "| gemm | 7 | 9 | 80.0 | 89.9% |" in report and "One layer's kernels" in report


# XLA:GPU's shapes of a step: a cuBLAS GEMM inside an HLO-level command buffer (its weight a
# parameter of the called computation), SiLU in a loop fusion, a Triton GEMM fusion.
GPU_HLO = ROOT / "tests" / "fixtures" / "step_hlo_gpu.txt"


def test_gpu_style_hlo_labels_through_calls_and_finds_silu_apart(module):
    from xla_kernels.serving.config import preset

    hlo = module.parse_hlo(GPU_HLO.read_text())
    assert [(m["label"], m["by"]) for m in module.label_matmuls(hlo, preset("tiny"))] == [
        ("q_proj", "parameter"), ("down_proj", "parameter")]
    summary = module.fusion_summary(hlo)
    assert summary["by_kind"] == {"kLoop": 1, "__triton_gemm": 1}
    assert summary["custom_calls"] == {"__cublas$gemm": 1}
    assert summary["silu_fused_in"] == {"kLoop (no dot)": 1}


@pytest.mark.slow
def test_tiny_on_the_cpu_writes_the_hlo_counts(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--preset", "tiny", "--batch", "4",
                           "--context", "64", "--calls", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                               "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "no CUDA kernels recorded (CPU run)" in proc.stdout
    result = json.loads((tmp_path / "step_profile_tiny_4x64.json").read_text())
    assert result["hlo"]["custom_calls"]["xla_kernels.ragged_paged_attention"] == 2
    assert [m["label"] for m in result["hlo"]["matmuls"]] == (
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] * 2
        + ["lm_head"])
    assert (tmp_path / "step_hlo_tiny_4x64.txt.gz").exists()
