"""Differentiable test ops with exact gradients (fixtures/vjp/vjp_ops.cc), for the Vjp tests.

``powers_op(n, differentiable)`` has one input ``x`` and the outputs ``y0 .. y{n-1}`` with
``yk = x ** (k + 1)``; its Vjp takes the cotangents of the outputs in ``differentiable``
and declares the others non-differentiable.
"""

from __future__ import annotations

import functools

import xla_kernels as xk

SOURCE = "fixtures/vjp/vjp_ops.cc"
DTYPES = ("f32", "f64")


def _like_x(count: int):
    return lambda *inputs, **_: [xk.like(inputs[0])] * count


def powers_bwd_op(name: str, cotangents: tuple[str, ...], powers: tuple[int, ...]) -> xk.Op:
    """``dx = sum_j powers[j] * x ** (powers[j] - 1) * cotangents[j]``: inputs ``x`` and the
    named cotangents."""
    return xk.Op(
        name, inputs=[xk.Tensor("x", DTYPES)] + [xk.Tensor(c, DTYPES) for c in cotangents],
        attrs=[xk.Attr("ct_powers", list[int], default=list(powers))],
        outputs=_like_x(1), output_names=("dx",),
        kernels={"cpu": xk.Kernel([SOURCE], "XkTestPowersBwd")})


@functools.cache
def powers_op(n: int, differentiable: tuple[int, ...]) -> xk.Op:
    """The op with ``n`` outputs ``x ** 1 .. x ** n``, differentiable in ``differentiable``."""
    tag = f"{n}_{''.join(map(str, differentiable)) or 'none'}"
    names = tuple(f"y{k}" for k in range(n))
    cotangents = tuple(f"d{names[k]}" for k in differentiable)
    backward = powers_bwd_op(f"xk_tests.powers_bwd_{tag}", cotangents,
                             tuple(k + 1 for k in differentiable))
    return xk.Op(
        f"xk_tests.powers_{tag}", inputs=[xk.Tensor("x", DTYPES)],
        attrs=[xk.Attr("powers", list[int], default=list(range(1, n + 1)))],
        outputs=_like_x(n), output_names=names,
        vjp=xk.Vjp(backward, args=("x", *cotangents), grads=("x",),
                   nondiff_outputs=tuple(n for k, n in enumerate(names)
                                         if k not in differentiable)),
        kernels={"cpu": xk.Kernel([SOURCE], "XkTestPowers")})


# (y, res) = (x ** 2, x): the backward reads the residual and y's cotangent,
# dx = 2 * res * dy.
square_bwd_from_residual = powers_bwd_op("xk_tests.square_bwd_from_residual", ("dy",), (2,))
square_saving_x = xk.Op(
    "xk_tests.square_saving_x", inputs=[xk.Tensor("x", DTYPES)],
    attrs=[xk.Attr("powers", list[int], default=[2, 1])],
    outputs=_like_x(2), output_names=("y", "res"),
    vjp=xk.Vjp(square_bwd_from_residual, args=("res", "dy"), grads=("x",),
               nondiff_outputs=("res",)),
    kernels={"cpu": xk.Kernel([SOURCE], "XkTestPowers")})

# (y, sign) = (x, x >= 0): an integer output needs no cotangent and no declaration.
copy_bwd = powers_bwd_op("xk_tests.copy_bwd", ("dy",), (1,))
copy_with_sign = xk.Op(
    "xk_tests.copy_with_sign", inputs=[xk.Tensor("x", ("f32",))],
    outputs=lambda x: [xk.like(x), xk.like(x, dtype="i32")], output_names=("y", "sign"),
    vjp=xk.Vjp(copy_bwd, args=("x", "dy"), grads=("x",)),
    kernels={"cpu": xk.Kernel([SOURCE], "XkTestCopyWithSign")})

# out = a * b, differentiable to second order; its second backward declares no vjp.
product_bwd2 = xk.Op(
    "xk_tests.product_bwd2",
    inputs=[xk.Tensor(n, DTYPES) for n in ("a", "b", "dout", "dda", "ddb")],
    outputs=_like_x(3), output_names=("da", "db", "ddout"),
    kernels={"cpu": xk.Kernel([SOURCE], "XkTestProductBwd2")})
product_bwd = xk.Op(
    "xk_tests.product_bwd", inputs=[xk.Tensor(n, DTYPES) for n in ("a", "b", "dout")],
    outputs=_like_x(2), output_names=("da", "db"),
    vjp=xk.Vjp(product_bwd2, args=("a", "b", "dout", "dda", "ddb"),
               grads=("a", "b", "dout")),
    kernels={"cpu": xk.Kernel([SOURCE], "XkTestProductBwd")})
product = xk.Op(
    "xk_tests.product", inputs=[xk.Tensor("a", DTYPES), xk.Tensor("b", DTYPES)],
    outputs=_like_x(1), output_names=("out",),
    vjp=xk.Vjp(product_bwd, args=("a", "b", "dout"), grads=("a", "b")),
    kernels={"cpu": xk.Kernel([SOURCE], "XkTestProduct")})

# square_saving_x with an integer first dtype: the declaration's probe (inputs of the first
# dtype) sees an integer res, so res needs no declaration; called on f32, res is floating
# and must still carry no gradient.
square_saving_any = xk.Op(
    "xk_tests.square_saving_any", inputs=[xk.Tensor("x", ("i32", "f32"))],
    attrs=[xk.Attr("powers", list[int], default=[2, 1])],
    outputs=_like_x(2), output_names=("y", "res"),
    vjp=xk.Vjp(square_bwd_from_residual, args=("res", "dy"), grads=("x",)),
    kernels={"cpu": xk.Kernel([SOURCE], "XkTestPowers")})
