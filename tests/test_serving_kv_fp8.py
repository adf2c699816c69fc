"""serve-bench's fp8 KV cache (``--kv-cache-dtype fp8``): e4m3 caches written by both cache
writes and read by both attentions; the paged engine matches the dense reference token for
token when the reference rounds its K/V through e4m3 the same way (both frontends, both
implementations, with fp8 weights, async scheduling, tensor parallel on two fake CPU
devices); the JSON records the cache dtype and the bytes a decode step reads of it; a bad
value is refused with the fix.

The match is exact, not within a logits bound: the tiny preset is float32, whose queries
the paged step casts to bfloat16 for attention over an fp8 cache (the op takes 16-bit
queries) and the reference casts the same way, and every e4m3 value is exact in bf16 and
f32, so what is left between the two is the order of f32 sums, as without fp8."""

from __future__ import annotations

import json
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
from xla_kernels.kernels.kv_cache import quantize_fp8_xla, reshape_and_cache
from xla_kernels.kernels.paged_cache import quantize_fp8
from xla_kernels.serving.attention import as_cached, attention_queries
from xla_kernels.serving.batch import empty_batch
from xla_kernels.serving.bench import kv_cache_bytes, make_requests
from xla_kernels.serving.config import ServingConfigError, preset
from xla_kernels.serving.engine import Engine
from xla_kernels.serving.weights import init_weights

TINY = preset("tiny")
FP8_KV = TINY.with_kv_cache("fp8")
E4M3 = "float8_e4m3fn"


@pytest.fixture(scope="module")
def requests():
    return make_requests(SMALL_WORKLOAD, TINY.vocab_size, seed=2)


@pytest.fixture(scope="module")
def weights(cpu):
    return init_weights(TINY, seed=0)


@pytest.fixture(scope="module")
def reference(weights, requests):
    return reference_tokens(FP8_KV, weights, requests)


# The rounding the reference models -------------------------------------------------------


def test_the_jax_quantizer_is_the_numpy_one_bit_for_bit():
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 30
    x[:6] = [0.0, -0.0, 500.0, -1e6, 2.0**-10, np.inf]            # saturated, subnormal
    got = np.asarray(quantize_fp8_xla(x, 1.0)).view(np.uint8)
    assert np.array_equal(got, quantize_fp8(x, 1.0).view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_as_cached_is_what_the_cache_write_stores(dtype, cpu):
    rows = jnp.asarray(np.random.default_rng(1).standard_normal((5, 2, 64)) * 4, dtype)
    cache = jnp.zeros((2, 16, 2, 64), E4M3)
    key_cache, _ = reshape_and_cache(rows, rows, cache, cache, jnp.arange(5, dtype=jnp.int32))
    stored = np.asarray(key_cache.reshape(-1, 2, 64)[:5].astype(jnp.float32))
    rounded = as_cached(rows, E4M3)
    assert rounded.dtype == rows.dtype
    assert np.array_equal(np.asarray(rounded.astype(jnp.float32)), stored)
    assert not np.array_equal(stored, np.asarray(rows.astype(jnp.float32)))
    assert as_cached(rows, dtype) is rows                        # an "auto" cache: no rounding


def test_attention_takes_16_bit_queries_over_an_fp8_cache():
    q = jnp.ones((2, 4, 64), jnp.float32)
    assert attention_queries(q, E4M3).dtype == jnp.bfloat16
    assert attention_queries(q.astype(jnp.float16), E4M3).dtype == jnp.float16
    assert attention_queries(q, "float32") is q


# The engine against the reference --------------------------------------------------------


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
@pytest.mark.parametrize("attention", ["xla-kernels", "plain-xla"])
def test_fp8_cache_engine_matches_the_reference_on_the_same_rounding(
        frontend, attention, cpu, weights, requests, reference):
    runner = make_runner(frontend, FP8_KV, weights, SMALL_ENGINE, attention)
    # a jax dtype, or torch.float8_e4m3fn for the torchax runner's tensors
    assert all(str(c.dtype).endswith(E4M3) for pair in runner.caches for c in pair)
    outputs, _ = run_engine(runner, requests, SMALL_ENGINE, shuffle_seed=5)
    assert outputs == reference


def test_the_fp8_cache_changes_the_reference(cpu, weights, requests, reference):
    """Else the tests above would pass with the rounding left out of either side."""
    assert reference != reference_tokens(TINY, weights, requests)


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_fp8_weights_and_fp8_cache_with_async_scheduling_match_the_reference(
        frontend, cpu, requests):
    config = FP8_KV.with_weights("fp8")
    weights = init_weights(config, seed=0)
    runner = make_runner(frontend, config, weights, SMALL_ENGINE, "xla-kernels")
    outputs = Engine(runner, SMALL_ENGINE, async_scheduling=True).run(fresh(requests))
    assert outputs == reference_tokens(config, weights, requests)


@pytest.mark.parametrize("frontend", ["jax", "torchax"])
def test_the_ops_read_and_write_the_e4m3_caches_with_bf16_queries(frontend, cpu, weights):
    batch = empty_batch(16, SMALL_ENGINE.max_num_seqs, SMALL_ENGINE.max_blocks_per_seq)
    runner = make_runner(frontend, FP8_KV, weights, SMALL_ENGINE, "xla-kernels")
    text = runner.lower(batch).as_text()
    writes = [line for line in text.splitlines() if "@xla_kernels.reshape_and_cache(" in line]
    reads = [line for line in text.splitlines()
             if "@xla_kernels.ragged_paged_attention(" in line]
    assert len(writes) == len(reads) == TINY.num_layers
    assert all("tensor<24x16x2x64xf8E4M3FN>" in line for line in writes + reads)
    assert all("(tensor<16x4x64xbf16>" in line for line in reads)
    assert text.count("tf.aliasing_output") == 2 * TINY.num_layers  # still in place
    plain = make_runner(frontend, FP8_KV, weights, SMALL_ENGINE, "plain-xla").lower(batch).as_text()
    assert "@xla_kernels.reshape_and_cache" not in plain and "xf8E4M3FN>" in plain


# Tensor parallel: two fake CPU devices (a fresh process) ---------------------------------

TP_SCRIPT = textwrap.dedent("""
    from xla_kernels.serving.bench import make_requests
    from xla_kernels.serving.config import preset
    from xla_kernels.serving.engine import Engine
    from xla_kernels.serving.weights import init_weights
    from serving_engine import (SMALL_ENGINE, SMALL_WORKLOAD, fresh, make_runner,
                                reference_tokens)

    requests = make_requests(SMALL_WORKLOAD, 512, seed=2)
    for weights in ("model", "fp8"):
        config = preset("tiny").with_kv_cache("fp8").with_weights(weights)
        params = init_weights(config, seed=0)
        ref = reference_tokens(config, params, requests)
        for frontend in ("jax", "torchax"):
            for attention in ("xla-kernels", "plain-xla"):
                runner = make_runner(frontend, config, params, SMALL_ENGINE, attention, 2)
                cache = runner.caches[0][0]
                cache = getattr(cache, "_elem", cache)        # torchax: the jax array
                assert str(cache.dtype) == "float8_e4m3fn", cache.dtype
                assert len(cache.sharding.device_set) == 2, cache.sharding
                two = Engine(runner, SMALL_ENGINE).run(fresh(requests))
                assert two == ref, (weights, frontend, attention, two, ref)
    print("ok")
""")


def test_fp8_cache_tensor_parallel_matches_the_reference():
    proc = run_on_two_cpu_devices(TP_SCRIPT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


# serve-bench ------------------------------------------------------------------------------


def test_kv_cache_bytes_per_token_and_per_decode_step():
    assert FP8_KV.kv_bytes_per_token() == 2 * 2 * 2 * 64          # K and V, layers, heads, dim
    assert TINY.kv_bytes_per_token() == 4 * FP8_KV.kv_bytes_per_token()
    assert preset("8b").with_dtype("bfloat16").kv_bytes_per_token() == 128 * 2**10
    assert kv_cache_bytes(FP8_KV, 1, [])["decode_bytes_read_per_step"] is None


def test_serve_bench_fp8_weights_and_cache_match_and_record_the_kv_bytes(tmp_path: Path, capsys):
    out = tmp_path / "kvfp8.json"
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--requests", "3",
                     "--dtype", "bfloat16", "--weights", "fp8", "--kv-cache-dtype", "fp8",
                     "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["matches_reference"] is True                    # the float32 check
    assert result["reference_check"]["dtype"] == "float32"
    assert result["config"]["kv_cache_dtype"] == "fp8" and result["config"]["weights"] == "fp8"
    kv = result["kv_cache"]
    assert kv["kv_cache_dtype"] == "fp8" and kv["dtype"] == E4M3
    assert kv["bytes_per_token"] == kv["per_device"] == 512
    decode = sorted(s["context_tokens"] for s in result["steps"] if s["kind"] == "decode")
    assert kv["decode_bytes_read_per_step"] == round(np.median(decode) * 512)
    breakdown = result["breakdown"]
    assert breakdown["attention_ms"] > 0                          # the replay's fp8 caches
    assert breakdown["replayed_kv_bytes_read"] == 512 * breakdown["replayed_num_seqs"] \
        * breakdown["replayed_context_per_seq"]
    printed = capsys.readouterr().out
    assert "tiny bfloat16 fp8 weights fp8 KV cache, jax" in printed
    assert "per decode step (median; float8_e4m3fn, 0.5 KiB per token)" in printed


def test_the_default_cache_is_the_models_dtype(tmp_path: Path):
    out = tmp_path / "auto.json"
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--requests", "2",
                     "--no-breakdown", "--no-progress", "--no-reference",
                     "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["kv_cache_dtype"] == "auto"
    assert result["kv_cache"]["dtype"] == "float32"
    assert result["kv_cache"]["bytes_per_token"] == 4 * 512


def test_check_memory_counts_one_byte_per_fp8_element(capsys):
    def refused(kv: str) -> str:
        assert cli.main(["serve-bench", "--platform", "cpu", "--kv-cache-dtype", kv,
                         "--num-blocks", str(10**12)]) == 1
        return capsys.readouterr().err

    assert "the caches take 30517578.1 GiB" in refused("auto")     # float32: 4 bytes
    assert "the caches take 7629394.5 GiB" in refused("fp8")


def test_a_bad_kv_cache_dtype_is_a_one_line_error_with_the_fix(capsys):
    assert cli.main(["serve-bench", "--platform", "cpu", "--kv-cache-dtype", "int8"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["xla-kernels serve-bench: error: unknown --kv-cache-dtype 'int8'. Fix: pass "
                   "--kv-cache-dtype auto or fp8."]


def test_the_library_refuses_a_bad_kv_cache_dtype_too():
    with pytest.raises(ServingConfigError, match="Fix: pass --kv-cache-dtype auto or fp8"):
        TINY.with_kv_cache("fp8_e5m2")

