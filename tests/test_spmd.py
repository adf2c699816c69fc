"""Sharding rules: under plain ``jax.jit`` with NamedSharding inputs, each op runs on its
shards with no all-gather of its operands where its rule allows, and gives the unsharded
answer everywhere (also where the rule cannot apply). Four fake CPU devices, in a fresh
process (the device count is fixed when JAX starts)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRELUDE = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import re
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def compiled(f, *args):
        return jax.jit(f).lower(*args).compile().as_text()

    def collectives(text):
        return re.findall(r"(all-gather|all-to-all|collective-permute)", text)

    def calls(text, target):
        return [l for l in text.splitlines() if f'custom_call_target="{target}"' in l]

    def put(x, mesh, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))
""")

CASES = {
    "elementwise_op_splits_along_any_axis": """
        from xla_kernels.kernels.simple_add import simple_add
        for n in (2, 4):
            mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
            a = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
            for spec in (P("x"), P(None, "x")):
                da = put(a, mesh, spec)
                text = compiled(simple_add, da, da)
                assert not collectives(text), collectives(text)
                (line,) = calls(text, "xla_kernels.simple_add")
                local = "f32[%d,12]" % (8 // n) if spec == P("x") else "f32[8,%d]" % (12 // n)
                assert local in line, line
                assert np.array_equal(np.asarray(jax.jit(simple_add)(da, da)), a + a)
    """,
    "paged_attention_splits_along_kv_heads": """
        from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
        from xla_kernels.kernels.paged_attention.testing import make_inputs
        rng = np.random.default_rng(1)
        for layout in ("vllm", "pallas"):
            x = make_inputs(rng, num_seqs=3, num_q_heads=8, num_kv_heads=4, head_dim=64,
                            block_size=16, dtype="f32", layout=layout, poison=False)
            f = lambda q, k, v, bt, sl: paged_attention(q, k, v, bt, sl, scale=0.125,
                                                        layout=layout)
            ref = paged_attention_numpy_f64(*x.values(), scale=0.125, layout=layout)
            for n in (2, 4):
                mesh = Mesh(np.array(jax.devices()[:n]), ("tp",))
                heads = P(None, None, "tp") if layout == "vllm" else P("tp")
                args = [put(x["query"], mesh, P(None, "tp")), put(x["key_cache"], mesh, heads),
                        put(x["value_cache"], mesh, heads), put(x["block_tables"], mesh, P()),
                        put(x["seq_lens"], mesh, P())]
                text = compiled(f, *args)
                assert not collectives(text), (layout, n, collectives(text))
                (line,) = calls(text, "xla_kernels.paged_attention")
                assert "f32[3,%d,64]" % (8 // n) in line, line
                out = jax.jit(f)(*args)
                assert np.abs(np.asarray(out, np.float64) - ref).max() < 1e-5
                assert out.sharding.spec[1] == "tp"
    """,
    "paged_attention_with_a_sharded_head_dim_is_still_right": """
        from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
        from xla_kernels.kernels.paged_attention.testing import make_inputs
        x = make_inputs(np.random.default_rng(2), num_seqs=2, num_q_heads=4, num_kv_heads=2,
                        head_dim=64, block_size=16, dtype="f32", poison=False)
        mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        args = [put(x["query"], mesh, P(None, None, "x")),
                put(x["key_cache"], mesh, P(None, None, None, "x")),
                put(x["value_cache"], mesh, P(None, None, None, "x")),
                put(x["block_tables"], mesh, P()), put(x["seq_lens"], mesh, P())]
        f = lambda *a: paged_attention(*a, scale=0.125)
        (line,) = calls(compiled(f, *args), "xla_kernels.paged_attention")
        assert "f32[2,4,64]" in line, line  # head_dim gathered: the kernel needs it whole
        ref = paged_attention_numpy_f64(*x.values(), scale=0.125)
        assert np.abs(np.asarray(jax.jit(f)(*args), np.float64) - ref).max() < 1e-5
    """,
    "ragged_paged_attention_splits_along_kv_heads": """
        from xla_kernels.kernels.ragged_paged_attention import (
            ragged_paged_attention, ragged_paged_attention_numpy_f64)
        from xla_kernels.kernels.ragged_paged_attention.testing import make_inputs
        x = make_inputs(np.random.default_rng(7), q_lens=[1, 5, 3], kv_lens=[9, 20, 3],
                        num_q_heads=8, num_kv_heads=4, head_dim=64, block_size=16,
                        dtype="f32", poison=False)
        f = lambda *a: ragged_paged_attention(*a, scale=0.125)
        ref = ragged_paged_attention_numpy_f64(*x.values(), scale=0.125)
        mesh = Mesh(np.array(jax.devices()[:4]), ("tp",))
        specs = {"queries": P(None, "tp"), "key_cache": P(None, None, "tp"),
                 "value_cache": P(None, None, "tp")}
        args = [put(v, mesh, specs.get(k, P())) for k, v in x.items()]
        text = compiled(f, *args)
        assert not collectives(text), collectives(text)
        (line,) = calls(text, "xla_kernels.ragged_paged_attention")
        assert ",2,64]" in line.split("custom-call(")[0], line
        assert np.abs(np.asarray(jax.jit(f)(*args), np.float64) - ref).max() < 1e-5
    """,
    "a_rule_that_does_not_fit_the_call_names_the_op_and_the_fix": """
        import xla_kernels as xk
        from xla_kernels.kernels.simple_add import simple_add
        bad = xk.Op("xk_tests.bad_rule", inputs=simple_add.inputs,
                    outputs=simple_add.output_rule, kernels=simple_add.kernels,
                    sharding_rule="i, i -> i")
        mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        a = put(np.ones((4, 4), np.float32), mesh, P("x"))
        try:
            jax.jit(bad).lower(a, a)
        except xk.OpDeclarationError as e:
            assert str(e) == ("xk_tests.bad_rule: argument 'a': sharding rule term 'i' names "
                              "1 dimension, the array has 2 (shape (4, 4)). Fix: give one "
                              "factor per dimension, or a leading '...' for the leading ones."), e
        else:
            raise AssertionError("no error")
    """,
    "reshape_and_cache_splits_along_kv_heads": """
        from xla_kernels.kernels.kv_cache import reshape_and_cache, reshape_and_cache_numpy
        rng = np.random.default_rng(3)
        key = rng.standard_normal((5, 4, 64)).astype(np.float32)
        cache = rng.standard_normal((6, 16, 4, 64)).astype(np.float32)
        slots = np.array([0, 17, -1, 95, 40], np.int32)
        want = reshape_and_cache_numpy(key, key, cache, cache, slots)
        mesh = Mesh(np.array(jax.devices()[:4]), ("tp",))
        args = [put(key, mesh, P(None, "tp")), put(key, mesh, P(None, "tp")),
                put(cache, mesh, P(None, None, "tp")), put(cache, mesh, P(None, None, "tp")),
                put(slots, mesh, P())]
        text = compiled(reshape_and_cache, *args)
        assert not collectives(text), collectives(text)
        (line,) = calls(text, "xla_kernels.reshape_and_cache")
        assert "f32[6,16,1,64]" in line, line
        got = jax.jit(reshape_and_cache)(*args)
        assert np.array_equal(np.asarray(got[0]), want[0])
        assert np.array_equal(np.asarray(got[1]), want[1])
    """,
    "rms_norm_with_a_sharded_hidden_dimension_is_still_right": """
        from xla_kernels.kernels.rms_norm import rms_norm, rms_norm_numpy_f64
        x = np.random.default_rng(5).standard_normal((2, 4, 32)).astype(np.float32)
        w = np.random.default_rng(6).standard_normal(32).astype(np.float32)
        mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        args = put(x, mesh, P(None, None, "x")), put(w, mesh, P("x"))
        assert "f32[2,4,32]" in calls(compiled(rms_norm, *args), "xla_kernels.rms_norm")[0]
        got = np.asarray(jax.jit(rms_norm)(*args))
        assert np.abs(got - rms_norm_numpy_f64(x, w)).max() < 1e-5
    """,
    "rms_norm_splits_along_tokens_and_its_gradient_too": """
        from xla_kernels.kernels.rms_norm import (rms_norm, rms_norm_bwd_numpy_f64,
                                                  rms_norm_numpy_f64)
        rng = np.random.default_rng(4)
        x = rng.standard_normal((8, 32)).astype(np.float32)
        w = rng.standard_normal(32).astype(np.float32)
        mesh = Mesh(np.array(jax.devices()), ("dp",))
        dx_, dw_ = put(x, mesh, P("dp")), put(w, mesh, P())
        text = compiled(rms_norm, dx_, dw_)
        assert not collectives(text), collectives(text)
        assert "f32[2,32]" in calls(text, "xla_kernels.rms_norm")[0]
        got = np.asarray(jax.jit(rms_norm)(dx_, dw_))
        assert np.abs(got - rms_norm_numpy_f64(x, w)).max() < 1e-5
        g = jax.jit(jax.grad(lambda x, w: rms_norm(x, w).sum(), (0, 1)))(dx_, dw_)
        want = rms_norm_bwd_numpy_f64(x, w, np.ones_like(x))
        assert np.abs(np.asarray(g[0]) - want[0]).max() < 1e-4
        assert np.abs(np.asarray(g[1]) - want[1]).max() < 1e-4
    """,
    "torchax_code_gets_the_same_rule_through_jax": """
        import torch
        from xla_kernels.frontends.torch import torch_op
        from xla_kernels.frontends.torchax import import_torchax, register_torchax
        from xla_kernels.kernels.rms_norm import rms_norm, rms_norm_numpy_f64
        torchax = import_torchax()
        from torchax import interop
        torch_op(rms_norm)
        register_torchax(rms_norm)
        with torchax.default_env():
            f = interop.jax_view(lambda x, w: torch.ops.xla_kernels.rms_norm(x, w, eps=1e-6))
        rng = np.random.default_rng(7)
        x = rng.standard_normal((8, 32)).astype(np.float32)
        w = rng.standard_normal(32).astype(np.float32)
        mesh = Mesh(np.array(jax.devices()), ("dp",))
        args = put(x, mesh, P("dp")), put(w, mesh, P())
        text = compiled(f, *args)
        assert not collectives(text), collectives(text)
        assert "f32[2,32]" in calls(text, "xla_kernels.rms_norm")[0]
        got = np.asarray(jax.jit(f)(*args))
        assert np.abs(got - rms_norm_numpy_f64(x, w, eps=1e-6)).max() < 1e-5
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_programs(case):
    script = PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('ok')\n"
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "PYTHONPATH": src})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
