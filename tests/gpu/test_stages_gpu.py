"""The stateful CUDA fixture (tests/fixtures/stages/state_cuda.cu) on the GPU: JAX makes one
state per compiled custom call, eager torch one per attribute values (docs/stages.md)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels.runtime import kernel_of

pytestmark = pytest.mark.gpu

SOURCE = str(Path(__file__).parent.parent / "fixtures" / "stages" / "state_cuda.cu")

scale_cuda = xk.Op(
    "xk_tests.stages_scale_cuda",
    inputs=[xk.Tensor("x", ("f32",), rank=1)],
    attrs=[xk.Attr("factor", float)],
    outputs=lambda x, *, factor: (xk.like(x), xk.Spec((1,), "i32")),
    output_names=("out", "serial"),
    kernels={"cuda": xk.Kernel(
        [SOURCE], handler={"instantiate": "XkStagesCudaInstantiate",
                           "execute": "XkStagesCudaExecute"},
        types={"xk_tests.CudaScaleState": {"type_id": "XkStagesCudaScaleStateId",
                                           "type_info": "XkStagesCudaScaleStateInfo"}})},
)


def _instantiated():
    lib = ctypes.CDLL(str(kernel_of(scale_cuda, "cuda").library))
    lib.XkStagesCudaCount.restype = ctypes.c_int64
    return lib.XkStagesCudaCount(0)


def test_jax_gpu_state_is_made_once_per_compiled_call():
    x = jnp.arange(1000, dtype=jnp.float32)
    f = jax.jit(lambda x: scale_cuda(x, factor=2.0))
    out, serial = f(x)
    np.testing.assert_array_equal(np.asarray(out), np.arange(1000) * 20.0)
    made = _instantiated()
    _, serial2 = f(x)
    assert int(serial2[0]) == int(serial[0]) and _instantiated() == made


def test_torch_eager_gpu_keeps_one_state_per_attributes():
    torch = pytest.importorskip("torch")
    from xla_kernels.frontends.torch import call

    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    out, serial = call(scale_cuda, x, factor=0.5)
    torch.testing.assert_close(out, x * 5.0)
    made = _instantiated()
    _, serial2 = call(scale_cuda, x, factor=0.5)
    assert int(serial2[0]) == int(serial[0]) and _instantiated() == made
    _, serial3 = call(scale_cuda, x, factor=1.0)
    assert int(serial3[0]) != int(serial[0]) and _instantiated() == made + 1
