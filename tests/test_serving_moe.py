"""The serving loop with a mixture-of-experts model (tiny-moe preset, CPU): both frontends'
paged engines, with the fused_moe kernel, its plain-XLA fallback or the ragged_dot MoE
(``--moe ragged-dot``), give the dense reference's greedy tokens; the step holds one fused_moe
custom call per layer, or with ``--moe`` the implementation it names beside the same attention
kernels; the serve-bench command and its JSON's ``moe``; what the MoE presets refuse, and
``--moe`` on a dense preset."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from serving_engine import SMALL_ENGINE, SMALL_WORKLOAD, make_runner, run_engine
from xla_kernels import cli
from xla_kernels.serving.batch import empty_batch
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


# (--attention, --moe, the experts' implementation the runner resolves them to)
MOE_RUNS = [("xla-kernels", "auto", "xla-kernels"), ("plain-xla", "auto", "plain-xla"),
            ("xla-kernels", "ragged-dot", "ragged-dot")]


@pytest.mark.parametrize("attention,moe,experts", MOE_RUNS,
                         ids=[f"{a}-moe-{m}" for a, m, _ in MOE_RUNS])
@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_paged_moe_engine_matches_dense_reference(frontend, attention, moe, experts, cpu,
                                                  weights, requests, reference):
    runner = make_runner(frontend, MODEL, weights, SMALL_ENGINE, attention, moe=moe)
    assert runner.backend.experts.value == experts
    assert first_divergence(run(runner, requests), reference) is None


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_the_step_calls_fused_moe_once_per_layer(frontend, cpu, weights):
    batch = empty_batch(16, SMALL_ENGINE.max_num_seqs, SMALL_ENGINE.max_blocks_per_seq)
    text = make_runner(frontend, MODEL, weights, SMALL_ENGINE, "xla-kernels").lower(
        batch).as_text()
    assert text.count("@xla_kernels.fused_moe(") == MODEL.num_layers
    plain = make_runner(frontend, MODEL, weights, SMALL_ENGINE, "plain-xla").lower(batch).as_text()
    assert "@xla_kernels.fused_moe(" not in plain


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_moe_ragged_dot_swaps_only_the_experts(frontend, cpu, weights):
    """The same attention kernels, and the experts through jax.lax.ragged_dot_general (on
    the CPU JAX lowers it to dense ops, so the debug locations name it) instead of the
    fused_moe custom call."""
    batch = empty_batch(16, SMALL_ENGINE.max_num_seqs, SMALL_ENGINE.max_blocks_per_seq)

    def text(moe):
        lowered = make_runner(frontend, MODEL, weights, SMALL_ENGINE, "xla-kernels",
                              moe=moe).lower(batch)
        return lowered.as_text(debug_info=True)

    fused, ragged = text("auto"), text("ragged-dot")
    for step in (fused, ragged):
        assert step.count("@xla_kernels.ragged_paged_attention(") == MODEL.num_layers
        assert step.count("@xla_kernels.reshape_and_cache(") == MODEL.num_layers
    assert "@xla_kernels.fused_moe(" not in ragged and "ragged_dot_general" in ragged
    assert "ragged_dot_general" not in fused


@pytest.mark.parametrize("argv,experts", [([], "xla-kernels"),
                                           (["--moe", "ragged-dot"], "ragged-dot"),
                                           (["--attention", "plain-xla"], "plain-xla")])
def test_serve_bench_runs_the_moe_preset_and_matches_reference(argv, experts, tmp_path: Path,
                                                               capsys):
    out = tmp_path / "moe.json"
    assert cli.main(["serve-bench", "--preset", "tiny-moe", "--platform", "cpu", "--requests",
                     "4", "--no-progress", "--no-breakdown", "--json", str(out), *argv]) == 0
    result = json.loads(out.read_text())
    assert result["matches_reference"] is True
    assert result["config"]["model"]["num_experts"] == 8
    assert result["config"]["moe"] == experts
    attention = result["config"]["attention"]
    assert f"tiny-moe float32, jax, {attention}, MoE {experts}, cpu" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "tiny", "--moe", "ragged-dot"],
     "--moe ragged-dot: model 'tiny' is dense (no experts), so there is no MoE layer to run. "
     "Fix: pass a mixture-of-experts preset (--preset tiny-moe or moe), or drop --moe."),
    (["--preset", "8b", "--moe", "xla-kernels"],
     "--moe xla-kernels: model '8b' is dense (no experts), so there is no MoE layer to run. "
     "Fix: pass a mixture-of-experts preset (--preset tiny-moe or moe), or drop --moe."),
    (["--preset", "tiny-moe", "--moe", "fused"],
     "unknown --moe 'fused'. Fix: pass --moe auto, xla-kernels, ragged-dot or plain-xla."),
])
def test_bad_moe_options_are_one_line_errors_with_the_fix(argv, message, capsys):
    start = time.perf_counter()
    assert cli.main(["serve-bench", "--platform", "cpu", "--no-progress", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"xla-kernels serve-bench: error: {message}"]
    assert time.perf_counter() - start < 10, "refused only after building the model"


def test_a_dense_preset_takes_moe_auto(tmp_path: Path):
    out = tmp_path / "tiny.json"
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--requests", "2",
                     "--new-tokens", "2", "--moe", "auto", "--no-progress", "--no-breakdown",
                     "--no-reference", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["moe"] is None


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
