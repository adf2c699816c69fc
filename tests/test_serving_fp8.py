"""fp8 weights in the serving loop (``serve-bench --weights fp8 / fp8-dynamic``): the engine
matches the dense reference on the same quantized weights (both frontends, both
implementations, tensor parallel on two fake CPU devices), the xla-kernels program calls
the ``fp8_linear`` custom call and the plain-XLA one does not, the fp8 model's logits are
near the unquantized model's by the e4m3 rounding of its projections, the JSON records
what a step reads, and bad combinations are refused with the fix."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from serving_engine import (
    SMALL_ENGINE,
    SMALL_WORKLOAD,
    fresh,
    make_runner,
    reference_tokens,
    run_engine,
    run_on_two_cpu_devices,
)
from xla_kernels import cli
from xla_kernels.kernels.fp8_weights import fp8_quantize
from xla_kernels.serving.attention import dense_attention
from xla_kernels.serving.backend import resolve_backend
from xla_kernels.serving.batch import empty_batch
from xla_kernels.serving.bench import make_requests
from xla_kernels.serving.config import (
    ServingConfigError,
    preset,
)
from xla_kernels.serving.engine import Engine
from xla_kernels.serving.model_jax import decoder
from xla_kernels.serving.quantize import PROJECTIONS, quantize_e4m3, weight_bytes
from xla_kernels.serving.tp import check_tp, weight_spec
from xla_kernels.serving.weights import cast_weights, init_weights, weight_shapes

TINY = preset("tiny")
FP8_CALL = "stablehlo.custom_call @xla_kernels.fp8_linear("


@pytest.fixture(scope="module")
def requests():
    return make_requests(SMALL_WORKLOAD, TINY.vocab_size, seed=2)


# Quantization at load --------------------------------------------------------------------


def test_quantize_e4m3_matches_the_numpy_quantizer():
    w = np.random.default_rng(0).standard_normal((96, 80)).astype(np.float32)
    w[3] = 0.0                                         # an all-zero channel
    q, s = quantize_e4m3(w)
    want_q, want_s = fp8_quantize(w, (0, 0))
    assert q.dtype == jnp.float8_e4m3fn and s.shape == (96, 1) and s.dtype == jnp.float32
    assert np.array_equal(np.asarray(q).view(np.uint8), want_q.view(np.uint8))
    np.testing.assert_allclose(np.asarray(s), want_s, rtol=2**-23, atol=0)


def test_fp8_weights_quantize_only_the_projections_of_the_same_model():
    model = init_weights(TINY, seed=0)
    fp8 = init_weights(TINY.with_weights("fp8"), seed=0)
    projections = [n for n in weight_shapes(TINY) if n.rsplit(".", 2)[-2] in PROJECTIONS]
    assert len(projections) == 7 * TINY.num_layers
    assert set(fp8) == set(model) | {n + "_scale" for n in projections}
    for name, value in model.items():
        if name in projections:
            assert fp8[name].dtype == jnp.float8_e4m3fn
            assert fp8[name + "_scale"].shape == (value.shape[0], 1)
            # The same model: its weights rounded to e4m3, at most half an e4m3 ulp
            # (2^-4 relative) for normal values, plus the subnormals' absolute step.
            back = np.asarray(fp8[name], np.float32) * np.asarray(fp8[name + "_scale"])
            bound = 2**-4 * np.abs(value) + 2**-10 * np.asarray(fp8[name + "_scale"])
            assert np.all(np.abs(back - np.asarray(value)) <= bound), name
        else:
            assert np.array_equal(fp8[name], value), name


def test_cast_weights_keeps_fp8_values_and_scales():
    fp8 = cast_weights(init_weights(TINY.with_dtype("bfloat16").with_weights("fp8")), "float32")
    assert fp8["layers.0.self_attn.q_proj.weight"].dtype == jnp.float8_e4m3fn
    assert fp8["layers.0.self_attn.q_proj.weight_scale"].dtype == jnp.float32
    assert fp8["lm_head.weight"].dtype == jnp.float32


def test_weight_bytes_counts_fp8_values_and_scales():
    for fmt, projection_bytes in (("model", 4), ("fp8", 1)):
        config = TINY.with_weights(fmt)
        read = weight_bytes(init_weights(config), config, tp=2)
        h, i, q, kv = 128, 256, 4 * 64, 2 * 64
        values = TINY.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * i)
        scales = 0 if fmt == "model" else 4 * TINY.num_layers * (q + 2 * kv + h + 2 * i + h)
        assert read["projection_bytes"] == values * projection_bytes + scales
        others = 4 * (TINY.vocab_size * h + (2 * TINY.num_layers + 1) * h)  # lm_head, norms
        assert read["bytes_read_per_step"] == read["projection_bytes"] + others
        # Split over 2 devices: the projections' values (and column-parallel scales).
        row_scales = 0 if fmt == "model" else 4 * TINY.num_layers * 2 * h
        assert read["per_device"] == (read["projection_bytes"] - row_scales) // 2 \
            + row_scales + others
        assert read["format"] == fmt


def test_row_parallel_scales_are_replicated_and_column_parallel_ones_split():
    from jax.sharding import PartitionSpec as P

    assert weight_spec("layers.1.self_attn.v_proj.weight_scale") == P("tp", None)
    assert weight_spec("layers.1.mlp.up_proj.weight_scale") == P("tp", None)
    assert weight_spec("layers.1.self_attn.o_proj.weight_scale") == P()
    assert weight_spec("layers.1.mlp.down_proj.weight") == P(None, "tp")


# The engine against the reference on the same quantized weights --------------------------


@pytest.mark.parametrize("frontend, attention, fmt", [
    ("jax", "xla-kernels", "fp8"), ("jax", "plain-xla", "fp8"),
    ("jax", "xla-kernels", "fp8-dynamic"), ("torchax", "xla-kernels", "fp8"),
    ("torchax", "xla-kernels", "fp8-dynamic"), ("torchax", "plain-xla", "fp8-dynamic")])
def test_fp8_engine_matches_the_dense_reference_on_the_same_weights(
        frontend, attention, fmt, cpu, requests):
    config = TINY.with_weights(fmt)
    weights = init_weights(config, seed=0)
    runner = make_runner(frontend, config, weights, SMALL_ENGINE, attention)
    outputs, _ = run_engine(runner, requests, SMALL_ENGINE, shuffle_seed=5)
    assert outputs == reference_tokens(config, weights, requests)


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_fp8_engine_with_async_scheduling_matches_the_reference(frontend, cpu, requests):
    config = TINY.with_weights("fp8")
    weights = init_weights(config, seed=0)
    runner = make_runner(frontend, config, weights, SMALL_ENGINE, "xla-kernels")
    outputs = Engine(runner, SMALL_ENGINE, async_scheduling=True).run(fresh(requests))
    assert outputs == reference_tokens(config, weights, requests)


@pytest.mark.parametrize("frontend, fmt, scheme", [
    ("jax", "fp8", "none"), ("torchax", "fp8", "none"), ("jax", "fp8-dynamic", "dynamic"),
    ("torchax", "fp8-dynamic", "dynamic")])
def test_the_kernel_program_calls_fp8_linear_and_the_plain_xla_one_does_not(
        frontend, fmt, scheme, cpu):
    config = TINY.with_weights(fmt)
    weights = init_weights(config, seed=0)
    batch = empty_batch(16, SMALL_ENGINE.max_num_seqs, SMALL_ENGINE.max_blocks_per_seq)
    kernel = make_runner(frontend, config, weights, SMALL_ENGINE, "xla-kernels").lower(batch)
    calls = [line for line in kernel.as_text().splitlines() if FP8_CALL in line]
    assert len(calls) == 7 * TINY.num_layers
    assert all(f'activation_scheme = "{scheme}"' in c and "xf8E4M3FN>" in c for c in calls)
    plain = make_runner(frontend, config, weights, SMALL_ENGINE, "plain-xla").lower(batch).as_text()
    assert "fp8_linear" not in plain and "xf8E4M3FN>" in plain


@pytest.mark.parametrize("fmt, gain", [("fp8", 1), ("fp8-dynamic", math.sqrt(2))])
def test_fp8_logits_are_near_the_unquantized_models(fmt, gain, cpu):
    """Each projection's weight carries a relative rounding error eps_p (Frobenius; at most
    2^-4 per element: e4m3 keeps 3 mantissa bits, rounded to nearest). To first order the
    errors of the 2 x 7 projections on the residual stream are independent and each passes
    with a gain of about 1 (RMSNorm before every block), so the logits' relative error is
    about sqrt(sum eps_p^2); fp8-dynamic rounds each projection's input to the same e4m3
    grid too, one more error of the same size per projection (sqrt(2) x). Below a quarter
    of one projection's error, the fp8 path would not be running."""
    model = TINY.with_dtype("bfloat16")
    weights = init_weights(model, seed=0)
    fp8 = init_weights(model.with_weights(fmt), seed=0)
    eps = []
    for name in (n for n in fp8 if n.endswith("_scale")):
        w = name.removesuffix("_scale")
        back = np.asarray(fp8[w], np.float32) * np.asarray(fp8[name])
        exact = np.asarray(weights[w], np.float32)
        eps.append(np.linalg.norm(back - exact) / np.linalg.norm(exact))
    assert len(eps) == 14 and max(eps) <= 2**-4
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, 48))[None]
    positions = jnp.arange(48)[None]

    def attention(_, q, k, v):
        return dense_attention(q, k, v, positions, positions)

    def logits(config, w):
        hidden = decoder(w, config, tokens, positions, attention, resolve_backend(config))
        return np.asarray((hidden @ w["lm_head.weight"].T).astype(jnp.float32), np.float64)

    want, got = logits(model, weights), logits(model.with_weights(fmt), fp8)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    bound = gain * math.sqrt(sum(e * e for e in eps))
    assert min(eps) / 4 < rel < bound, (rel, bound)


# Tensor parallel: two fake CPU devices (a fresh process) ---------------------------------

TP_SCRIPT = textwrap.dedent("""
    import re
    from xla_kernels.serving.batch import empty_batch
    from xla_kernels.serving.bench import make_requests
    from xla_kernels.serving.config import preset
    from xla_kernels.serving.engine import Engine
    from xla_kernels.serving.weights import init_weights
    from serving_engine import (SMALL_ENGINE, SMALL_WORKLOAD, fresh, make_runner,
                                reference_tokens)

    TINY = preset("tiny").with_weights("fp8")
    WEIGHTS = init_weights(TINY, seed=0)
    requests = make_requests(SMALL_WORKLOAD, TINY.vocab_size, seed=2)
    ref = reference_tokens(TINY, WEIGHTS, requests)
    for frontend in ("jax", "torchax"):
        for attention in ("xla-kernels", "plain-xla"):
            runner = make_runner(frontend, TINY, WEIGHTS, SMALL_ENGINE, attention, 2)
            two = Engine(runner, SMALL_ENGINE).run(fresh(requests))
            assert two == ref, (frontend, attention, two, ref)
        text = make_runner(frontend, TINY, WEIGHTS, SMALL_ENGINE, "xla-kernels", 2).lower(
            empty_batch(16, 3, SMALL_ENGINE.max_blocks_per_seq)).compile().as_text()
        calls = [l for l in text.splitlines()
                 if 'custom_call_target="xla_kernels.fp8_linear"' in l]
        assert len(calls) == 7 * TINY.num_layers, len(calls)
        # each device holds half of every projection: q [256, 128] -> f8e4m3fn[128,128],
        # o [128, 256] -> [128,128]; no weight is gathered
        assert all("f8e4m3fn[128,128]" in l or "f8e4m3fn[64,128]" in l for l in calls), calls
        assert not re.findall(r"all-gather|all-to-all|collective-permute", text)
        reduces = re.findall(r"= f32\\[16,128\\]\\{1,0\\} all-reduce\\(", text)
        assert len(reduces) == 2 * TINY.num_layers, (frontend, len(reduces))
    print("ok")
""")


def test_fp8_tensor_parallel_matches_the_reference_without_gathering_a_weight():
    proc = run_on_two_cpu_devices(TP_SCRIPT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


# serve-bench ------------------------------------------------------------------------------


def test_serve_bench_fp8_records_the_format_and_the_bytes_read(tmp_path: Path, capsys):
    out = tmp_path / "fp8.json"
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--requests", "3",
                     "--weights", "fp8", "--dtype", "bfloat16", "--no-breakdown",
                     "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["matches_reference"] is True
    assert result["reference_check"]["dtype"] == "float32"
    assert result["config"]["weights"] == "fp8" and result["weights"]["format"] == "fp8"
    config = TINY.with_dtype("bfloat16").with_weights("fp8")
    assert result["weights"] == weight_bytes(init_weights(config), config)
    printed = capsys.readouterr().out
    assert "tiny bfloat16 fp8 weights, jax" in printed and "MiB per step" in printed


def test_the_default_weights_are_the_models(tmp_path: Path, capsys):
    out = tmp_path / "model.json"
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--requests", "2",
                     "--no-breakdown", "--no-progress", "--no-reference",
                     "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["weights"] == "model"
    assert result["weights"]["projection_bytes"] == 4 * sum(
        math.prod(s) for n, s in weight_shapes(TINY).items()
        if n.rsplit(".", 2)[-2] in PROJECTIONS)


# Bad combinations ------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--weights", "int4"],
     "unknown --weights 'int4'. Fix: pass --weights model, fp8 or fp8-dynamic."),
    (["--preset", "tiny-moe", "--weights", "fp8"],
     "--weights fp8: model 'tiny-moe' is a mixture of experts, and serve-bench quantizes only "
     "dense decoders' projections (fp8 experts would need fused_moe_fp8). Fix: pass --weights "
     "model, or a dense preset (tiny, 1b or 8b)."),
    (["--tp", "2", "--weights", "fp8-dynamic"],
     "--tp 2 with --weights fp8-dynamic: o_proj and down_proj split along their input would "
     "quantize each device's slice of the activations with its own per-token scale, which "
     "the one-device reference does not model. Fix: pass --weights fp8 (weight-only) with "
     "--tp, or --tp 1."),
])
def test_bad_weight_options_are_one_line_errors_with_the_fix(argv, message, capsys):
    assert cli.main(["serve-bench", "--platform", "cpu", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"xla-kernels serve-bench: error: {message}"]


def test_a_moe_model_refuses_fp8_weights_in_the_library_too():
    with pytest.raises(ServingConfigError, match="--weights fp8-dynamic: model 'tiny-moe'"):
        preset("tiny-moe").with_weights("fp8-dynamic")


def test_check_tp_refuses_fp8_dynamic_over_two_devices():
    with pytest.raises(ServingConfigError, match="Fix: pass --weights fp8"):
        check_tp(TINY.with_weights("fp8-dynamic"), 2, ["cpu0", "cpu1"])
    assert check_tp(TINY.with_weights("fp8"), 2, ["cpu0", "cpu1"]) == 2

