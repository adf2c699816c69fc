"""The serving loop with a mixture-of-experts model (tiny-moe preset, CPU): both frontends'
paged engines, with the fused_moe kernel or its plain-XLA fallback, give the dense
reference's greedy tokens; the step holds one fused_moe custom call per layer; the serve-bench
command; what the MoE presets refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving_engine import SMALL_ENGINE, SMALL_WORKLOAD, run_engine
from xla_kernels import cli
from xla_kernels.serving.batch import empty_batch
from xla_kernels.serving.bench import make_runner
from xla_kernels.serving.config import ServingConfigError, preset
from xla_kernels.serving.reference import first_divergence
from xla_kernels.serving.tp import check_tp
from xla_kernels.serving.weights import weight_shapes

MODEL = preset("tiny-moe")
WORKLOAD = SMALL_WORKLOAD  # what the conftest requests fixture draws from


def run(runner, requests):
    return run_engine(runner, requests, SMALL_ENGINE, shuffle_seed=3)[0]


def test_moe_weights_are_in_fused_moe_layout():
    shapes = weight_shapes(MODEL)
    assert shapes["layers.0.mlp.gate.weight"] == (8, 128)
    assert shapes["layers.1.mlp.experts.w13_weight"] == (8, 128, 128)
    assert shapes["layers.1.mlp.experts.w2_weight"] == (8, 128, 64)
    assert not any("gate_proj" in name for name in shapes)


@pytest.mark.parametrize("attention", ["xla-kernels", "plain-xla"])
@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_paged_moe_engine_matches_dense_reference(frontend, attention, cpu, weights, requests,
                                                  reference):
    runner = make_runner(frontend, MODEL, weights, SMALL_ENGINE, attention)
    assert first_divergence(run(runner, requests), reference) is None


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_the_step_calls_fused_moe_once_per_layer(frontend, cpu, weights):
    batch = empty_batch(16, SMALL_ENGINE.max_num_seqs, SMALL_ENGINE.max_blocks_per_seq)
    text = make_runner(frontend, MODEL, weights, SMALL_ENGINE, "xla-kernels").lower(
        batch).as_text()
    assert text.count("@xla_kernels.fused_moe(") == MODEL.num_layers
    plain = make_runner(frontend, MODEL, weights, SMALL_ENGINE, "plain-xla").lower(batch).as_text()
    assert "@xla_kernels.fused_moe(" not in plain


def test_serve_bench_runs_the_moe_preset_and_matches_reference(tmp_path: Path):
    out = tmp_path / "moe.json"
    assert cli.main(["serve-bench", "--preset", "tiny-moe", "--platform", "cpu", "--requests",
                     "4", "--no-progress", "--no-breakdown", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["matches_reference"] is True
    assert result["config"]["model"]["num_experts"] == 8


def test_moe_presets_refuse_tensor_parallel():
    with pytest.raises(ServingConfigError, match=r"--tp 2: model 'moe' has experts.*Fix: pass "
                                                 r"--tp 1"):
        check_tp(preset("moe"), 2, ["d0", "d1"])


def test_the_moe_preset_is_shaped_like_qwen3_30b_a3b():
    m = preset("moe")
    assert (m.num_experts, m.experts_per_token, m.hidden_size, m.moe_intermediate_size) == (
        128, 8, 2048, 768)
    assert (m.num_q_heads, m.num_kv_heads, m.head_dim, m.vocab_size) == (32, 4, 128, 151936)
    assert round(m.num_params() / 1e9, 1) == 8.1


def test_a_moe_model_needs_its_expert_sizes():
    from xla_kernels.serving.config import ModelConfig

    with pytest.raises(ServingConfigError, match="experts per token"):
        ModelConfig("bad", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                    num_q_heads=1, num_kv_heads=1, head_dim=64, num_experts=4)
