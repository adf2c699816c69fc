"""torchax: on torchax tensors an op's torch operator lowers to the op's custom-call (CPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels.frontends.torch import attrs_for_torch, torch_op
from xla_kernels.frontends.torchax import import_torchax, jax_impl, register_torchax
from xla_kernels.hlo import assert_single_custom_call, custom_calls, hlo_text
from xla_kernels.kernels.simple_add import simple_add

torchax = import_torchax()
from torchax import interop  # noqa: E402  (after import_torchax, which makes it importable)

from test_torch_frontend import expected_ints, torch_attrs  # noqa: E402


@pytest.fixture(scope="module")
def env():
    register_torchax(simple_add)
    register_torchax(torch_attrs)
    return torchax.default_env()


@pytest.fixture
def on_cpu():
    """torch_attrs has a CPU kernel only: keep its JAX arrays on the CPU (GPU machines)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def jax_tensor(env, array: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
    t = torch.from_numpy(array)
    if dtype is not None:
        t = t.to(dtype)
    with env:
        return t.to("jax")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size", [1, 3, 31, 1021])
def test_eager_torchax_matches_eager_torch(env, rng, dtype, size):
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    with env:
        out = torch.ops.xla_kernels.simple_add(jax_tensor(env, a, dtype), jax_tensor(env, b, dtype))
        assert isinstance(out, torchax.tensor.Tensor)
        assert out.dtype == dtype and out.shape == (size,)
        got = out.to("cpu")
    want = torch.ops.xla_kernels.simple_add(torch.from_numpy(a).to(dtype),
                                            torch.from_numpy(b).to(dtype))
    assert torch.equal(got, want)


def test_under_jax_jit_matches_and_is_one_custom_call(env, rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)

    def f(x, y):
        return torch.ops.xla_kernels.simple_add(x, y) * 2

    jitted = interop.jax_jit(f)
    with env:
        got = jitted(jax_tensor(env, a), jax_tensor(env, b)).to("cpu")
    want = torch.ops.xla_kernels.simple_add(torch.from_numpy(a), torch.from_numpy(b)) * 2
    assert torch.equal(got, want)

    text = hlo_text(interop.jax_view(f), jnp.asarray(a), jnp.asarray(b))
    call = assert_single_custom_call(text, simple_add.target)
    assert call.api_version == "API_VERSION_TYPED_FFI"
    assert [c.target for c in custom_calls(text)] == [simple_add.target]


def test_jax_jit_of_jax_view_runs(env):
    f = jax.jit(interop.jax_view(lambda x, y: torch.ops.xla_kernels.simple_add(x, y)))
    out = f(jnp.array([1.0, 2.0, 3.0]), jnp.array([4.0, 5.0, 6.0]))
    np.testing.assert_array_equal(np.asarray(out), [5.0, 7.0, 9.0])


def test_attributes_and_workspace_through_torchax_match_eager_torch(env, rng, on_cpu):
    x = rng.standard_normal(6).astype(np.float32)
    values = dict(i=-(2**40), i32=-7, u8=200, flag=True, f=0.75, f64=-1e200,
                  s="torchax ✓", list_i=[5, -6], list_f=[0.5], blob=b"\x10\x00\xff")
    want = torch.ops.xk_tests.torch_attrs(torch.from_numpy(x),
                                          **attrs_for_torch(torch_attrs, values))
    assert want[0].tolist() == expected_ints(values["i"], -7, 200, True, values["s"],
                                             [5, -6], values["blob"])
    with env:
        eager = torch.ops.xk_tests.torch_attrs(jax_tensor(env, x), **values)  # bytes as bytes
        jitted = interop.jax_jit(
            lambda t: torch.ops.xk_tests.torch_attrs(t, **attrs_for_torch(torch_attrs, values))
        )(jax_tensor(env, x))
        for outs in (eager, jitted):
            assert len(outs) == 3  # the workspace output stays hidden
            for got, ref in zip(outs, want, strict=True):
                assert torch.equal(got.to("cpu"), ref)


def test_defaults_through_torchax(env, on_cpu):
    with env:
        x = jax_tensor(env, np.zeros(2, np.float32))
        ints, reals, y = torch.ops.xk_tests.torch_attrs(x, i32=1)
        assert ints.to("cpu").tolist() == expected_ints(7, 1, 255, False, "hi", [1, -2],
                                                        b"\x00\xff")
        assert reals.to("cpu").tolist() == [0.5, float("inf"), 0.0]
        assert y.to("cpu").tolist() == [0.5, 0.5]


def test_errors_on_torchax_tensors_are_the_library_errors(env, on_cpu):
    with env:
        a = jax_tensor(env, np.ones(3, np.int32))
        with pytest.raises(xk.OpTypeError, match="argument 'a': dtype i32 is not supported"):
            torch.ops.xla_kernels.simple_add(a, a)
        x = jax_tensor(env, np.ones(3, np.float32))
        with pytest.raises(xk.OpInputError, match="argument 'i32': missing required attribute"):
            torch.ops.xk_tests.torch_attrs(x)


def test_registration_is_idempotent_and_reaches_new_environments(env):
    from torchax.ops import ops_registry

    overload = torch_op(simple_add).default
    before = ops_registry.all_aten_ops[overload]
    register_torchax(simple_add)
    assert ops_registry.all_aten_ops[overload] is before
    assert env._ops[overload] is before
    fresh = torchax.tensor.Environment()
    with fresh:
        a = torch.tensor([1.0, 2.0], device="jax")
        assert torch.ops.xla_kernels.simple_add(a, a).to("cpu").tolist() == [2.0, 4.0]


def test_register_torchax_lowers_the_operator_torch_op_defined_in_a_namespace(env):
    op = xk.Op("xk_tests.torchax_spaced_add", inputs=simple_add.inputs,
               outputs=simple_add.output_rule, kernels=simple_add.kernels)
    spaced = torch_op(op, namespace="xk_tests_torchax_spaced")
    register_torchax(op)
    with env:
        a = torch.tensor([1.0, 2.0], device="jax")
        out = spaced(a, a)
        assert isinstance(out, torchax.tensor.Tensor)
        assert out.to("cpu").tolist() == [2.0, 4.0]
    assert not hasattr(torch.ops.xk_tests, "torchax_spaced_add")  # no second operator


def test_jax_impl_converts_torch_style_attributes(on_cpu):
    impl = jax_impl(torch_attrs)
    ints, _, _ = impl(jnp.ones(2), i32=3, blob=[9], list_f=None, s="a")
    assert np.asarray(ints).tolist() == expected_ints(7, 3, 255, False, "a", [1, -2], b"\x09")
    with pytest.raises(xk.OpInputError, match="argument 'blob': expected bytes"):
        impl(jnp.ones(2), i32=3, blob=[256])
