"""The README's example: a user op with an attribute, declared once, run from JAX.

Run: python examples/scale/scale.py
"""

import jax
import jax.numpy as jnp

import xla_kernels as xk

scale = xk.Op(
    "my_project.scale",                                   # the custom_call_target
    inputs=[xk.Tensor("x", dtypes=("f32",))],
    attrs=[xk.Attr("factor", float)],                     # reaches C++ as `float factor`
    outputs=lambda x, *, factor: xk.like(x),              # shape rule: same as x
    kernels={"cpu": xk.Kernel(["scale.cc"], handler="ScaleCpu"),
             "cuda": xk.Kernel(["scale.cu"], handler="ScaleCuda")},
)

if __name__ == "__main__":
    x = jnp.arange(5.0)
    y = jax.jit(lambda x: scale(x, factor=2.5) + 1)(x)
    print(y)                                              # [ 1.   3.5  6.   8.5 11. ]
    print(xk.assert_single_custom_call(xk.hlo_text(lambda x: scale(x, factor=2.5), x),
                                       "my_project.scale").line)
