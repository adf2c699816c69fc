"""The serving backend: serve-bench's words (--attention, --moe, --weights, --frontend and the
sampling options) are checked and resolved once, into enums and plain objects the models
take; a bad word or combination is a named error from resolution, never from inside a
traced model."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from xla_kernels.serving.attention import Attention
from xla_kernels.serving.backend import (
    Backend,
    Frontend,
    plain_xla_backend,
    resolve_backend,
    resolve_frontend,
)
from xla_kernels.serving.bench import BenchOptions, resolve
from xla_kernels.serving.config import EngineConfig, ServingConfigError, preset
from xla_kernels.serving.moe import Experts
from xla_kernels.serving.quantize import Projection
from xla_kernels.serving.sampling import Sampling

SERVING = Path(__file__).resolve().parents[1] / "src" / "xla_kernels" / "serving"
DENSE, MOE = preset("tiny"), preset("tiny-moe")
ENGINE = EngineConfig(block_size=16, num_blocks=8, max_num_seqs=2, max_model_len=32,
                      token_budget=16)


def test_the_defaults_resolve_to_the_librarys_kernels_greedy():
    assert resolve_backend(DENSE) == Backend(Attention.KERNELS, None, Projection(), Sampling())


@pytest.mark.parametrize("attention, moe, experts", [
    ("xla-kernels", "auto", Experts.KERNELS), ("plain-xla", "auto", Experts.PLAIN_XLA),
    ("xla-kernels", "ragged-dot", Experts.RAGGED_DOT),
    ("plain-xla", "xla-kernels", Experts.KERNELS)])
def test_moe_auto_follows_the_attention_and_any_other_word_is_kept(attention, moe, experts):
    backend = resolve_backend(MOE, attention, moe)
    assert backend.attention is Attention(attention) and backend.experts is experts


def test_a_dense_model_has_no_experts():
    assert resolve_backend(DENSE, "plain-xla").experts is None


@pytest.mark.parametrize("weights, attention, projection", [
    ("model", "xla-kernels", Projection()),
    ("fp8", "xla-kernels", Projection("none", kernel=True)),
    ("fp8", "plain-xla", Projection("none", kernel=False)),
    ("fp8-dynamic", "xla-kernels", Projection("dynamic", kernel=True))])
def test_the_weights_format_and_attention_pick_the_projection(weights, attention, projection):
    assert resolve_backend(DENSE.with_weights(weights), attention).projection == projection


def test_the_sampling_is_carried_as_given():
    sampling = Sampling(temperature=0.5, top_k=3, seed=7)
    assert resolve_backend(DENSE, sampling=sampling).sampling == sampling


def test_the_reference_backend_is_plain_xla_everywhere():
    backend = plain_xla_backend(MOE)
    assert (backend.attention, backend.experts) == (Attention.PLAIN_XLA, Experts.PLAIN_XLA)
    assert plain_xla_backend(DENSE.with_weights("fp8")).projection == Projection("none")


@pytest.mark.parametrize("call, message", [
    (lambda: resolve_backend(DENSE, "fused"),
     "unknown --attention 'fused'. Fix: pass --attention xla-kernels or plain-xla."),
    (lambda: resolve_backend(MOE, moe="fused"),
     "unknown --moe 'fused'. Fix: pass --moe auto, xla-kernels, ragged-dot or plain-xla."),
    (lambda: resolve_backend(DENSE, moe="ragged-dot"),
     "--moe ragged-dot: model 'tiny' is dense (no experts), so there is no MoE layer to run. "
     "Fix: pass a mixture-of-experts preset (--preset tiny-moe or moe), or drop --moe."),
    (lambda: resolve_frontend("tf"), "unknown --frontend 'tf'. Fix: pass --frontend jax or "
                                     "torchax.")])
def test_a_bad_word_or_combination_is_a_named_error_from_resolution(call, message):
    with pytest.raises(ServingConfigError) as e:
        call()
    assert str(e.value) == message


def test_serve_bench_resolves_every_option_before_making_a_weight():
    with pytest.raises(ServingConfigError, match=r"^unknown --attention 'fused'"):
        resolve(BenchOptions(preset="tiny", platform="cpu", attention="fused"))
    plan = resolve(BenchOptions(preset="tiny-moe", platform="cpu", frontend="torchax",
                                moe="ragged-dot", requests=2))
    assert plan.frontend is Frontend.TORCHAX and plan.backend.experts is Experts.RAGGED_DOT
    assert len(plan.requests) == 2 and plan.device.platform == "cpu"


@pytest.mark.parametrize("backend_of, model, message", [
    (DENSE, DENSE.with_weights("fp8"), "a backend resolved for model weights runs a model with "
                                       "fp8 weights"),
    (DENSE, MOE, "a backend resolved for a dense model runs model 'tiny-moe'"),
    (MOE, DENSE, "a backend resolved for a mixture of experts runs model 'tiny'")])
def test_a_runner_refuses_a_backend_resolved_for_another_model(backend_of, model, message):
    from xla_kernels.serving.model_jax import JaxRunner

    with pytest.raises(ServingConfigError, match=message):
        JaxRunner(model, {}, ENGINE, resolve_backend(backend_of))


def _check_choice_callers() -> set[str]:
    callers = set()
    for path in SERVING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check_choice":
                callers.add(path.stem)
    return callers


def test_option_words_are_checked_only_where_options_are_resolved():
    """The models, the attention, the experts, the projections and the sampling take
    resolved objects: no option string is checked below the resolution."""
    assert _check_choice_callers() == {"config", "backend", "bench"}
