"""The op is one opaque custom-call: never fused into neighbours, never folded away."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ops import attrs_echo
from xla_kernels.hlo import assert_single_custom_call, custom_calls, hlo_text
from xla_kernels.kernels.simple_add import simple_add

TARGET = "xla_kernels.simple_add"


def test_optimized_hlo_holds_one_typed_ffi_custom_call():
    text = hlo_text(simple_add, jnp.ones(8), jnp.ones(8))
    call = assert_single_custom_call(text, TARGET)
    assert call.api_version == "API_VERSION_TYPED_FFI" and call.result_shape.startswith("f32[8]")


def test_surrounded_by_fusible_elementwise_ops_it_is_not_fused():
    def f(a, b):
        return jnp.exp(simple_add(a * 2.0, jnp.sin(b)) + 1.0) * 3.0

    a, b = np.linspace(0, 1, 16, dtype=np.float32), np.linspace(1, 2, 16, dtype=np.float32)
    text = hlo_text(f, a, b)
    assert_single_custom_call(text, TARGET)
    assert "fusion" in text  # the neighbours did fuse, around it
    import jax

    np.testing.assert_allclose(np.asarray(jax.jit(f)(a, b)),
                               np.exp(a * 2.0 + np.sin(b) + 1.0) * 3.0, rtol=1e-6)


def test_on_constant_inputs_it_is_not_constant_folded():
    def f():
        return simple_add(jnp.array([1.0, 2.0, 3.0]), jnp.array([4.0, 5.0, 6.0]))

    assert_single_custom_call(hlo_text(f), TARGET)


def test_unused_result_of_a_pure_call_may_be_removed_but_a_used_one_stays():
    text = hlo_text(lambda a: simple_add(a, a) + simple_add(a, a * 0), jnp.ones(4))
    assert len([c for c in custom_calls(text) if c.target == TARGET]) == 2


def test_attributes_appear_in_backend_config():
    text = hlo_text(lambda x: attrs_echo(x, i=3, i32=4, f=0.5, d=0.25, b=True, s="hi",
                                         ints=[1, 2], floats=[1.5], raw=b"\x07"),
                    jnp.ones(2))
    config = assert_single_custom_call(text, "xk_tests.attrs_echo").backend_config
    for piece in ("i = 3 : i64", "i32 = 4 : i32", "f = 5.000000e-01 : f32", 'b = true',
                  's = "hi"'):
        assert piece in config, config


def test_before_optimization_text_is_available():
    text = hlo_text(simple_add, jnp.ones(2), jnp.ones(2), optimized=False)
    assert_single_custom_call(text, TARGET)


def test_assertion_reports_a_missing_target():
    with pytest.raises(AssertionError, match="found 0"):
        assert_single_custom_call(hlo_text(lambda x: x + 1, jnp.ones(2)), TARGET)


def test_assertion_reports_a_wrong_api_version():
    line = ('%r = f32[3]{0} custom-call(f32[3]{0} %a), custom_call_target="t", '
            'api_version=API_VERSION_STATUS_RETURNING')
    with pytest.raises(AssertionError, match="has API_VERSION_STATUS_RETURNING"):
        assert_single_custom_call(line, "t")
