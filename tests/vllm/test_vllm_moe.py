"""tpu-inference's MoE layers through xla-kernels' fused_moe (xla_kernels.vllm.moe and its two
patches): the layer's result against a float64 oracle written here, upstream's own weight
processing and ``moe_apply`` reaching our op once patched, each refused feature's message,
and (slow) vllm.LLM.generate of a tiny Qwen3-MoE equal to transformers'.

(Named test_vllm_moe.py: tests/test_moe.py holds the op's own tests, and two test modules of
one basename cannot be collected together without packages.)"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_kernels.vllm import moe, patches

E, H, INTER, TOP_K = 8, 32, 16, 2


def _layer(**overrides):
    """The attributes moe_apply reads from a layer (vLLM's RoutedExperts names them so)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    fields = dict(top_k=TOP_K, renormalize=True, scoring_func="softmax",
                  activation=MoEActivation.SILU, use_grouped_topk=False,
                  custom_routing_function=None, swiglu_limit=None,
                  apply_router_weight_on_input=False, _get_name=lambda: "experts")
    fields.update(overrides)
    return SimpleNamespace(**fields)


def _weights(**overrides):
    from tpu_inference.layers.common.process_weights.moe_weights import FusedMoEWeights

    rng = np.random.default_rng(0)
    fields = dict(w13_weight=jnp.asarray(rng.normal(0, 0.2, (E, 2 * INTER, H)), jnp.float32),
                  w13_weight_scale=None, w13_bias=None,
                  w2_weight=jnp.asarray(rng.normal(0, 0.2, (E, H, INTER)), jnp.float32),
                  w2_weight_scale=None, w2_bias=None)
    fields.update(overrides)
    return FusedMoEWeights(**fields)


def _inputs(tokens=5):
    rng = np.random.default_rng(1)
    return (jnp.asarray(rng.normal(0, 1, (tokens, H)), jnp.float32),
            jnp.asarray(rng.normal(0, 1, (tokens, E)), jnp.float32))


def _mesh():
    from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES_2D

    return jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), MESH_AXIS_NAMES_2D)


def _gmm_tp():
    from tpu_inference.layers.common.moe import MoEBackend

    return MoEBackend.GMM_TP


def _oracle(x, logits, w13, w2, top_k, renormalize):
    """Softmax top-k MoE with SiLU(gate) * up experts, in float64, token by token."""
    x, logits = np.asarray(x, np.float64), np.asarray(logits, np.float64)
    w13, w2 = np.asarray(w13, np.float64), np.asarray(w2, np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        p = np.exp(logits[t] - logits[t].max())
        p /= p.sum()
        chosen = np.argsort(-p, kind="stable")[:top_k]
        weights = p[chosen] / (p[chosen].sum() if renormalize else 1.0)
        for e, w in zip(chosen, weights, strict=True):
            g = w13[e] @ x[t]
            gate, up = g[:INTER], g[INTER:]
            out[t] += w * (w2[e] @ (gate / (1 + np.exp(-gate)) * up))
    return out


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(("dtype", "tolerance"), [(jnp.float32, 2e-6), (jnp.bfloat16, 1e-2)])
def test_apply_equals_a_float64_moe(renormalize, dtype, tolerance):
    """bf16: the oracle takes the same bf16-rounded inputs; the op rounds the activation and
    the output to bf16 (measured: 0.0024 relative; f32 2e-7; the other renormalize: 0.38+)."""
    x, logits = (a.astype(dtype) for a in _inputs())
    w = _weights()
    w = _weights(w13_weight=w.w13_weight.astype(dtype), w2_weight=w.w2_weight.astype(dtype))
    before = moe.TRACES["fused_moe"]
    out = moe.apply(None, _layer(renormalize=renormalize), x, logits, w, _gmm_tp(), _mesh(), {})
    assert moe.TRACES["fused_moe"] == before + 1
    want = _oracle(x.astype(jnp.float32), logits.astype(jnp.float32),
                   w.w13_weight.astype(jnp.float32), w.w2_weight.astype(jnp.float32), TOP_K,
                   renormalize)
    got = np.asarray(out.astype(jnp.float32), np.float64)
    assert np.linalg.norm(got - want) <= tolerance * np.linalg.norm(want)
    assert out.dtype == dtype and out.shape == x.shape


def test_patched_upstream_processing_keeps_vllms_layout_and_moe_apply_runs_ours():
    """Upstream's own jitted ``process_unquantized_moe_weights`` (which calls the patched
    ``process_moe_weights``) and every module's ``moe_apply`` after ``apply_all``."""
    import importlib

    from tpu_inference.layers.common.process_weights.moe_weights import (
        process_unquantized_moe_weights,
    )
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    patches.apply_all()
    w = _weights()
    processed = process_unquantized_moe_weights(
        mesh=_mesh(), moe_backend=_gmm_tp(), activation=MoEActivation.SILU,
        w13_weight=w.w13_weight, w13_bias=None, w2_weight=w.w2_weight, w2_bias=None)
    np.testing.assert_array_equal(np.asarray(processed.w13_weight), np.asarray(w.w13_weight))
    np.testing.assert_array_equal(np.asarray(processed.w2_weight), np.asarray(w.w2_weight))
    x, logits = _inputs()
    want = _oracle(x, logits, w.w13_weight, w.w2_weight, TOP_K, True)
    for module in patches.MOE_APPLY_CALLERS:
        before = moe.TRACES["fused_moe"]
        out = importlib.import_module(module).moe_apply(_layer(), x, logits, processed,
                                                        _gmm_tp(), _mesh(), {})
        assert moe.TRACES["fused_moe"] == before + 1, module
        np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2e-4, atol=2e-5)


def test_interleaved_gate_up_rows_are_split_once_at_load():
    w = _weights()
    gate, up = w.w13_weight[:, :INTER], w.w13_weight[:, INTER:]
    interleaved = jnp.stack([gate, up], axis=2).reshape(E, 2 * INTER, H)
    kept = moe.keep_vllm_layout(_weights(w13_weight=interleaved), _gmm_tp(), 1,
                                w13_interleave=True)
    np.testing.assert_array_equal(np.asarray(kept.w13_weight), np.asarray(w.w13_weight))


def _backend(name):
    from tpu_inference.layers.common.moe import MoEBackend

    return MoEBackend(name)


@pytest.mark.parametrize(("layer", "extra", "what", "fix"), [
    (dict(scoring_func="sigmoid"), {}, "'sigmoid' expert scoring", "softmax routing"),
    (dict(use_grouped_topk=True), {}, "grouped top-k routing", "plain top-k"),
    (dict(custom_routing_function=print), {}, "custom routing function", "softmax top-k"),
    ({}, {"e_score_correction_bias": jnp.zeros(E)}, "score correction bias",
     "without e_score_correction_bias"),
    ({}, {"hash_based_topk_indices": jnp.zeros((5, TOP_K), jnp.int32)}, "hash-based",
     "softmax top-k"),
    ({}, {"scatter_results": True}, "attention data parallel", "data_parallel_size=1"),
    (dict(apply_router_weight_on_input=True), {}, "applied to the input", "outputs"),
    (dict(apply_expert_weight_before_computation=True), {}, "applied to the input",
     "outputs"),
    (dict(activation="swigluoai"), {}, "activation 'swigluoai'", "('silu',)"),
    (dict(swiglu_limit=7.0), {}, "clamped SwiGLU (swiglu_limit=7.0)", "without swiglu_limit"),
], ids=["sigmoid", "grouped-topk", "custom-routing", "correction-bias", "hash-routing",
        "attention-dp", "weight-on-input", "weight-before-computation", "swigluoai",
        "swiglu-clamp"])
def test_unsupported_routing_and_activations_are_refused(layer, extra, what, fix):
    x, logits = _inputs()
    with pytest.raises(moe.UnsupportedMoE, match=r"xla_kernels\.vllm MoE \(fused_moe\)") as e:
        moe.apply(None, _layer(**layer), x, logits, _weights(), _gmm_tp(), _mesh(), extra)
    found, _, remedy = str(e.value).partition("Fix:")
    assert what in found and fix in remedy


@pytest.mark.parametrize(("weights", "what", "fix"), [
    (dict(w13_weight_scale=jnp.ones((E, 1, 1, 2 * INTER))), "quantized expert weights "
     "(w13_weight_scale set)", "MOE_REQUANTIZE_WEIGHT_DTYPE unset"),
    (dict(w13_bias=jnp.zeros((E, 2 * INTER)), w2_bias=jnp.zeros((E, H))),
     "expert biases (w13_bias, w2_bias)", "without MoE biases"),
], ids=["quantized", "biases"])
def test_quantized_or_biased_experts_are_refused_at_load_and_at_apply(weights, what, fix):
    with pytest.raises(moe.UnsupportedMoE, match=fix) as e:
        moe.keep_vllm_layout(_weights(**weights), _gmm_tp(), 1)
    assert what in str(e.value)
    x, logits = _inputs()
    with pytest.raises(moe.UnsupportedMoE, match=fix):
        moe.apply(None, _layer(), x, logits, _weights(**weights), _gmm_tp(), _mesh(), {})


@pytest.mark.parametrize(("backend", "what", "fix"), [
    ("gmm_ep", "expert parallel MoE (backend gmm_ep)", "no enable_expert_parallel"),
    ("fused_moe", "expert parallel MoE (backend fused_moe)", "USE_MOE_EP_KERNEL"),
    ("megablox_gmm", "MoE backend 'megablox_gmm'", "unset USE_UNFUSED_MEGABLOCKS"),
], ids=["ep", "fused-ep-kernel", "megablox"])
def test_expert_parallel_and_other_backends_are_refused(backend, what, fix):
    with pytest.raises(moe.UnsupportedMoE) as e:
        moe.keep_vllm_layout(_weights(), _backend(backend), 1)
    found, _, remedy = str(e.value).partition("Fix:")
    assert what in found and fix in remedy


def test_tensor_parallel_lays_w13_out_per_shard_once_at_load():
    """w13_reorder_size (upstream passes the tensor-parallel degree) = 2: device 0's half of
    the rows is [gate rows 0..I/2; up rows 0..I/2], device 1's the rest."""
    w = _weights()
    kept = moe.keep_vllm_layout(w, _gmm_tp(), 2)
    half = INTER // 2
    gate, up = np.asarray(w.w13_weight[:, :INTER]), np.asarray(w.w13_weight[:, INTER:])
    want = np.concatenate([gate[:, :half], up[:, :half], gate[:, half:], up[:, half:]], axis=1)
    np.testing.assert_array_equal(np.asarray(kept.w13_weight), want)
    np.testing.assert_array_equal(np.asarray(kept.w2_weight), np.asarray(w.w2_weight))


def _abstract_mesh(data, model):
    from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES_2D

    return jax.sharding.AbstractMesh((data, model), MESH_AXIS_NAMES_2D)


def test_the_tensor_axis_is_upstreams_mlp_tensor_axis_and_data_parallel_is_refused():
    assert moe.tensor_axis(_abstract_mesh(1, 2)) == "model"
    assert moe.tensor_axis(_abstract_mesh(1, 1)) is None
    with pytest.raises(moe.UnsupportedMoE) as e:
        moe.tensor_axis(_abstract_mesh(2, 2))
    found, _, remedy = str(e.value).partition("Fix:")
    assert "data or expert parallel MoE (mesh axes {'data': 2})" in found
    assert "data_parallel_size=1" in remedy


def test_a_deferred_all_reduce_is_refused_under_tensor_parallel():
    x, logits = _inputs()
    with pytest.raises(moe.UnsupportedMoE) as e:
        moe.apply(None, _layer(), x, logits, _weights(), _gmm_tp(), _abstract_mesh(1, 2),
                  {"defer_all_reduce": True})
    assert "defer_all_reduce" in str(e.value) and "Fix: a caller that takes" in str(e.value)


TP_SCRIPT = """
import sys
import jax, numpy as np
from tpu_inference.layers.common import moe as common_moe
from tpu_inference.layers.common.moe import MoEBackend
from tpu_inference.layers.common.process_weights import moe_weights as mw
from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES_2D
from jax.sharding import PartitionSpec as P
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from xla_kernels.vllm import moe, patches
sys.path.insert(0, sys.argv[2])
import test_vllm_moe as t

patches.apply_all()
mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]).reshape(1, 2), MESH_AXIS_NAMES_2D)
w = t._weights()
processed = mw.process_unquantized_moe_weights(
    mesh=mesh, moe_backend=MoEBackend.GMM_TP, activation=MoEActivation.SILU,
    w13_weight=w.w13_weight, w13_bias=None, w2_weight=w.w2_weight, w2_bias=None)
placed = mw.shard_moe_weights(processed, MoEBackend.GMM_TP, mesh)
assert placed.w13_weight.sharding.spec == P(None, "model", None), placed.w13_weight.sharding
assert placed.w2_weight.sharding.spec == P(None, None, "model"), placed.w2_weight.sharding
x, logits = t._inputs()
run = jax.jit(lambda x, g, w: common_moe.moe_apply(t._layer(), x, g, w, MoEBackend.GMM_TP,
                                                   mesh, {}))
out = run(x, logits, placed)
assert moe.TRACES["fused_moe_sharded"] == 1, moe.TRACES
np.save(sys.argv[1], np.asarray(out))
"""


def test_tensor_parallel_over_two_devices_equals_a_float64_moe(tmp_path):
    """Upstream's own processing, placement and moe_apply, patched, on a (data 1, model 2)
    mesh of two host devices (a subprocess: the device count is fixed at JAX's start-up)."""
    import os
    from pathlib import Path

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = tmp_path / "out.npy"
    proc = subprocess.run([sys.executable, "-c", TP_SCRIPT, str(out),
                           str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    x, logits = _inputs()
    w = _weights()
    want = _oracle(x, logits, w.w13_weight, w.w2_weight, TOP_K, True)
    np.testing.assert_allclose(np.load(out).astype(np.float64), want, rtol=2e-4, atol=2e-5)


def test_weights_in_a_tpu_kernels_layout_are_refused():
    w = _weights()
    gmm = _weights(w13_weight=jnp.swapaxes(w.w13_weight, 1, 2),
                   w2_weight=jnp.swapaxes(w.w2_weight, 1, 2))
    x, logits = _inputs()
    with pytest.raises(moe.UnsupportedMoE, match="not in vLLM's layout") as e:
        moe.apply(None, _layer(), x, logits, gmm, _gmm_tp(), _mesh(), {})
    assert "XLA_KERNELS_VLLM unset" in str(e.value)


def test_dense_backend_stays_upstreams():
    """USE_DENSE_MOE's backend is plain XLA (runs anywhere): handed to upstream as it is."""
    seen = []
    moe.apply(lambda *a: seen.append(a), _layer(), None, None, None, _backend("dense_mat"),
              None, {})
    assert len(seen) == 1


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-moe", "tiny-moe-unnormalized"])
def test_tiny_moe_generate_matches_transformers_through_fused_moe(tmp_path, model):
    """Qwen3-MoE on vLLM's PyTorch model path (tpu-inference has no JAX-native Qwen3-MoE),
    with renormalized (norm_topk_prob) and plain top-k weights."""
    out = tmp_path / f"{model}.json"
    proc = subprocess.run([sys.executable, "-m", "xla_kernels.vllm.check", "--model",
                           model, "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["model_impl"] == "vllm"
    assert result["tokens"] == result["reference_tokens"], result
    assert all(len(t) == 16 for t in result["tokens"])
    assert result["ran_xla_kernels_moe"], result["moe"]
    assert result["moe"]["traces"]["fused_moe"] > 0
    assert result["ran_xla_kernels_attention"], result["attention"]
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_tiny_moe_generate_matches_transformers_under_tensor_parallel(tmp_path):
    """tensor_parallel_size=2 on two host devices: the experts' intermediate dimension split
    over the mesh axis ``model`` and fused_moe run per shard by fused_moe_sharded."""
    out = tmp_path / "tiny-moe-tp2.json"
    proc = subprocess.run([sys.executable, "-m", "xla_kernels.vllm.check", "--model",
                           "tiny-moe", "--tensor-parallel-size", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["tensor_parallel_size"] == 2
    assert result["tokens"] == result["reference_tokens"], result
    assert result["ran_xla_kernels_moe"], result["moe"]
    traces = result["moe"]["traces"]
    assert traces["fused_moe_sharded"] == traces["fused_moe"] > 0, traces
    assert proc.returncode == 0, proc.stderr[-4000:]
