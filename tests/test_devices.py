"""Every tensor input of a call on one device, in every path, or an error naming it.

Torch: the eager kernels (the native C++ one and the Python one), the autograd gate, and
the fake kernel (``torch.compile``, ``FakeTensorMode``, and torch's Meta kernel, which
torch picks for any call with a ``meta`` input) refuse inputs on different devices, and
the eager kernels refuse ``meta`` tensors (no memory to read). The eager kernels are
reached directly with ``redispatch`` to the CPU key (a normal call with a ``meta`` input
goes to the Meta kernel). Two GPUs are compared as whole devices (``cuda:0`` is not
``cuda:1``): the fake kernel shows it here with fake CUDA tensors, ``tests/gpu`` on GPUs.

JAX: an eager call on arrays committed to different devices raises the library's error;
under ``jit`` JAX's own error names the arguments.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import xla_kernels as xk
from xla_kernels.frontends.torch import native, torch_op
from xla_kernels.frontends.torch.devices import check_devices
from xla_kernels.kernels.kv_cache import reshape_and_cache
from xla_kernels.kernels.moe import fused_moe
from xla_kernels.kernels.rms_norm import fused_add_rms_norm, rms_norm
from xla_kernels.kernels.sampling import sample
from xla_kernels.kernels.simple_add import simple_add

CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
SRC = str(Path(__file__).resolve().parents[1] / "src")


def on(device: str) -> SimpleNamespace:
    """A stand-in tensor for the checks, which read only ``.device`` (no GPU here)."""
    return SimpleNamespace(device=torch.device(device))


def fake(mode: FakeTensorMode, device: str, *shape: int) -> FakeTensor:
    """A fake tensor on ``device`` (any CUDA index: nothing is allocated there)."""
    return FakeTensor(mode, torch.empty(*shape, device="meta"), torch.device(device))


def assert_names(error: xk.OpInputError, op: xk.Op, arg: str, *devices: str) -> None:
    text = str(error)
    assert error.op == op.name and error.arg == arg, text
    assert text.startswith(f"{op.name}: argument '{arg}': is on {devices[0]}"), text
    for device in devices[1:]:
        assert f"on {device}" in text, text
    assert "Fix: " in text, text


# ------------------------------------------------------------------------ the check itself


def test_two_gpus_are_two_devices():
    with pytest.raises(xk.OpInputError) as e:
        check_devices(simple_add, (on("cuda:0"), on("cuda:1")))
    assert_names(e.value, simple_add, "b", "cuda:1", "cuda:0")
    assert "b.to('cuda:0')" in str(e.value)


def test_a_cpu_tensor_beside_cuda_ones_is_named():
    with pytest.raises(xk.OpInputError) as e:
        check_devices(fused_moe, (on("cpu"), on("cuda:0"), on("cuda:0"), on("cuda:0")))
    assert_names(e.value, fused_moe, "hidden", "cpu", "cuda:0")
    assert "'router_logits', 'w13', 'w2' are on cuda:0" in str(e.value)


def test_a_meta_tensor_is_named_beside_real_ones():
    with pytest.raises(xk.OpInputError) as e:
        check_devices(simple_add, (on("meta"), on("cpu")))
    assert_names(e.value, simple_add, "a", "meta", "cpu")
    assert "a meta tensor has no data" in str(e.value)


def test_eager_kernels_refuse_meta_even_on_one_device():
    assert check_devices(simple_add, (on("meta"), on("meta"))) == torch.device("meta")
    with pytest.raises(xk.OpInputError) as e:
        check_devices(simple_add, (on("meta"), on("meta")), eager=True)
    assert e.value.arg == "a" and "is on meta (no data)" in str(e.value)
    assert "Fix: pass tensors on cpu or cuda" in str(e.value)


def test_one_device_passes_and_is_returned():
    assert check_devices(simple_add, (on("cuda:1"), on("cuda:1")), eager=True) == \
        torch.device("cuda:1")


# ------------------------------------------------------------------------ torch calls


@pytest.fixture(scope="module")
def add():
    return torch_op(simple_add)


def test_a_meta_input_beside_a_cpu_one_raises_instead_of_garbage(add):
    with pytest.raises(xk.OpInputError) as e:
        add(torch.ones(4), torch.ones(4, device="meta"))
    assert_names(e.value, simple_add, "b", "meta", "cpu")


def test_a_meta_first_input_raises_instead_of_a_meta_result(add):
    with pytest.raises(xk.OpInputError) as e:
        add(torch.ones(4, device="meta"), torch.ones(4))
    assert_names(e.value, simple_add, "a", "meta", "cpu")


@pytest.mark.parametrize("op, arg", [(sample, "seeds"), (fused_moe, "w2")],
                         ids=["sample-seeds", "fused_moe-w2"])
def test_one_meta_input_of_a_shipped_op_is_named(op, arg):
    tensors, attrs = CALLS[op]()
    i = [t.name for t in op.inputs].index(arg)
    tensors = (*tensors[:i], tensors[i].to("meta"), *tensors[i + 1:])
    with pytest.raises(xk.OpInputError) as e:
        torch_op(op)(*tensors, **attrs)
    assert_names(e.value, op, arg, "meta", "cpu")


def test_every_input_on_meta_runs_the_shape_rule(add):
    out = add(torch.ones(4, device="meta"), torch.ones(4, device="meta"))
    assert out.device.type == "meta" and out.shape == (4,)


def test_the_autograd_path_refuses_mixed_devices():
    op = torch_op(rms_norm)
    x = torch.ones(2, 8, requires_grad=True)
    with pytest.raises(xk.OpInputError) as e:
        op(x, torch.ones(8, device="meta"))
    assert_names(e.value, rms_norm, "weight", "meta", "cpu")


def test_the_fake_kernel_refuses_two_gpus(add):
    if torch.cuda.device_count() == 1:  # torch checks a fake cuda:1 against the real GPUs
        pytest.skip("one visible GPU: cuda:1 does not exist (runs with none or two)")
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        ok = add(fake(mode, "cuda:1", 4), fake(mode, "cuda:1", 4))
        assert ok.device == torch.device("cuda:1")
        with pytest.raises(xk.OpInputError) as e:
            add(fake(mode, "cuda:0", 4), fake(mode, "cuda:1", 4))
    assert_names(e.value, simple_add, "b", "cuda:1", "cuda:0")


def test_the_native_kernel_checks_devices_on_every_call(add):
    if not native.native_status().startswith("active"):
        pytest.skip(native.native_status())
    a, b = torch.ones(4), torch.full((4,), 2.0)
    assert add.default.redispatch(CPU, a, b).tolist() == [3.0] * 4  # a plan for this shape
    with pytest.raises(xk.OpInputError) as e:
        add.default.redispatch(CPU, a, b.to("meta"))  # same shape and dtypes
    assert_names(e.value, simple_add, "b", "meta", "cpu")
    assert add.default.redispatch(CPU, a, b).tolist() == [3.0] * 4


def test_the_native_kernel_refuses_meta_tensors(add):
    if not native.native_status().startswith("active"):
        pytest.skip(native.native_status())
    meta = torch.ones(4, device="meta")
    with pytest.raises(xk.OpInputError, match="'a': is on meta \\(no data\\)"):
        add.default.redispatch(CPU, meta, meta)


def python_kernel_checks() -> None:
    """Run with XLA_KERNELS_TORCH_NATIVE=0: the Python eager kernel, and torch.compile."""
    assert native.native_status().startswith("disabled")
    add = torch_op(simple_add)
    a, b = torch.ones(4), torch.full((4,), 2.0)
    assert add.default.redispatch(CPU, a, b).tolist() == [3.0] * 4
    for args, arg in [((a, b.to("meta")), "b"), ((b.to("meta"), b.to("meta")), "a")]:
        try:
            add.default.redispatch(CPU, *args)
        except xk.OpInputError as e:
            assert e.arg == arg and "meta" in str(e) and "Fix: " in str(e), str(e)
        else:
            raise AssertionError(f"no error for {[t.device for t in args]}")
    try:
        add(a, b.to("meta"))
    except xk.OpInputError as e:
        assert e.arg == "b", str(e)
    else:
        raise AssertionError("no error for cpu + meta")
    compiled = torch.compile(lambda x, y: add(x, y) + 1, fullgraph=True, backend="aot_eager")
    assert compiled(a, b).tolist() == [4.0] * 4
    try:
        compiled(a, b.to("meta"))
    except Exception as e:  # Dynamo wraps the fake kernel's error
        assert "xla_kernels.simple_add: argument 'b': is on meta, while 'a' is on cpu" \
            in str(e), str(e)
    else:
        raise AssertionError("torch.compile ran cpu + meta")


def test_the_python_kernel_and_torch_compile_refuse_mixed_devices():
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import test_devices as t\nt.python_kernel_checks()\nprint('CHECKS PASSED')\n")
    env = dict(os.environ, XLA_KERNELS_TORCH_NATIVE="0", PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0 and "CHECKS PASSED" in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------------------------------ devices x ops


def _moe() -> tuple[tuple[torch.Tensor, ...], dict]:
    g = torch.Generator().manual_seed(0)
    return ((torch.randn(3, 8, generator=g), torch.randn(3, 4, generator=g),
             torch.randn(4, 32, 8, generator=g) * 0.1, torch.randn(4, 8, 16, generator=g) * 0.1),
            {"top_k": 2})


def _sample() -> tuple[tuple[torch.Tensor, ...], dict]:
    rows = 2
    return ((torch.randn(rows, 16, generator=torch.Generator().manual_seed(0)),
             torch.ones(rows), torch.zeros(rows, dtype=torch.int32), torch.ones(rows),
             torch.zeros(rows), torch.arange(rows, dtype=torch.int32),
             torch.zeros(rows, dtype=torch.int32)), {})


def _cache() -> tuple[tuple[torch.Tensor, ...], dict]:
    return ((torch.ones(2, 1, 8), torch.ones(2, 1, 8), torch.zeros(2, 4, 1, 8),
             torch.zeros(2, 4, 1, 8), torch.tensor([0, 5], dtype=torch.int32)), {})


# Shipped ops with CPU kernels, one per shape of call: two inputs (simple_add), a declared
# backward (rms_norm), two outputs, integer inputs, an attribute, in-place updates (the
# Python eager kernel).
CALLS = {
    simple_add: lambda: ((torch.ones(4), torch.full((4,), 2.0)), {}),
    rms_norm: lambda: ((torch.ones(2, 8), torch.ones(8)), {}),
    fused_add_rms_norm: lambda: ((torch.ones(2, 8), torch.ones(2, 8), torch.ones(8)), {}),
    sample: _sample,
    fused_moe: _moe,
    reshape_and_cache: _cache,
}
OPS = list(CALLS)
DEVICES = ["cpu", "meta", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]


def _outputs(result: object) -> list[torch.Tensor]:
    if result is None:
        return []
    return list(result) if isinstance(result, tuple) else [result]


@settings(max_examples=60)
@given(op=st.sampled_from(OPS), device=st.sampled_from(DEVICES),
       odd=st.none() | st.tuples(st.integers(0, 6), st.sampled_from(DEVICES)),
       grad=st.booleans())
def test_devices_times_ops(op, device, odd, grad):
    """Every input on one device runs (outputs on that device); one input elsewhere
    raises OpInputError naming an input whose device differs: the meta one if any is on
    meta, else the odd one out (with two inputs the second, which the first's device is
    compared with)."""
    made, attrs = CALLS[op]()
    tensors = [t.to(device) for t in made]
    odd_index = None
    if odd is not None and odd[1] != device:
        odd_index = odd[0] % len(tensors)
        tensors[odd_index] = made[odd_index].to(odd[1])
    if grad and op is rms_norm:  # through the autograd gate's differentiable path
        tensors = [t.requires_grad_() for t in tensors]
    run = torch_op(op)
    if odd_index is None:
        for out in _outputs(run(*tensors, **attrs)):
            assert out.device == torch.device(device)
        return
    with pytest.raises(xk.OpInputError) as e:
        run(*tensors, **attrs)
    names = [t.name for t in op.inputs]
    assert e.value.op == op.name and e.value.arg in names and "Fix: " in str(e.value)
    named = tensors[names.index(e.value.arg)]
    assert str(e.value).startswith(f"{op.name}: argument '{e.value.arg}': is on {named.device}")
    if any(t.device.type == "meta" for t in tensors):
        assert named.device.type == "meta"
    elif len(tensors) > 2:
        assert e.value.arg == names[odd_index]
    else:
        assert e.value.arg == names[1]


# ------------------------------------------------------------------------ JAX

JAX_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    import xla_kernels as xk
    from xla_kernels.kernels.simple_add import simple_add

    cpu0, cpu1 = jax.devices("cpu")
    a = jax.device_put(jnp.ones(4), cpu0)
    b = jax.device_put(jnp.ones(4), cpu1)
    try:
        simple_add(a, b)
    except xk.OpInputError as e:
        print("EAGER", e)
    try:
        jax.jit(simple_add)(a, b)
    except ValueError as e:
        print("JIT", type(e).__name__, e)
    print("UNCOMMITTED", simple_add(jnp.ones(4), b).devices() == {cpu1})
""")


def test_jax_arrays_committed_to_different_devices_are_named():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", JAX_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    # Eager: the library names the op, the argument, both devices and the fix.
    assert lines["EAGER"] == (
        "EAGER xla_kernels.simple_add: argument 'b': is committed to cpu:1, while 'a' is "
        "committed to cpu:0. Fix: put every input on one device, e.g. "
        "jax.device_put(b, a.sharding)."), out
    # Under jit JAX refuses them itself, naming the op's arguments.
    assert "incompatible devices" in lines["JIT"] and "argument a of" in lines["JIT"] \
        and "argument b of" in lines["JIT"], out
    # An uncommitted array follows the committed one, as everywhere in JAX.
    assert lines["UNCOMMITTED"] == "UNCOMMITTED True", out


def test_numpy_inputs_are_not_committed(rng):
    a = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(np.asarray(simple_add(a, a)), 2 * a)
