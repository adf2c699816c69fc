"""The JAX frontend on the host CPU: results, attributes, jit, vmap, platform errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from ops import attrs_echo
from xla_kernels import dtypes
from xla_kernels.kernels.simple_add import simple_add

SIZES = [1, 2, 3, 7, 31, 257, 1021, 4099]


def random_array(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtypes.to_numpy(dtype))


def rounded_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The float64 sum, rounded once to the inputs' dtype: what the kernel must return."""
    return (a.astype(np.float64) + b.astype(np.float64)).astype(a.dtype)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("size", SIZES)
def test_simple_add_matches_float64_reference(rng, dtype, size):
    if dtype == "f64":
        jax.config.update("jax_enable_x64", True)
    try:
        a, b = random_array(rng, size, dtype), random_array(rng, size, dtype)
        out = np.asarray(jax.jit(simple_add)(a, b))
        assert out.dtype == a.dtype and out.shape == a.shape
        np.testing.assert_array_equal(out.astype(np.float64),
                                      rounded_sum(a, b).astype(np.float64))
    finally:
        jax.config.update("jax_enable_x64", False)


def test_simple_add_seeds_example():
    out = simple_add(jnp.array([1.0, 2.0, 3.0]), jnp.array([4.0, 5.0, 6.0]))
    assert out.tolist() == [5.0, 7.0, 9.0]


@pytest.mark.parametrize("shape", [(), (0,), (2, 3), (3, 1, 5), (2, 3, 4, 5)])
def test_simple_add_any_shape(rng, shape):
    a, b = random_array(rng, shape, "f32"), random_array(rng, shape, "f32")
    np.testing.assert_array_equal(np.asarray(simple_add(a, b)), a + b)


def test_simple_add_under_vmap_with_an_unbatched_argument(rng):
    a, b = random_array(rng, (4, 5), "f32"), random_array(rng, (5,), "f32")
    out = jax.vmap(simple_add, in_axes=(0, None))(a, b)
    np.testing.assert_array_equal(np.asarray(out), a + b)


def test_sequential_vmap_runs_one_call_per_row(rng):
    x = random_array(rng, (3, 4), "f32")
    out = jax.vmap(lambda r: attrs_echo(r, i=1, i32=2, f=0.5, d=0.25, b=False, s="",
                                        ints=[], floats=[]))(x)
    np.testing.assert_allclose(np.asarray(out)[:, 23], x.astype(np.float64).sum(axis=1),
                               rtol=1e-6)


def test_every_attribute_type_arrives_intact():
    x = np.arange(4, dtype=np.float32)
    out = np.asarray(attrs_echo(x, i=-(2**40) - 3, i32=-7, f=0.1, d=1e-300, b=True,
                                s="héllo", ints=[5, -6, 2**50], floats=[0.25, -2.5],
                                raw=b"\x00\x01\xfe\xff"))
    assert out[0] == -(2**40) - 3 and out[1] == -7
    assert out[2] == np.float64(np.float32(0.1)) and out[3] == 1e-300 and out[4] == 1.0
    assert out[5] == len("héllo".encode()) and out[6:10].tolist() == list("héllo".encode()[:4])
    assert out[10] == 3 and out[11:14].tolist() == [5, -6, 2**50]
    assert out[14] == 2 and out[15:17].tolist() == [0.25, -2.5]
    assert out[18] == 4 and out[19:23].tolist() == [0, 1, 254, 255]
    assert out[23] == 6.0


def test_empty_array_attributes_arrive_as_empty_spans():
    out = np.asarray(attrs_echo(np.ones(2, np.float32), i=0, i32=0, f=0.0, d=0.0, b=False,
                                s="", ints=[], floats=[]))
    assert out[5] == 0 and out[10] == 0 and out[14] == 0 and out[18] == 0


def test_validation_happens_before_lowering():
    with pytest.raises(xk.OpTypeError, match="argument 'a': dtype i32 is not supported"):
        jax.jit(simple_add).lower(np.ones(3, np.int32), np.ones(3, np.int32))


def test_op_without_a_kernel_for_the_platform_raises_platform_error():
    from ops import seeds_legacy_add  # CUDA only

    with pytest.raises(xk.PlatformError, match=r"xk_tests.seeds_legacy_add: no kernel for "
                                               r"platform 'cpu' \(it has kernels for cuda\)"):
        jax.jit(seeds_legacy_add).lower(np.ones(3, np.float32), np.ones(3, np.float32)).compile()


def test_registration_is_listed_and_idempotent():
    simple_add(np.ones(2, np.float32), np.ones(2, np.float32))
    first = xk.ensure_registered(simple_add, "cpu")
    assert xk.ensure_registered(simple_add, "cpu") is first
    listed = [(r.target, r.platform) for r in xk.registrations()]
    assert ("xla_kernels.simple_add", "cpu") in listed
    assert first.handler == "XlaKernelsSimpleAddCpu" and first.library.exists()


def test_a_second_declaration_with_other_kernels_cannot_take_over_a_target():
    first = xk.Op("xk_tests.twice", inputs=[xk.Tensor("a", ("f32",)), xk.Tensor("b", ("f32",))],
                  outputs=lambda a, b: xk.like(a), kernels=simple_add.kernels)
    np.testing.assert_array_equal(np.asarray(first(np.ones(2, np.float32),
                                                   np.ones(2, np.float32))), [2.0, 2.0])
    same = xk.Op("xk_tests.twice", inputs=first.inputs, outputs=first.output_rule,
                 kernels=simple_add.kernels)
    np.testing.assert_array_equal(np.asarray(same(np.ones(2, np.float32),
                                                  np.ones(2, np.float32))), [2.0, 2.0])
    with pytest.raises(xk.OpDeclarationError, match=r"xk_tests.twice: already declared in "
                       r"test_jax_frontend, and its cpu kernel .* is already loaded"):
        xk.Op("xk_tests.twice", inputs=first.inputs, outputs=first.output_rule,
              kernels={"cpu": xk.Kernel(["fixtures/legacy/legacy_add_cpu.cc"], "Other")})
