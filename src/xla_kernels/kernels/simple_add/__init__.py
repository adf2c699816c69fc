"""``simple_add``: elementwise ``a + b`` for any shape, as one opaque custom-call.

Supported dtypes: f16, bf16, f32 on CUDA, plus f64 on the CPU. Half-precision sums
are computed in f32 and rounded to nearest even, as XLA's own add does.

Example:
    >>> import jax.numpy as jnp
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> simple_add(jnp.array([1.0, 2.0, 3.0]), jnp.array([4.0, 5.0, 6.0]))  # doctest: +SKIP
    Array([5., 7., 9.], dtype=float32)
"""

from xla_kernels.op import Invalid, Kernel, Op, Spec, Tensor, like


def _same_shape_and_dtype(a: Spec, b: Spec) -> Spec:
    if a.shape != b.shape:
        raise Invalid("b", f"shape {b.shape} differs from a's shape {a.shape}",
                      "pass arrays of one shape (broadcast them first)")
    if a.dtype != b.dtype:
        raise Invalid("b", f"dtype {b.dtype} differs from a's dtype {a.dtype}",
                      "cast both arrays to one dtype")
    return like(a)


simple_add = Op(
    "xla_kernels.simple_add",
    inputs=[Tensor("a", dtypes=("f16", "bf16", "f32", "f64")),
            Tensor("b", dtypes=("f16", "bf16", "f32", "f64"))],
    outputs=_same_shape_and_dtype,
    kernels={"cpu": Kernel(["simple_add_cpu.cc"], handler="XlaKernelsSimpleAddCpu"),
             "cuda": Kernel(["simple_add.cu"], handler="XlaKernelsSimpleAddCuda",
                            dtypes=("f16", "bf16", "f32"))},
    vmap_method="broadcast_all",
    sharding_rule="..., ... -> ...",
    doc="Elementwise a + b.",
)

__all__ = ["simple_add"]
