"""In-place torch ops on CUDA tensors under autograd (the CPU tests are in
tests/test_torch_in_place_autograd.py): the shipped ``reshape_and_cache`` bumps the caches'
version counters, so a backward that saved a cache raises, and a cache that requires grad
is refused with a fix."""

from __future__ import annotations

import pytest
import torch

import xla_kernels as xk
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.kv_cache import reshape_and_cache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]


def _inputs():
    key = torch.ones(2, 1, 16, device="cuda")
    caches = torch.zeros(2, 4, 1, 16, device="cuda"), torch.zeros(2, 4, 1, 16, device="cuda")
    return key, caches, torch.tensor([0, 5], dtype=torch.int32, device="cuda")


def test_cuda_backward_refuses_a_saved_cache_the_op_updated():
    key, (key_cache, value_cache), slots = _inputs()
    w = torch.ones_like(key_cache, requires_grad=True)
    loss = (w * key_cache).sum()
    torch_op(reshape_and_cache)(key, key, key_cache, value_cache, slots)
    assert (key_cache._version, value_cache._version) == (1, 1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_cuda_update_of_a_cache_that_requires_grad_is_refused_with_a_fix():
    key, (key_cache, value_cache), slots = _inputs()
    key_cache.requires_grad_()
    with pytest.raises(xk.OpInputError, match=r"xla_kernels.reshape_and_cache: argument "
                                              r"'key_cache': requires grad and is updated in "
                                              r"place, which autograd cannot record. Fix: "):
        torch_op(reshape_and_cache)(key, key, key_cache, value_cache, slots)
    assert not key_cache.detach().any()
