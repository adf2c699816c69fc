"""Sharding rules under operands that arrive split differently: the op's result is the
unsharded result (XLA reshards the operands to one split the rule allows), and a rule that
does not fit the call is an error at lowering naming the op and the array. Programs run in
fresh processes with fake CPU devices (the device count is fixed when JAX starts); the rule
checks run here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xla_kernels.errors import OpDeclarationError
from xla_kernels.frontends.jax_partitioning import bind_rule, factor_axes, term_spec

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")

PRELUDE = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import xla_kernels as xk

    def put(x, mesh, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))
""")

CASES = {
    "simple_add_of_a_split_and_a_replicated_operand": """
        from xla_kernels.kernels.simple_add import simple_add
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
        x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
        got = jax.jit(simple_add)(put(x, mesh, P("a", "b")), put(x, mesh, P()))
        assert np.array_equal(np.asarray(got), x + x)
    """,
    "paged_attention_with_queries_split_over_sequences_and_replicated_tables": """
        from xla_kernels.kernels.paged_attention import paged_attention, paged_attention_numpy_f64
        from xla_kernels.kernels.paged_attention.testing import make_inputs
        x = make_inputs(np.random.default_rng(1), num_seqs=4, num_q_heads=8, num_kv_heads=4,
                        head_dim=64, block_size=16, dtype="f32", poison=False)
        mesh = Mesh(np.array(jax.devices()), ("dp",))
        args = [put(x["query"], mesh, P("dp")), put(x["key_cache"], mesh, P()),
                put(x["value_cache"], mesh, P()), put(x["block_tables"], mesh, P()),
                put(x["seq_lens"], mesh, P())]
        got = jax.jit(lambda *a: paged_attention(*a, scale=0.125))(*args)
        want = paged_attention_numpy_f64(*x.values(), scale=0.125)
        assert np.abs(np.asarray(got, np.float64) - want).max() < 1e-5
    """,
    "a_readme_style_user_op_with_operands_split_along_different_dimensions": """
        from xla_kernels.kernels.simple_add import simple_add
        add = xk.Op("xk_tests.readme_add", inputs=[xk.Tensor("a", ("f32",)),
                                                   xk.Tensor("b", ("f32",))],
                    outputs=lambda a, b: xk.like(a), kernels={"cpu": simple_add.kernels["cpu"]},
                    sharding_rule="..., ... -> ...")
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
        x = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
        y = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
        for sx, sy in [(P(None, "a"), P("a")), (P("a"), P("b")), (P(("a", "b")), P("b"))]:
            got = jax.jit(add)(put(x, mesh, sx), put(y, mesh, sy))
            assert np.array_equal(np.asarray(got), x + y), (sx, sy)
    """,
    "a_factor_of_two_sizes_is_an_error_at_lowering_naming_op_and_argument": """
        from xla_kernels.kernels.simple_add import simple_add
        op = xk.Op("xk_tests.sizes", inputs=[xk.Tensor("a", ("f32",)), xk.Tensor("b", ("f32",))],
                   outputs=lambda a, b: xk.like(a), kernels={"cpu": simple_add.kernels["cpu"]},
                   sharding_rule="i, i -> i")
        mesh = Mesh(np.array(jax.devices()), ("x",))
        try:
            jax.jit(op).lower(put(np.ones(8, np.float32), mesh, P("x")), np.ones(6, np.float32))
        except xk.OpDeclarationError as e:
            assert str(e) == ("xk_tests.sizes: argument 'b': factor 'i' has size 6 here and 8 "
                              "in argument 'a'. Fix: pass arrays whose dimensions of one factor "
                              "have one length, or give them different factors in the rule."), e
        else:
            raise AssertionError("no error")
    """,
}


def _run(script: str, env: dict[str, str] | None = None, timeout: int = 300
         ) -> subprocess.CompletedProcess:
    return subprocess.run(script, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": SRC, "JAX_PLATFORMS": "cpu",
                               **(env or {})})


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixed_shardings(case):
    script = PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('ok')\n"
    proc = _run([sys.executable, "-c", script])
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


def test_any_operand_shardings_give_the_unsharded_result():
    """tests/sharding_properties.py (hypothesis) on 8 fake CPU devices."""
    proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 str(TESTS / "sharding_properties.py")],
                {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def _bind(text, inputs, outputs, options=None):
    return bind_rule("xk_tests.op", text, options or {}, inputs, outputs)


@pytest.mark.parametrize(("text", "inputs", "outputs", "message"), [
    ("i j -> i j", [("a", (4, 4)), ("b", (4, 4))], [("out", (4, 4))],
     "xk_tests.op: argument 'b': its sharding rule 'i j -> i j' has 1 input term for 2 inputs "
     "(a, b). Fix: give one term per input, in order."),
    ("i, i -> i, i", [("a", (4,)), ("b", (4,))], [("out", (4,))],
     "xk_tests.op: its sharding rule 'i, i -> i, i' has 2 output terms for 1 output (out). "
     "Fix: give one term per output, in order."),
    ("i j, j -> i", [("a", (4, 8)), ("w", (6,))], [("out", (4,))],
     "xk_tests.op: argument 'w': factor 'j' has size 6 here and 8 in argument 'a'. Fix: pass "
     "arrays whose dimensions of one factor have one length, or give them different factors "
     "in the rule."),
    ("... i, ... i -> ... i", [("a", (2, 4)), ("b", (2, 3, 4))], [("out", (2, 4))],
     "xk_tests.op: argument 'b': '...' stands for 2 dimensions here (shape (2, 3, 4)) and 1 "
     "dimension in argument 'a'. Fix: pass arrays with as many leading dimensions, or "
     "broadcast them first."),
    ("(k g) d -> (k g) d", [("q", (8, 4))], [("out", (8, 4))],
     "xk_tests.op: argument 'q': the sizes of compound factor (k g) are unknown. Fix: give "
     "all but one of its factors' sizes in the rule's options, or use them alone in another "
     "dimension."),
    ("i j -> i", [("a", (4, 4))], [("out", (4, 4))],
     "xk_tests.op: result 'out': sharding rule term 'i' names 1 dimension, the array has 2 "
     "(shape (4, 4)). Fix: give one factor per dimension, or a leading '...' for the leading "
     "ones."),
])
def test_a_rule_that_does_not_fit_names_op_and_array(text, inputs, outputs, message):
    with pytest.raises(OpDeclarationError) as e:
        _bind(text, inputs, outputs)
    assert str(e.value) == message


def test_every_array_of_a_factor_gets_its_axes_from_the_result():
    rule = _bind("..., ... -> ...", [("a", (8, 6)), ("b", (8, 6))], [("out", (8, 6))])
    axes = factor_axes(rule, [("x", None)], {"x": 2, "y": 2})
    assert [tuple(term_spec(d, (8, 6), axes)) for d in rule.inputs] == [("x", None)] * 2


def test_input_only_and_need_replication_factors_stay_whole():
    rule = _bind("i j, j -> i", [("a", (8, 6)), ("w", (6,))], [("out", (8,))],
                 {"need_replication_factors": ("i",)})
    assert not rule.splittable  # j is contracted, i must be whole
    assert factor_axes(rule, [("x",)], {"x": 2}) == {}


def test_a_broadcast_dimension_of_length_one_stays_whole():
    rule = _bind("i j, i j -> i j", [("a", (8, 6)), ("b", (1, 6))], [("out", (8, 6))])
    axes = factor_axes(rule, [("x", "y")], {"x": 2, "y": 3})
    assert tuple(term_spec(rule.inputs[1], (1, 6), axes)) == (None, "y")


def test_axes_that_do_not_divide_a_factor_are_dropped():
    rule = _bind("i -> i", [("a", (6,))], [("out", (6,))])
    assert factor_axes(rule, [(("x", "y"),)], {"x": 2, "y": 2}) == {"i": ("x",)}


def test_a_minor_factor_is_split_only_under_a_fully_split_major_one():
    rule = _bind("(k g) d, k d -> (k g) d", [("q", (8, 4)), ("c", (4, 4))], [("out", (8, 4))],
                 {"g": 2})
    # k (4) takes x and y; g gets z only because k is then one element per device.
    assert factor_axes(rule, [(("x", "y", "z"),)], {"x": 2, "y": 2, "z": 2}) == {
        "k": ("x", "y"), "g": ("z",)}
    assert factor_axes(rule, [(("x", "z"),)], {"x": 2, "z": 4}) == {"k": ("x",)}


def test_caches_updated_in_place_keep_their_results_sharding():
    from xla_kernels.kernels.kv_cache import reshape_and_cache
    from xla_kernels.op import Spec

    specs = [Spec((5, 4, 64), "f32")] * 2 + [Spec((6, 16, 4, 64), "f32")] * 2 + [
        Spec((5,), "i32")]
    text, options = reshape_and_cache.sharding_rule(reshape_and_cache.bind(specs, {}))
    rule = _bind(text, [(f"in{i}", s.shape) for i, s in enumerate(specs)],
                 [("key_cache", specs[2].shape), ("value_cache", specs[3].shape)], options)
    # The results disagree (kv heads over x, over y): the first decides for both.
    axes = factor_axes(rule, [(None, None, "x"), (None, None, "y")], {"x": 2, "y": 2})
    caches = [term_spec(d, (6, 16, 4, 64), axes) for d in rule.inputs[2:4] + rule.outputs]
    assert [tuple(s) for s in caches] == [(None, None, "x", None)] * 4


def test_a_compound_factor_that_cannot_span_its_dimension_names_the_array():
    with pytest.raises(OpDeclarationError) as e:
        _bind("(k g) d, k d -> (k g) d", [("q", (8, 4)), ("c", (3, 4))], [("out", (8, 4))])
    assert str(e.value) == (
        "xk_tests.op: argument 'q': compound factor (k g) cannot span a dimension of 8: its "
        "known factors make 3. Fix: give factor sizes whose product is the dimension.")
