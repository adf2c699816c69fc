"""tpu-inference's fp8 linear layers through xla-kernels' fp8_linear (xla_kernels.vllm.fp8 and
its three patches): upstream's own weight processing and ``_apply_fused`` / ``_apply_split``
reaching our op once patched, against a float64 oracle on the dequantized weights; each
refused feature's message; and (slow) vllm.LLM.generate of a tiny Llama written as an fp8
checkpoint (per-tensor and 128 x 128 block scales) equal to transformers' on the dequantized
weights.

(Named test_vllm_fp8.py: tests/test_fp8_linear.py holds the op's own tests.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from xla_kernels.kernels.fp8_weights import fp8_quantize
from xla_kernels.vllm import fp8, patches

IN = 256
SIZES = (256, 128, 128)   # a fused q/k/v: the tiny Llama's 4 q and 2 kv heads of 64
BLOCK = (128, 128)


def _config(sizes=SIZES, **overrides):
    from tpu_inference.layers.common.quantization.configs import QuantLinearConfig

    config = QuantLinearConfig(enable_sp=False, output_sizes=list(sizes))
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def _method(block=None, sizes=SIZES, **overrides):
    """tpu-inference's shared fp8 method, as vLLM's ``VllmFp8LinearMethod`` carries it
    (``weight_block_size`` set by vLLM's ``Fp8LinearMethod``)."""
    from tpu_inference.layers.common.quantization import fp8 as common_fp8

    method = common_fp8.Fp8LinearMethod(_config(sizes, **overrides))
    method.weight_block_size = list(block) if block else None
    return method


def _checkpoint(sizes=SIZES, block=None, seed=0):
    """Per shard (q, k, v): its e4m3 weight [out, in] and scale, as an fp8 checkpoint holds
    them (per tensor: a scalar; blocks: [out / 128, in / 128]), and the dequantized f32
    weight of the whole layer [sum(sizes), in]."""
    rng = np.random.default_rng(seed)
    shards, dequantized = [], []
    for size in sizes:
        w = rng.normal(0, 0.08, (size, IN)).astype(np.float32)
        if block is None:
            scale = np.float32(np.abs(w).max() / 448)
            q = (w / scale).astype(ml_dtypes.float8_e4m3fn)
            dequantized.append(q.astype(np.float32) * scale)
        else:
            q, scale = fp8_quantize(w, block)
            full = np.repeat(np.repeat(scale, block[0], 0), block[1], 1)[:size, :IN]
            dequantized.append(q.astype(np.float32) * full)
        shards.append((q, scale))
    return shards, np.concatenate(dequantized)


def _x(tokens=5, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(1).normal(0, 1, (tokens, IN)), dtype)


def _oracle(x, w):
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def _per_tensor_processed(shards, fused=True):
    """What ``VllmFp8LinearMethod.process_weights_after_loading`` makes of per-tensor
    scales: the weight transposed to [in, out], each shard's scale repeated over its output
    columns, then upstream's ``process_linear_weights``."""
    from tpu_inference.layers.common.process_weights.linear_weights import (
        LinearWeights,
        process_linear_weights,
    )

    weight = jnp.transpose(jnp.asarray(np.concatenate([q for q, _ in shards])))
    scale = jnp.concatenate([jnp.full((q.shape[0],), s) for q, s in shards])
    sizes = tuple(q.shape[0] for q, _ in shards)
    return process_linear_weights(LinearWeights(weight, scale, None, None), fused=fused,
                                  output_sizes=sizes, reorder_size=1)


def _block_processed(shards, fused=True, **overrides):
    """``VllmFp8LinearMethod.process_weights_after_loading`` for block scales: weight and
    ``weight_scale_inv`` transposed, then (patched) ``process_blockwise_fp8_linear_weights``."""
    from tpu_inference.layers.common.quantization import fp8 as common_fp8

    weight = jnp.transpose(jnp.asarray(np.concatenate([q for q, _ in shards])))
    scale = jnp.transpose(jnp.asarray(np.concatenate([s for _, s in shards])))
    kwargs = dict(bias=None, weight_block_size=BLOCK, requant_block_size=None,
                  output_sizes=tuple(q.shape[0] for q, _ in shards),
                  requant_weight_dtype=jnp.float8_e4m3fn, fuse_matmuls=fused, n_shards=1,
                  enable_kernel=False)
    kwargs.update(overrides)
    return common_fp8.process_blockwise_fp8_linear_weights(weight, scale, **kwargs)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "split"])
@pytest.mark.parametrize("block", [None, BLOCK], ids=["per-tensor", "block-128"])
def test_upstream_processing_and_apply_run_fp8_linear(block, fused):
    """The weights as tpu-inference processes them, through the patched ``_apply_fused`` /
    ``_apply_split`` (what ``VllmFp8LinearMethod.apply`` and the JAX path's ``apply_jax``
    call): one fp8_linear per weight, equal to x @ dequantized weight.T (f32 x: products and
    sums in f32, so 1e-5 relative)."""
    patches.apply_all()
    shards, dequantized = _checkpoint(block=block)
    processed = (_per_tensor_processed(shards, fused) if block is None
                 else _block_processed(shards, fused))
    method = _method(block)
    x = _x()
    before = fp8.TRACES["fp8_linear"]
    if fused:
        out = method._apply_fused(x, processed.weight, processed.weight_scale, None)
        calls = 1
    else:
        out = method._apply_split(x, list(zip(processed.weight, processed.weight_scale,
                                              strict=True)))
        calls = len(SIZES)
    assert fp8.TRACES["fp8_linear"] == before + calls
    assert out.shape == (5, sum(SIZES)) and out.dtype == jnp.float32
    want = _oracle(x, dequantized)
    got = np.asarray(out, np.float64)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "split"])
@pytest.mark.parametrize("block", [None, BLOCK], ids=["per-tensor", "block-128"])
def test_weights_stored_out_in_at_load_leave_no_weight_transpose_in_the_step(block, fused):
    """``store_weights_out_in`` (the last step of the patched
    ``process_weights_after_loading``): the layer's weights become [out, in] once, a second
    call changes nothing, and the patched apply takes them as they are: the oracle's result,
    and no transpose of an e4m3 tensor left in the compiled program."""
    import jax
    import torch
    from torchax.interop import jax_view, torch_view

    patches.apply_all()
    shards, dequantized = _checkpoint(block=block)
    processed = (_per_tensor_processed(shards, fused) if block is None
                 else _block_processed(shards, fused))
    method = _method(block)
    originals = [processed.weight] if fused else list(processed.weight)
    params = [torch.nn.Parameter(torch_view(w), requires_grad=False) for w in originals]
    layer = torch.nn.Module()
    layer.weight = params[0] if fused else torch.nn.ParameterList(params)
    fp8.store_weights_out_in(method, layer)
    fp8.store_weights_out_in(method, layer)
    stored = [jax_view(layer.weight)] if fused else [jax_view(w) for w in layer.weight]
    for now, before in zip(stored, originals, strict=True):
        assert now.shape == before.shape[::-1]
        assert (np.asarray(now).view(np.uint8) == np.asarray(before).view(np.uint8).T).all()
    x = _x()
    if fused:
        run = jax.jit(lambda x, w, s: method._apply_fused(x, w, s, None))
        args = (x, stored[0], processed.weight_scale)
    else:
        run = jax.jit(lambda x, ws, ss: method._apply_split(x, list(zip(ws, ss, strict=True))))
        args = (x, stored, list(processed.weight_scale))
    got = np.asarray(run(*args), np.float64)
    want = _oracle(x, dequantized)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
    hlo = run.lower(*args).compile().as_text()
    e4m3_transposes = [line for line in hlo.splitlines()
                       if re.search(r"= f8e4m3fn\[.*transpose", line)]
    assert not e4m3_transposes


def test_block_scales_are_kept_as_the_checkpoint_has_them():
    """Upstream's default would dequantize to bf16 and quantize again per output column."""
    patches.apply_all()
    shards, _ = _checkpoint(block=BLOCK)
    kept = _block_processed(shards)
    weight = np.concatenate([q for q, _ in shards]).T
    scale = np.concatenate([s for _, s in shards]).T
    assert kept.weight.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(kept.weight).view(np.uint8), weight.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(kept.weight_scale), scale)


def test_bf16_activations_give_the_oracle_within_bf16():
    shards, dequantized = _checkpoint()
    processed = _per_tensor_processed(shards)
    x = _x(dtype=jnp.bfloat16)
    out = fp8.linear(x, processed.weight, processed.weight_scale, None)
    want = _oracle(x.astype(jnp.float32), dequantized)
    got = np.asarray(out.astype(jnp.float32), np.float64)
    assert out.dtype == jnp.bfloat16
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


def test_a_weight_in_the_wrong_layout_gives_other_numbers():
    """The transpose matters: [out, in] read as [in, out] (a square weight passes the shape
    checks) is far from the oracle, so the engine test can fail on a layout mistake."""
    shards, dequantized = _checkpoint(sizes=(256,))
    processed = _per_tensor_processed(shards)
    x = _x()
    wrong = fp8.linear(x, jnp.transpose(processed.weight), processed.weight_scale, None)
    want = _oracle(x, dequantized)
    assert np.linalg.norm(np.asarray(wrong, np.float64) - want) > 0.5 * np.linalg.norm(want)


@pytest.mark.parametrize(("args", "what", "fix"), [
    (dict(weight=jnp.zeros((IN, 8), jnp.int8), weight_scale=jnp.ones(8)),
     "dtype int8", "REQUANTIZE_WEIGHT_DTYPE unset"),
    (dict(weight_scale=jnp.ones((2, 1, 8))), "the quantized matmul kernel's layout",
     "ENABLE_QUANTIZED_MATMUL_KERNEL"),
    (dict(weight_scale=jnp.ones(3)), "3 scales for a weight of 8 output columns",
     "one scale per weight or per fused shard"),
    (dict(weight_scale=jnp.ones((2, 1))), "without a weight_block_size", "weight_block_size"),
    (dict(weight_scale=jnp.ones((1, 1)), block=BLOCK), "expected (2, 1)",
     "REQUANTIZE_BLOCK_SIZE unset"),
], ids=["int8", "kernel-scales", "scale-count", "2d-without-blocks", "block-shape"])
def test_weights_fp8_linear_cannot_take_are_refused(args, what, fix):
    call = dict(x=jnp.zeros((2, IN)), weight=jnp.zeros((IN, 8), jnp.float8_e4m3fn),
                weight_scale=jnp.ones(8), block=None)
    call.update(args)
    with pytest.raises(fp8.UnsupportedFp8, match=r"xla_kernels\.vllm fp8 linear") as e:
        fp8.linear(call["x"], call["weight"], call["weight_scale"], call["block"])
    found, _, remedy = str(e.value).partition("Fix:")
    assert what in found and fix in remedy


@pytest.mark.parametrize(("overrides", "sizes", "what", "fix"), [
    (dict(requant_block_size=256), (256,), "REQUANTIZE_BLOCK_SIZE=256",
     "REQUANTIZE_BLOCK_SIZE unset"),
    (dict(enable_kernel=True), (256,), "ENABLE_QUANTIZED_MATMUL_KERNEL",
     "ENABLE_QUANTIZED_MATMUL_KERNEL"),
    ({}, (192, 64), "output sizes (192, 64)", "fused shards (q/k/v, gate/up) are whole"),
    (dict(n_shards=2), (128, 128), "two fused shards on 2 devices",
     "a smaller tensor_parallel_size"),
], ids=["requant-block", "kernel", "straddling-block", "straddling-tp"])
def test_block_processing_refuses_what_would_change_or_split_blocks(overrides, sizes, what,
                                                                    fix):
    patches.apply_all()
    shards, _ = _checkpoint(sizes=(256,), block=BLOCK)
    with pytest.raises(fp8.UnsupportedFp8) as e:
        _block_processed(shards, output_sizes=sizes, **overrides)
    found, _, remedy = str(e.value).partition("Fix:")
    assert what in found and fix in remedy


def test_a_deferred_all_reduce_over_a_split_input_axis_is_refused():
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P
    from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES_2D

    method = _method(sizes=(8,), defer_all_reduce=True, weight_sharding=P("model", None),
                     mesh=AbstractMesh((1, 2), MESH_AXIS_NAMES_2D))
    with pytest.raises(fp8.UnsupportedFp8) as e:
        fp8.apply_fused(method, jnp.zeros((2, IN)), jnp.zeros((IN, 8), jnp.float8_e4m3fn),
                        jnp.ones(8), None)
    assert "defer_all_reduce" in str(e.value) and "Fix: a caller that takes" in str(e.value)


def _check(tmp_path, *args):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "-m", "xla_kernels.vllm.check", *args, "--json",
                           str(out)], capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-4000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("model", "model_impl", "weights", "tp"), [
    ("tiny", "vllm", "fp8", 1),
    ("tiny", "vllm", "fp8-block", 1),
    ("tiny-qwen3", "flax_nnx", "fp8-block", 1),
    ("tiny", "vllm", "fp8", 2),
    ("tiny", "vllm", "fp8-channel", 1),
    ("tiny", "vllm", "fp8-static", 1),
    ("tiny-qwen3", "flax_nnx", "fp8-channel", 1),
], ids=["torch-per-tensor", "torch-block", "jax-block", "torch-per-tensor-tp2",
        "torch-compressed-channel", "torch-compressed-static", "jax-compressed-channel"])
def test_tiny_fp8_generate_matches_transformers_on_the_dequantized_weights(
        tmp_path, model, model_impl, weights, tp):
    """vLLM on an fp8 checkpoint (f16 activations) against transformers (f32) on the same
    weights dequantized; every fp8 linear layer traced through fp8_linear. PyTorch Llama and
    the JAX-native Qwen3 (tpu-inference's JAX Llama cannot load e4m3); vLLM's Fp8Config and
    compressed-tensors checkpoints; tp=2 on two host devices; no fp8 weight is transposed
    inside the step."""
    proc, result = _check(tmp_path, "--model", model, "--model-impl", model_impl,
                          "--weights", weights, "--tensor-parallel-size", str(tp))
    assert result["weights"] == weights and result["dtype"] == "float16"
    assert result["model_impl"] == model_impl and result["tensor_parallel_size"] == tp
    assert result["tokens"] == result["reference_tokens"], result
    assert all(len(t) == 16 for t in result["tokens"])
    assert result["ran_xla_kernels_fp8_linear"], result["fp8_linear"]
    assert result["fp8_linear"]["traces"]["fp8_linear"] > 0
    # Every fp8 weight was stored [out, in] at load, on both model paths.
    assert result["fp8_linear"]["traces"].get(fp8.TRANSPOSED_IN_THE_STEP, 0) == 0, result
    assert result["ran_xla_kernels_attention"], result["attention"]
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize(("model", "weights", "what", "fix"), [
    ("tiny", "fp8-block", "has no e4m3", "--model-impl vllm, or --model tiny-qwen3"),
    ("tiny-qwen3", "fp8", "one scale per output channel", "--weights fp8-block"),
    ("tiny-moe", "fp8", "experts would be fp8 too", "--model tiny"),
    ("tiny-qwen3", "fp8-static", "one scale per output channel", "--weights fp8-block"),
], ids=["jax-llama", "jax-per-tensor", "moe", "jax-compressed-per-tensor"])
def test_the_check_refuses_fp8_runs_upstream_cannot_load(model, weights, what, fix):
    from xla_kernels.vllm import check

    impl = "vllm" if model == "tiny-moe" else "flax_nnx"
    with pytest.raises(ValueError) as e:
        check.check(model, "cpu", impl, 1, weights=weights)
    found, _, remedy = str(e.value).partition("Fix:")
    assert what in found and fix in remedy


def _fp8_checkpoint(tmp_path, monkeypatch, model, weights, impl):
    """``model`` written as an fp8 checkpoint of format ``weights``, with MODEL_IMPL_TYPE set
    to ``impl`` (None: unset, tpu-inference's ``auto``)."""
    from xla_kernels.vllm import models

    if impl is None:
        monkeypatch.delenv("MODEL_IMPL_TYPE", raising=False)
    else:
        monkeypatch.setenv("MODEL_IMPL_TYPE", impl)
    return models.fp8_weights(models.MODELS[model](tmp_path / "bf16"), tmp_path,
                              models.FP8_WEIGHTS[weights])


@pytest.mark.parametrize(("model", "weights", "impl", "engine", "what", "fix"), [
    ("tiny", "fp8-block", None, {}, "its LlamaForCausalLM reads safetensors through NumPy, "
     "which has no e4m3 dtype", "set MODEL_IMPL_TYPE=vllm"),
    ("tiny-qwen3", "fp8", None, {}, "per-tensor fp8 scales are not supported on "
     "tpu-inference's JAX-native model path", "set MODEL_IMPL_TYPE=vllm"),
    ("tiny-qwen3", "fp8-static", None, {}, "per-tensor fp8 scales", "block or per-channel"),
    ("tiny", "fp8-block", "vllm", {"load_format": "dummy"},
     "dummy weights (load_format='dummy') for an fp8 checkpoint's configuration",
     "load the checkpoint's weights"),
    ("tiny-qwen3", "fp8-block", None, {"load_format": "dummy"}, "dummy weights",
     "drop quantization_config"),
], ids=["jax-llama", "jax-per-tensor", "jax-compressed-per-tensor", "dummy-pytorch",
        "dummy-jax"])
def test_the_engine_refuses_fp8_checkpoints_upstream_cannot_load(
        tmp_path, monkeypatch, engine_config, model, weights, impl, engine, what, fix):
    """At configuration, by name, where the engine would otherwise stop at load
    (AttributeError, RuntimeError, torch's NotImplementedError) or, for the JAX-native Llama
    on dummy weights, run without its fp8 layers."""
    checkpoint = _fp8_checkpoint(tmp_path, monkeypatch, model, weights, impl)
    with pytest.raises(ValueError) as e:
        engine_config(checkpoint.path, dtype="float16", **engine)
    found, _, remedy = str(e.value).partition("Fix:")
    assert what in found and fix in remedy, str(e.value)


@pytest.mark.parametrize(("model", "weights", "impl"), [
    ("tiny", "fp8-block", "vllm"), ("tiny", "fp8", "vllm"), ("tiny", "fp8-channel", "vllm"),
    ("tiny-qwen3", "fp8-block", None), ("tiny-qwen3", "fp8-channel", None)])
def test_the_engine_takes_the_fp8_checkpoints_it_runs(tmp_path, monkeypatch, engine_config,
                                                      model, weights, impl):
    checkpoint = _fp8_checkpoint(tmp_path, monkeypatch, model, weights, impl)
    config = engine_config(checkpoint.path, dtype="float16")
    assert config.model_config.quantization in ("fp8", "compressed-tensors")
