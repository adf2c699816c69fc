"""Tensor parallelism of the serving loop (kv heads split over a "tp" mesh): the tiny
preset on two fake CPU devices gives tp=1's tokens and the dense reference's (with async
scheduling too), each device's custom calls see half the kv heads with no gather of a
cache, and the caches stay sharded and donated from step to step. The fake devices need a
fresh process (the device count is fixed when JAX starts); the option's errors are checked
here, on one device."""

from __future__ import annotations

import textwrap

import pytest

from serving_engine import run_on_two_cpu_devices
from xla_kernels import cli
from xla_kernels.serving.config import EngineConfig, ModelConfig, ServingConfigError, preset
from xla_kernels.serving.tp import check_tp, place, weight_spec

PRELUDE = textwrap.dedent("""
    import re
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from xla_kernels.serving.batch import empty_batch
    from xla_kernels.serving.bench import make_requests
    from xla_kernels.serving.config import EngineConfig, Workload, preset
    from xla_kernels.serving.engine import Engine
    from xla_kernels.serving.weights import init_weights
    from serving_engine import fresh, make_runner, reference_tokens

    TINY = preset("tiny")
    ENGINE = EngineConfig(block_size=16, num_blocks=24, max_num_seqs=3, max_model_len=64,
                          token_budget=32)
    WEIGHTS = init_weights(TINY, seed=0)

    def runner(frontend, tp):
        return make_runner(frontend, TINY, WEIGHTS, ENGINE, "xla-kernels", tp)

    def jax_caches(r):
        if r.frontend == "jax":
            return r.caches
        from torchax import interop
        return interop.jax_view(r.caches)
""")

CASES = {
    "tp2_tokens_equal_tp1_and_the_dense_reference": """
        requests = make_requests(Workload(requests=6, prompt_len=24, new_tokens=10,
                                          prompt_spread=0.8, output_spread=0.7,
                                          arrival_every=2), TINY.vocab_size, seed=1)
        ref = reference_tokens(TINY, WEIGHTS, requests)
        for frontend in ("jax", "torchax"):
            one = Engine(runner(frontend, 1), ENGINE).run(fresh(requests))
            two = Engine(runner(frontend, 2), ENGINE).run(fresh(requests))
            overlapped = Engine(runner(frontend, 2), ENGINE,
                                async_scheduling=True).run(fresh(requests))
            assert one == two == overlapped == ref, (frontend, one, two, overlapped, ref)
    """,
    "each_device_runs_the_custom_calls_on_half_the_kv_heads_with_no_cache_gather": """
        for frontend in ("jax", "torchax"):
            text = runner(frontend, 2).lower(
                empty_batch(16, 3, ENGINE.max_blocks_per_seq)).compile().as_text()
            local = "f32[24,16,%d,64]" % (TINY.num_kv_heads // 2)   # [blocks, 16, kv/2, d]
            for target in ("reshape_and_cache", "ragged_paged_attention"):
                lines = [l for l in text.splitlines()
                         if f'custom_call_target="xla_kernels.{target}"' in l]
                assert len(lines) == TINY.num_layers, (frontend, target, len(lines))
                assert all(local in l for l in lines), lines[0]
            attention = [l for l in text.splitlines()
                         if 'target="xla_kernels.ragged_paged_attention"' in l]
            assert all("(f32[16,%d,64]" % (TINY.num_q_heads // 2) in l for l in attention)
            assert not re.findall(r"all-gather|all-to-all|collective-permute", text)
            # one all-reduce of the hidden states after o_proj and one after down_proj
            reduces = re.findall(r"= f32\\[16,128\\]\\{1,0\\} all-reduce\\(", text)
            assert len(reduces) == 2 * TINY.num_layers, (frontend, len(reduces))
    """,
    "the_caches_stay_sharded_and_donated_step_to_step": """
        for frontend in ("jax", "torchax"):
            r = runner(frontend, 2)
            batch = empty_batch(16, 3, ENGINE.max_blocks_per_seq)
            lowered = r.lower(batch)
            assert lowered.as_text().count("tf.aliasing_output") == 2 * TINY.num_layers
            compiled = lowered.compile()
            aliases = re.search(r"input_output_alias=\\{(.*?)\\}, entry", compiled.as_text())
            assert aliases.group(1).count("may-alias") == 2 * TINY.num_layers
            spec = P(None, None, "tp", None)
            outs = compiled.output_shardings[1]
            assert all(s.spec == spec for pair in outs for s in pair), outs
            for _ in range(3):
                before = jax_caches(r)
                r.step(batch)
                after = jax_caches(r)
                for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
                    assert old.is_deleted(), "a cache was not donated"
                    assert new.sharding == old.sharding and new.sharding.spec == spec
                    assert len(new.addressable_shards) == 2
                    assert new.addressable_shards[0].data.shape == (24, 16, 1, 64)
            assert r.compiled_buckets() == 1
    """,
    "serve_bench_tp2_matches_the_reference": """
        import json, tempfile
        from xla_kernels import cli
        out = tempfile.mkdtemp() + "/tp.json"
        assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--tp", "2",
                         "--requests", "3", "--no-progress", "--json", out]) == 0
        result = json.load(open(out))
        assert result["matches_reference"] is True and result["config"]["tp"] == 2
        assert result["breakdown"]["attention_ms"] > 0
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tensor_parallel_serving_on_two_fake_devices(case):
    proc = run_on_two_cpu_devices(PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('ok')\n")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


# The option's errors and the placement rules (one device) ------------------------------


@pytest.mark.parametrize("tp, message", [
    (0, "--tp 0: must be >= 1. Fix: pass --tp 1 or more."),
    (4, "--tp 4 does not divide the 2 kv heads of model 'tiny'. Fix: pass --tp 1 or 2."),
    (2, "--tp 2 needs 2 devices, JAX sees 1 on this platform. Fix: pass --tp 1 or less, or "
        "run where 2 GPUs are visible (on the CPU, "
        "XLA_FLAGS=--xla_force_host_platform_device_count=2 fakes them)."),
])
def test_check_tp_names_the_fix(tp, message):
    with pytest.raises(ServingConfigError) as info:
        check_tp(preset("tiny"), tp, ["cpu0"])
    assert str(info.value) == message


def test_check_tp_refuses_an_intermediate_size_it_does_not_divide():
    odd = ModelConfig("odd", vocab_size=64, hidden_size=64, intermediate_size=66,
                      num_layers=1, num_q_heads=4, num_kv_heads=4, head_dim=64)
    with pytest.raises(ServingConfigError, match=r"^--tp 4 does not divide the intermediate "
                                                 r"size 66 of model 'odd'. Fix: pass --tp 1 "
                                                 r"or 2.$"):
        check_tp(odd, 4, ["d"] * 4)


def test_a_runner_refuses_more_devices_than_visible():
    import jax

    from xla_kernels.serving.weights import init_weights

    tiny = preset("tiny")
    with pytest.raises(ServingConfigError, match="--tp 2 needs 2 devices"):
        place(tiny, EngineConfig(num_blocks=4), init_weights(tiny), 2, jax.devices("cpu")[:1])


def test_megatron_specs():
    from jax.sharding import PartitionSpec as P

    column = [f"layers.3.{m}.weight" for m in ("self_attn.q_proj", "self_attn.k_proj",
                                               "self_attn.v_proj", "mlp.gate_proj",
                                               "mlp.up_proj")]
    assert {weight_spec(n) for n in column} == {P("tp", None)}
    row = ["layers.0.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight"]
    assert {weight_spec(n) for n in row} == {P(None, "tp")}
    rest = ["embed_tokens.weight", "lm_head.weight", "norm.weight",
            "layers.0.input_layernorm.weight"]
    assert {weight_spec(n) for n in rest} == {P()}


def test_serve_bench_tp_errors_are_one_line(capsys):
    assert cli.main(["serve-bench", "--platform", "cpu", "--tp", "3"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "xla-kernels serve-bench: error: --tp 3 does not divide the 2 kv heads of model "
        "'tiny'. Fix: pass --tp 1 or 2."]
