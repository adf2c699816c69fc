"""xla_kernels.runtime.hlo_proto: output_to_operand_aliasing added to a custom call inside a
serialized HloModuleProto (what the torch_xla frontend does for ops updating inputs in
place), checked by XLA's own HLO printer."""

from __future__ import annotations

import pytest


def _aliasing_of(module: bytes) -> list[str]:
    from jax._src.lib import xla_client

    text = xla_client.XlaComputation(module).as_hlo_text()
    return [line.split("output_to_operand_aliasing=")[1].split(", api_version")[0]
            for line in text.splitlines() if "output_to_operand_aliasing" in line]


def test_operand_aliasing_is_added_to_the_one_custom_call_of_an_xla_module():
    import jax
    import jax.numpy as jnp

    from xla_kernels.kernels.kv_cache import reshape_and_cache
    from xla_kernels.kernels.simple_add import simple_add
    from xla_kernels.runtime.hlo_proto import add_operand_aliasing

    module = jax.jit(simple_add).lower(jnp.ones(3), jnp.ones(3)).compiler_ir("hlo") \
        .as_serialized_hlo_module_proto()
    assert _aliasing_of(module) == []
    edited = add_operand_aliasing(module, "xla_kernels.simple_add", {1: 0}, tuple_output=False)
    assert _aliasing_of(edited) == ["{{}: (1, {})}"]
    # A tuple result: the output index is the tuple index; an existing entry is kept.
    key, cache, slots = jnp.ones((2, 1, 4)), jnp.ones((1, 16, 1, 4)), jnp.zeros(2, jnp.int32)
    module = jax.jit(reshape_and_cache).lower(key, key, cache, cache, slots) \
        .compiler_ir("hlo").as_serialized_hlo_module_proto()
    edited = add_operand_aliasing(module, "xla_kernels.reshape_and_cache", {0: 2},
                                  tuple_output=True)
    assert _aliasing_of(edited) == ["{{0}: (2, {}), {1}: (3, {}), {2}: (0, {})}"]
    with pytest.raises(ValueError, match=r"expected one custom call of 'other' in the "
                                         r"module, found 0"):
        add_operand_aliasing(module, "other", {0: 0}, tuple_output=True)
