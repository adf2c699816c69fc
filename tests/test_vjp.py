"""Vjp declarations that leave outputs without a gradient, and second-order gradients: a
gradient the declaration does not provide raises (JAX and torch), never comes back zero."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import xla_kernels as xk
from vjp_ops import (
    copy_bwd,
    copy_with_sign,
    powers_op,
    product,
    square_saving_any,
    square_saving_x,
)
from xla_kernels.frontends.torch import torch_op

X = np.linspace(-1.5, 1.5, 7)

RES_MESSAGE = (r"xk_tests.square_saving_x: output 'res': a gradient reached it, but it carries "
               r"none \(nondiff_outputs declares it non-differentiable\). Fix: differentiate a "
               r"loss that does not depend on 'res' \(use jax.lax.stop_gradient\(res\) where "
               r"only its value is needed\), or declare 'dres' in the Vjp's args")
SECOND_ORDER_MESSAGE = (r"xk_tests.powers_1_0: second-order gradients are unavailable: its "
                        r"backward op 'xk_tests.powers_bwd_1_0' declares no vjp. Fix: declare "
                        r"vjp=xk.Vjp\(...\) on xk_tests.powers_bwd_1_0 \(the backward of the "
                        r"backward\), or differentiate xk_tests.powers_1_0 once.")


def declare(name: str, vjp: xk.Vjp, *, output_names=("y", "res"), dtypes=("f32", "f32")):
    """A forward op with two outputs of the given dtypes, declared with ``vjp``."""
    return xk.Op(name, inputs=[xk.Tensor("x", ("f32",))],
                 outputs=lambda x: [xk.like(x, dtype=d) for d in dtypes],
                 output_names=output_names, vjp=vjp,
                 kernels={"cpu": xk.Kernel(["unused.cc"], "Unused")})


# ------------------------------------------------------------------ declaration

def test_a_vjp_that_omits_a_floating_outputs_cotangent_is_refused():
    # The example: a loss on res used to get zero gradients.
    with pytest.raises(xk.OpDeclarationError, match=(
            r"xk_tests.omits_dres: output 'res': the vjp takes no cotangent 'dres' for a "
            r"floating output, so a gradient through it would be dropped. Fix: add 'dres' "
            r"to the Vjp's args \(the backward then receives it\), or declare "
            r"Vjp\(..., nondiff_outputs=\('res',\)\) if it carries no gradient.")):
        declare("xk_tests.omits_dres", xk.Vjp(copy_bwd, args=("x", "dy"), grads=("x",)))


def test_an_integer_output_needs_no_cotangent_and_no_declaration():
    declare("xk_tests.int_res", xk.Vjp(copy_bwd, args=("x", "dy"), grads=("x",)),
            dtypes=("f32", "i32"))


def test_an_output_of_unknown_dtype_without_a_cotangent_is_refused():
    def reject(x):
        raise xk.Invalid("x", "never")

    with pytest.raises(xk.OpDeclarationError, match=(
            r"xk_tests.unprobed: output 'res': the vjp takes no cotangent 'dres' and the "
            r"shape rule rejected every probe input, so it may be a floating output whose "
            r"gradient would be dropped. Fix: add 'dres'")):
        xk.Op("xk_tests.unprobed", inputs=[xk.Tensor("x", ("f32",))], outputs=reject,
              output_names=("y", "res"), vjp=xk.Vjp(copy_bwd, args=("x", "dy"), grads=("x",)),
              kernels={"cpu": xk.Kernel(["unused.cc"], "Unused")})


def test_a_vjp_needs_output_names():
    with pytest.raises(xk.OpDeclarationError, match=(
            r"xk_tests.no_names: the op declares a vjp but no output_names. Fix: name each "
            r"visible output, e.g. output_names=\('y',\), so that the vjp can take its "
            r"cotangent 'dy'.")):
        declare("xk_tests.no_names", xk.Vjp(copy_bwd, args=("x",), grads=("x",)),
                output_names=None)


def test_nondiff_outputs_must_name_outputs():
    with pytest.raises(xk.OpDeclarationError, match=(
            r"xk_tests.bad_nondiff: output 'rez': nondiff_outputs names it, but it is not an "
            r"output \(output_names=\('y', 'res'\)\). Fix: list names from output_names.")):
        declare("xk_tests.bad_nondiff", xk.Vjp(copy_bwd, args=("x", "dy"), grads=("x",),
                                               nondiff_outputs=("rez",)))


def test_a_non_differentiable_output_cannot_take_a_cotangent():
    with pytest.raises(xk.OpDeclarationError, match=(
            r"xk_tests.both: output 'res': nondiff_outputs declares it non-differentiable, "
            r"but the vjp takes its cotangent 'dres'. Fix: drop 'dres' from args, or 'res' "
            r"from nondiff_outputs.")):
        declare("xk_tests.both", xk.Vjp(copy_bwd, args=("dy", "dres"), grads=("x",),
                                        nondiff_outputs=("res",)))


def test_vjp_names_must_be_sequences_not_a_string():
    with pytest.raises(xk.OpDeclarationError, match=(
            r"Vjp nondiff_outputs must be a sequence of names, got the string 'res'. Fix: "
            r"write nondiff_outputs=\(\"res\",\).")):
        xk.Vjp(copy_bwd, args=("dy",), grads=("x",), nondiff_outputs="res")


# ------------------------------------------------------------------ a residual output: JAX

def loss_on(index: int):
    return lambda x: square_saving_x(x)[index].sum()


@pytest.mark.parametrize("transform", [
    lambda f: jax.grad(f), lambda f: jax.jit(jax.grad(f)),
    lambda f: lambda x: jax.vmap(jax.grad(f))(jnp.stack([x, x]))[0],
    lambda f: lambda x: jax.vjp(f, x)[1](jnp.float32(1.0))[0]])
def test_jax_gradient_through_the_differentiable_output(transform):
    got = transform(loss_on(0))(X.astype(np.float32))
    np.testing.assert_allclose(got, 2 * X, rtol=1e-6)


@pytest.mark.parametrize("transform", [
    lambda f: jax.grad(f), lambda f: jax.jit(jax.grad(f)),
    lambda f: lambda x: jax.vmap(jax.grad(f))(jnp.stack([x, x])),
    lambda f: lambda x: jax.vjp(f, x)[1](jnp.float32(1.0))])
def test_jax_gradient_through_a_residual_output_raises(transform):
    with pytest.raises(xk.GradientError, match=RES_MESSAGE):
        transform(loss_on(1))(X.astype(np.float32))


def test_jax_vjp_of_both_outputs_raises_for_the_residuals_cotangent():
    x = X.astype(np.float32)
    _, pullback = jax.vjp(square_saving_x, x)
    with pytest.raises(xk.GradientError, match=RES_MESSAGE):
        pullback((jnp.ones_like(x), jnp.zeros_like(x)))


def test_jax_stop_gradient_on_the_residual_differentiates_the_rest():
    def loss(x):
        y, res = square_saving_x(x)
        return (y * jax.lax.stop_gradient(res)).sum()

    np.testing.assert_allclose(jax.grad(loss)(X.astype(np.float32)), 2 * X * X, rtol=1e-6)


def test_jax_integer_output_in_the_loss_is_not_an_error():
    def loss(x):
        y, sign = copy_with_sign(x)
        return (y * sign).sum()

    np.testing.assert_array_equal(jax.grad(loss)(X.astype(np.float32)), X >= 0)


def test_an_output_the_vjp_does_not_name_carries_no_gradient_whatever_its_dtype():
    # The declaration's probe saw an integer res; on f32 it is floating, and still refused.
    y, res = torch_op(square_saving_any)(torch.tensor(X, dtype=torch.float32,
                                                      requires_grad=True))
    assert y.requires_grad and not res.requires_grad
    x = X.astype(np.float32)
    np.testing.assert_allclose(jax.grad(lambda x: square_saving_any(x)[0].sum())(x), 2 * X,
                               rtol=1e-6)
    with pytest.raises(xk.GradientError, match=(
            r"xk_tests.square_saving_any: output 'res': a gradient reached it, but it carries "
            r"none \(the vjp takes no cotangent 'dres'\). Fix: differentiate a loss that does "
            r"not depend on 'res'")):
        jax.grad(lambda x: square_saving_any(x)[1].sum())(x)


def test_torchax_jax_view_gradient_reaches_the_vjp():
    from xla_kernels.frontends.torchax import import_torchax, register_torchax

    for op in (square_saving_x, square_saving_x.vjp.backward):
        register_torchax(op)
    interop = import_torchax().interop
    op, x = torch_op(square_saving_x), jnp.asarray(X, jnp.float32)
    with import_torchax().default_env():
        y_loss = interop.jax_view(lambda x: op(x)[0].sum())
        np.testing.assert_allclose(jax.grad(y_loss)(x), 2 * X, rtol=1e-6)
        with pytest.raises(xk.GradientError, match=RES_MESSAGE):
            jax.grad(interop.jax_view(lambda x: op(x)[1].sum()))(x)


# ------------------------------------------------------------------ a residual output: torch

def test_torch_residual_output_is_non_differentiable():
    x = torch.tensor(X, requires_grad=True)
    y, res = torch_op(square_saving_x)(x)
    assert y.requires_grad and not res.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        res.sum().backward()
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor(2 * X))


def test_torch_integer_output_is_non_differentiable():
    x = torch.tensor(X, dtype=torch.float32, requires_grad=True)
    y, sign = torch_op(copy_with_sign)(x)
    assert sign.dtype == torch.int32 and not sign.requires_grad
    (y * sign).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor(X >= 0, dtype=torch.float32))


def compile_residual_checks() -> None:
    op = torch_op(square_saving_x)
    x = torch.tensor(X, requires_grad=True)
    y, res = torch.compile(op, fullgraph=True, backend="aot_eager")(x)
    assert y.requires_grad and not res.requires_grad
    (y * res).sum().backward()  # res is a constant: d/dx (x^2 * res) = 2 x res
    torch.testing.assert_close(x.grad, torch.tensor(2 * X * X))


@pytest.mark.slow
def test_torch_compile_residual_output():
    from test_torch_frontend import in_fresh_python

    in_fresh_python("compile_residual_checks", module="test_vjp")


# ------------------------------------------------------------------ property: any combination

def _case(data: st.DataObject) -> tuple[int, tuple[int, ...], dict[int, float]]:
    """Outputs, the differentiable ones, and the loss weights of the outputs it uses."""
    n = data.draw(st.integers(1, 3), label="outputs")
    differentiable = tuple(k for k in range(n) if data.draw(st.booleans(), label=f"diff{k}"))
    used = data.draw(st.sets(st.integers(0, n - 1), min_size=1), label="loss uses")
    weights = {k: data.draw(st.sampled_from([-2.0, 0.5, 1.0, 3.0]), label=f"w{k}")
               for k in sorted(used)}
    return n, differentiable, weights


def _reference(weights: dict[int, float], keep: set[int]) -> np.ndarray:
    """d/dx of sum_k weights[k] * sum(x ** (k + 1)), over the outputs in ``keep``, float64."""
    return sum((w * (k + 1) * X ** k for k, w in weights.items() if k in keep),
               np.zeros_like(X))


@settings(max_examples=30)
@given(data=st.data())
def test_jax_gradient_of_any_loss_is_exact_or_raises(data):
    n, differentiable, weights = _case(data)
    op = powers_op(n, differentiable)

    def loss(x):
        outs = op(x)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(w * outs[k].sum() for k, w in weights.items())

    touched = sorted(set(weights) - set(differentiable))
    if touched:
        with pytest.raises(xk.GradientError, match=rf"{op.name}: output 'y\d': a gradient "
                                                   r"reached it, but it carries none"):
            jax.grad(loss)(X.astype(np.float32))
        return
    got = jax.grad(loss)(X.astype(np.float32))
    np.testing.assert_allclose(got, _reference(weights, set(weights)), rtol=1e-5, atol=1e-5)


@settings(max_examples=30)
@given(data=st.data())
def test_torch_gradient_of_any_loss_is_exact_or_raises(data):
    # torch semantics: a non-differentiable output is a constant (requires_grad False); a
    # loss on such outputs alone has nothing to differentiate and raises.
    n, differentiable, weights = _case(data)
    x = torch.tensor(X, requires_grad=True)
    outs = torch_op(powers_op(n, differentiable))(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert [o.requires_grad for o in outs] == [k in differentiable for k in range(n)]
    loss = sum(w * outs[k].sum() for k, w in weights.items())
    if not set(weights) & set(differentiable):
        with pytest.raises(RuntimeError, match="does not require grad"):
            loss.backward()
        return
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), _reference(weights, set(differentiable)),
                               rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ second order

def product_loss(a, b):
    return (product(a, b) ** 2).sum()  # d/da = 2 a b^2, d2/da2 = 2 b^2


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit])
def test_jax_second_order_through_a_backward_op_with_its_own_vjp(wrap):
    a, b = X.astype(np.float32), (X[::-1] + 0.25).astype(np.float32)
    got = wrap(jax.grad(lambda a: jax.grad(product_loss)(a, b).sum()))(a)
    np.testing.assert_allclose(got, 2 * b.astype(np.float64) ** 2, rtol=1e-6)
    hessian = jax.jacrev(jax.grad(product_loss))(a, b)
    np.testing.assert_allclose(hessian, np.diag(2 * b.astype(np.float64) ** 2), rtol=1e-6)


def test_jax_second_order_without_a_vjp_on_the_backward_op_names_both_ops():
    op = powers_op(1, (0,))
    first = jax.grad(lambda x: op(x).sum())
    for transform in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        with pytest.raises(xk.GradientError, match=SECOND_ORDER_MESSAGE):
            transform(lambda x: first(x).sum())(X.astype(np.float32))


def test_jax_third_order_names_the_backward_op_that_lacks_a_vjp():
    grad = jax.grad(lambda a: product(a, a).sum())
    second = jax.grad(lambda a: grad(a).sum())
    with pytest.raises(xk.GradientError, match=r"xk_tests.product_bwd: second-order "
                                               r"gradients are unavailable: its backward op "
                                               r"'xk_tests.product_bwd2' declares no vjp"):
        jax.grad(lambda a: second(a).sum())(X.astype(np.float32))


def test_torch_second_order_through_a_backward_op_with_its_own_vjp():
    a = torch.tensor(X, requires_grad=True)
    b = torch.tensor(X[::-1] + 0.25)
    loss = (torch_op(product)(a, b) ** 2).sum()
    (first,) = torch.autograd.grad(loss, a, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), a)
    torch.testing.assert_close(second, 2 * b ** 2)


def test_torch_second_order_without_a_vjp_on_the_backward_op_names_both_ops():
    x = torch.tensor(X, requires_grad=True)
    (first,) = torch.autograd.grad(torch_op(powers_op(1, (0,)))(x).sum(), x,
                                   create_graph=True)
    torch.testing.assert_close(first, torch.ones_like(x))
    with pytest.raises(xk.GradientError, match=SECOND_ORDER_MESSAGE):
        first.sum().backward()


# ------------------------------------------------------------------ inputs without gradients

# The powers op's forward with a Vjp that returns no input gradient: differentiating
# against x must raise, not give zeros (nothing runs: the refusal comes first).
UNGRADED = xk.Op(
    "xk_tests.powers_ungraded", inputs=[xk.Tensor("x", ("f32", "f64"))],
    attrs=[xk.Attr("powers", list[int], default=[1])],
    outputs=lambda x, **_: [xk.like(x)], output_names=("y0",),
    vjp=xk.Vjp(powers_op(1, (0,)).vjp.backward, args=("x", "dy0"), grads=()),
    kernels={"cpu": xk.Kernel(["unused.cc"], "Unused")})
UNGRADED_MESSAGE = (r"xk_tests.powers_ungraded: argument 'x': a gradient was requested for "
                    r"it, but the vjp returns none \(grads=\(\)\). Fix: add 'x' to the Vjp's "
                    r"grads")


@pytest.mark.parametrize("transform", [jax.grad, lambda f: jax.jit(jax.grad(f))])
def test_jax_gradient_of_an_input_the_vjp_leaves_out_raises(transform):
    with pytest.raises(xk.GradientError, match=UNGRADED_MESSAGE):
        transform(lambda x: UNGRADED(x).sum())(jnp.asarray(X, jnp.float32))


def test_torch_input_the_vjp_leaves_out_that_requires_grad_raises():
    x = torch.tensor(X, requires_grad=True)
    with pytest.raises(xk.GradientError, match=UNGRADED_MESSAGE):
        torch_op(UNGRADED)(x)
