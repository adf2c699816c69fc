"""reshape_and_cache's CUDA kernel on the GPU against the NumPy oracle, bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from test_kv_cache import make, make_fp8, same
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.kv_cache import reshape_and_cache, reshape_and_cache_numpy

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("dim", [128, 64, 40, 3])
@pytest.mark.parametrize("tokens", [1, 13, 2000])
def test_cuda_writes_each_slot_and_nothing_else(rng, layout, dtype, dim, tokens):
    args = make(rng, tokens=tokens, blocks=max(8, tokens // 8), layout=layout, dtype=dtype,
                dim=dim)
    want = reshape_and_cache_numpy(*args, layout=layout)
    got = jax.jit(lambda *a: reshape_and_cache(*a, layout=layout),
                  donate_argnums=(2, 3))(*[jax.device_put(a) for a in args])
    assert same(got[0], want[0]) and same(got[1], want[1])


def test_cuda_torch_mutates_the_caches_on_the_current_stream(rng):
    key, value, kc, vc, slots = make(rng)
    want = reshape_and_cache_numpy(key, value, kc, vc, slots)
    t = [torch.from_numpy(a).cuda() for a in (key, value, kc, vc, slots)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch_op(reshape_and_cache)(*t)
    side.synchronize()
    assert same(t[2].cpu().numpy(), want[0]) and same(t[3].cpu().numpy(), want[1])


@pytest.mark.parametrize("layout", ["vllm", "pallas"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("dim", [128, 64, 40, 3])
@pytest.mark.parametrize("tokens", [1, 13, 2000])
def test_cuda_fp8_cache_writes_quantized_rows_bit_for_bit(rng, layout, dtype, dim, tokens):
    """Quantize on write (x / scale, RNE, saturated, NaN kept) exactly as the NumPy oracle,
    the edge values (+-inf, NaN, beyond 448, subnormals) included."""
    args, scales = make_fp8(rng, tokens=tokens, blocks=max(8, tokens // 8), layout=layout,
                            dtype=dtype, dim=dim)
    want = reshape_and_cache_numpy(*args, layout=layout, **scales)
    got = jax.jit(lambda *a: reshape_and_cache(*a, layout=layout, **scales),
                  donate_argnums=(2, 3))(*[jax.device_put(a) for a in args])
    assert same(got[0], want[0]) and same(got[1], want[1])


def test_cuda_fp8_torch_mutates_float8_caches(rng):
    (key, value, kc, vc, slots), scales = make_fp8(rng, dtype="bf16")
    want = reshape_and_cache_numpy(key, value, kc, vc, slots, **scales)
    rows = [torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda() for a in (key, value)]
    caches = [torch.from_numpy(c.view(np.uint8).copy()).view(torch.float8_e4m3fn).cuda()
              for c in (kc, vc)]
    torch_op(reshape_and_cache)(*rows, *caches, torch.from_numpy(slots).cuda(), **scales)
    torch.cuda.synchronize()
    for tensor, expected in zip(caches, want, strict=True):
        assert tensor.view(torch.uint8).cpu().numpy().tobytes() == np.asarray(expected).tobytes()
