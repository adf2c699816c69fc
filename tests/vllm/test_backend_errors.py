"""What xla-kernels' vLLM attention backend refuses, and the message it gives (op, what, fix)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from xla_kernels.vllm import backend


class _Mesh:
    def __init__(self, **shape):
        self.shape = {"data": 1, "model": 1, **shape}


def test_fp8_cache_takes_the_layers_scales_and_defaults_them_to_one():
    assert backend.kv_scales(jnp.float8_e4m3fn, 0.5, 2.0) == (0.5, 2.0)
    assert backend.kv_scales(jnp.float8_e4m3fn, None, None) == (1.0, 1.0)
    assert backend.kv_scales(jnp.bfloat16, None, None) == (1.0, 1.0)


@pytest.mark.parametrize(("dtype", "k_scale", "what", "fix"), [
    (jnp.float8_e5m2, None, "float8_e5m2 KV cache", "kv_cache_dtype='fp8'"),
    (jnp.int8, None, "int8 KV cache", "kv_cache_dtype='fp8'"),
    (jnp.bfloat16, 0.5, "k/v scales (0.5, 1.0) on a bfloat16 cache", "fp8 caches only"),
])
def test_unsupported_caches_are_refused_by_name(dtype, k_scale, what, fix):
    with pytest.raises(NotImplementedError, match=r"xla_kernels\.vllm attention backend") as e:
        backend.kv_scales(dtype, k_scale, None)
    assert what in str(e.value) and fix in str(e.value)


def test_tensor_parallel_meshes_are_taken_and_others_refused():
    assert backend.sharded_axes(_Mesh()) == {}
    assert backend.sharded_axes(_Mesh(model=2)) == {"model": 2}
    with pytest.raises(NotImplementedError, match="data or context parallel") as e:
        backend.sharded_axes(_Mesh(data=2))
    assert "tensor_parallel_size" in str(e.value)
