"""The op model beyond "arrays in, arrays out": ops with no array inputs, ops with side
effects, inputs updated in place, and gradients an op does not declare."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels.frontends.torch import schema, torch_op
from xla_kernels.kernels.simple_add import simple_add

SOURCE = "fixtures/op_model/op_model.cc"

ramp = xk.Op("xk_tests.ramp", inputs=[], attrs=[xk.Attr("n", int)],
             outputs=lambda *, n: xk.Spec((n,), "f32"),
             kernels={"cpu": xk.Kernel([SOURCE], "XkTestRamp")})

tally = xk.Op("xk_tests.tally", inputs=[], attrs=[xk.Attr("slot", int)],
              outputs=lambda *, slot: xk.Spec((), "i32"), has_side_effect=True,
              kernels={"cpu": xk.Kernel([SOURCE], "XkTestTally")})

scale_in_place = xk.Op(
    "xk_tests.scale_in_place", inputs=[xk.Tensor("x", ("f32",), in_place=True)],
    attrs=[xk.Attr("factor", float)], outputs=lambda x, *, factor: xk.updated(x),
    kernels={"cpu": xk.Kernel([SOURCE], "XkTestScaleInPlace")})

_slots = iter(range(1000, 100000))


# ------------------------------------------------------------------ no array inputs

def test_an_op_without_inputs_runs_in_jax_eagerly_and_under_jit():
    np.testing.assert_array_equal(ramp(n=4), [0, 1, 2, 3])
    np.testing.assert_array_equal(jax.jit(lambda: ramp(n=3) + 1)(), [1, 2, 3])


def test_an_op_without_inputs_is_one_custom_call():
    xk.assert_single_custom_call(xk.hlo_text(lambda: ramp(n=5)), "xk_tests.ramp")


def test_an_op_without_inputs_is_a_torch_op_with_a_device_keyword():
    assert schema(ramp) == "(*, Device? device=None, int? n=None) -> Tensor"
    out = torch_op(ramp)(n=3)
    assert out.device.type == "cpu" and out.tolist() == [0.0, 1.0, 2.0]
    assert torch_op(ramp)(n=2, device="cpu").tolist() == [0.0, 1.0]


# ------------------------------------------------------------------ side effects

def test_side_effect_calls_in_one_program_are_neither_merged_nor_reordered():
    slot = next(_slots)
    first, second = jax.jit(lambda: (tally(slot=slot), tally(slot=slot)))()
    assert (int(first), int(second)) == (0, 1)


def test_side_effect_call_with_an_unused_result_still_runs():
    slot = next(_slots)
    jax.jit(lambda x: (tally(slot=slot), x)[1])(jnp.ones(2))
    assert int(tally(slot=slot)) == 1


def test_side_effect_persists_across_compilations():
    slot = next(_slots)
    f = jax.jit(lambda: tally(slot=slot))
    assert [int(f()) for _ in range(3)] == [0, 1, 2]
    f.clear_cache()
    assert int(f()) == 3


def test_side_effect_is_in_the_hlo():
    text = xk.hlo_text(lambda: tally(slot=1))
    assert "custom_call_has_side_effect=true" in text or "has_side_effect=true" in text


def test_side_effect_op_counts_in_torch_eager():
    slot = next(_slots)
    op = torch_op(tally)
    assert [int(op(slot=slot)) for _ in range(3)] == [0, 1, 2]


# ------------------------------------------------------------------ updated in place

def test_jax_returns_the_updated_input_and_keeps_the_original_without_donation():
    x = jnp.arange(4.0, dtype=jnp.float32)
    np.testing.assert_array_equal(jax.jit(lambda v: scale_in_place(v, factor=3.0))(x),
                                  [0, 3, 6, 9])
    np.testing.assert_array_equal(x, [0, 1, 2, 3])  # XLA copied it: no donation


def test_jax_aliases_the_operand_and_copies_nothing_under_donation():
    f = jax.jit(lambda v: scale_in_place(v, factor=2.0), donate_argnums=0)
    x = jnp.arange(3.0, dtype=jnp.float32)
    compiled = f.lower(x).compile().as_text()
    assert "input_output_alias" in compiled
    assert " copy(" not in compiled and "copy-start" not in compiled
    np.testing.assert_array_equal(f(x), [0, 2, 4])
    assert "output_operand_aliases" in f.lower(jnp.ones(3)).as_text("hlo") or \
        "output_to_operand_aliasing" in f.lower(jnp.ones(3)).as_text("hlo")


def test_torch_mutates_the_tensor_and_returns_nothing():
    assert schema(scale_in_place) == "(Tensor(a!) x, *, float? factor=None) -> ()"
    t = torch.arange(4.0)
    assert torch_op(scale_in_place)(t, factor=2.0) is None
    assert t.tolist() == [0.0, 2.0, 4.0, 6.0]


def compile_in_place_checks() -> None:
    op = torch_op(scale_in_place)
    torch.library.opcheck(op, (torch.arange(3.0),), {"factor": 2.0})

    def f(t):
        op(t, factor=3.0)
        return t + 1

    t = torch.arange(3.0)
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(t)
    assert t.tolist() == [0.0, 3.0, 6.0] and out.tolist() == [1.0, 4.0, 7.0]


def test_torch_in_place_op_passes_opcheck_and_compiles():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("compile_in_place_checks", module="test_op_model")


def test_torch_in_place_needs_a_contiguous_tensor():
    t = torch.arange(8.0).reshape(2, 4)[:, :2]
    with pytest.raises(xk.OpInputError, match=r"xk_tests.scale_in_place: argument 'x': is "
                                              r"updated in place, but the tensor is not "
                                              r"contiguous. Fix: pass x.contiguous\(\)"):
        torch_op(scale_in_place)(t, factor=2.0)


def test_an_updated_output_must_be_declared_in_place():
    op = xk.Op("xk_tests.undeclared_update", inputs=[xk.Tensor("x", ("f32",))],
               outputs=lambda x: xk.updated(x),
               kernels={"cpu": xk.Kernel([SOURCE], "XkTestScaleInPlace")})
    with pytest.raises(xk.OpDeclarationError, match=r"updates 'x' in place, but the input is "
                                                    r"not declared so. Fix: declare "
                                                    r"Tensor\('x', ..., in_place=True\)"):
        op.bind([xk.Spec((2,), "f32")], {})


def test_an_in_place_input_must_be_returned():
    op = xk.Op("xk_tests.forgotten_update", inputs=[xk.Tensor("x", ("f32",), in_place=True)],
               outputs=lambda x: xk.like(x),
               kernels={"cpu": xk.Kernel([SOURCE], "XkTestScaleInPlace")})
    with pytest.raises(xk.OpDeclarationError, match=r"input 'x' is declared in_place, but the "
                                                    r"output rule does not return it"):
        op.bind([xk.Spec((2,), "f32")], {})


def torchax_env():
    from xla_kernels.frontends.torchax import import_torchax, register_torchax

    register_torchax(scale_in_place)
    return import_torchax().default_env()


def test_torchax_updates_the_tensor_and_a_view_in_place_and_returns_nothing():
    env = torchax_env()
    with env:
        t = torch.arange(4.0).to("jax")
        assert torch_op(scale_in_place)(t, factor=2.0) is None
        assert t.to("cpu").tolist() == [0.0, 2.0, 4.0, 6.0]
        base = torch.arange(8.0).reshape(2, 4).to("jax")
        torch_op(scale_in_place)(base[1], factor=3.0)        # a view writes through
        assert base.to("cpu").tolist() == [[0, 1, 2, 3], [12, 15, 18, 21]]


def test_torchax_under_donation_aliases_the_operand_and_copies_nothing():
    from torchax import interop

    torchax_env()

    def f(t):
        torch_op(scale_in_place)(t, factor=2.0)
        return t

    donated = jax.jit(interop.jax_view(f), donate_argnums=0)
    compiled = donated.lower(jnp.ones(3)).compile().as_text()
    assert "input_output_alias" in compiled
    assert " copy(" not in compiled and "copy-start" not in compiled
    np.testing.assert_array_equal(donated(jnp.arange(3.0)), [0, 2, 4])
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(jax.jit(interop.jax_view(f))(x), [0, 2, 4])
    np.testing.assert_array_equal(x, [0, 1, 2])           # no donation: XLA copied it


def functionalize_kernel_checks() -> None:
    """The Functionalize kernel register_torch_xla gives in-place ops, on CPU tensors."""
    from xla_kernels.frontends.torch_xla import _functionalize_kernel

    op = xk.Op("xk_tests.scale_in_place_functionalized",
               inputs=[xk.Tensor("x", ("f32",), in_place=True)],
               attrs=[xk.Attr("factor", float)], outputs=lambda x, *, factor: xk.updated(x),
               kernels={"cpu": xk.Kernel([SOURCE], "XkTestScaleInPlace")})
    packet = torch_op(op)

    def on_xla(*args, **kwargs):
        raise AssertionError("CPU tensors must not take the XLA branch")

    torch.library.impl(packet.default._schema.name, "Functionalize",
                       _functionalize_kernel(packet, on_xla))

    def f(t):
        packet(t, factor=3.0)
        return t + 1

    t = torch.arange(3.0)
    out = torch.func.functionalize(f)(t)
    assert t.tolist() == [0.0, 3.0, 6.0] and out.tolist() == [1.0, 4.0, 7.0]
    t = torch.arange(3.0)
    assert packet(t, factor=2.0) is None and t.tolist() == [0.0, 2.0, 4.0]   # eager


def test_the_torch_xla_functionalize_kernel_updates_cpu_tensors_like_functionalization():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("functionalize_kernel_checks", module="test_op_model")


# ------------------------------------------------------------------ gradients

def test_a_torch_gradient_through_an_op_without_backward_raises():
    x = torch.ones(3, requires_grad=True)
    y = torch_op(simple_add)(x, x)
    assert y.requires_grad
    with pytest.raises(RuntimeError, match=r"xla_kernels.simple_add: cannot be differentiated"):
        y.sum().backward()


def test_a_jax_gradient_through_an_op_without_backward_raises():
    with pytest.raises(TypeError, match=r"xla_kernels.simple_add: cannot be differentiated: "
                                        r"the op declares no backward. Fix: wrap the call in "
                                        r"jax.custom_vjp"):
        jax.grad(lambda x: simple_add(x, x).sum())(jnp.ones(3))
