"""Handler stages and state (docs/stages.md): declaring stage handlers and FFI types,
JAX on the CPU (one state per compiled custom call), eager torch on the CPU (one state per
attribute values), the prepare/initialize stages, and every error's message.

Fixtures: tests/fixtures/stages/state_cpu.cc (instantiate makes a state holding
10 * factor and a serial number; execute writes x * value and the serial; prepare and
initialize count their runs) and state_cuda.cu (the same on CUDA, compile-only here).
"""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.errors import OpDeclarationError, RegistrationError
from xla_kernels.runtime import eager, kernel_of
from xla_kernels.runtime.eager import KernelError
from xla_kernels.runtime.registry import ensure_registered

STAGES = Path(__file__).parent / "fixtures" / "stages"
CPU_SOURCE = str(STAGES / "state_cpu.cc")
INSTANTIATED, DESTROYED, PREPARED, INITIALIZED, EXECUTED = range(5)


def _rule(x, *, factor):
    return xk.like(x), xk.Spec((1,), "i32")


def _types(name):
    return {name: {"type_id": "XkStagesScaleStateId", "type_info": "XkStagesScaleStateInfo"}}


def _scale_op(target, *, stages=("instantiate",), type_name=None, **handlers):
    symbols = {"instantiate": "XkStagesInstantiate", "prepare": "XkStagesPrepare",
               "initialize": "XkStagesInitialize"}
    handler = {s: symbols[s] for s in stages} | {"execute": "XkStagesExecute"} | handlers
    return xk.Op(target, inputs=[xk.Tensor("x", ("f32",), rank=1)],
                 attrs=[xk.Attr("factor", float)], outputs=_rule,
                 output_names=("out", "serial"),
                 kernels={"cpu": xk.Kernel([CPU_SOURCE], handler=handler,
                                           types=_types(type_name or f"{target}.State"),
                                           defines={"XK_TEST_COPY": target.replace(".", "_")})})


# One library copy per op (a define per op makes their builds differ: equal builds would
# share one library), so each op's counters and type ids are its own.
scale = _scale_op("xk_tests.stages_scale")
scale_all = _scale_op("xk_tests.stages_all", stages=("instantiate", "prepare", "initialize"))


class Counters:
    """The fixture library's stage counters (the library the op's record loaded)."""

    def __init__(self, op):
        self.kernel = kernel_of(op, "cpu")
        self.lib = ctypes.CDLL(str(self.kernel.library))  # the same handle: dlopen refcounts
        self.lib.XkStagesCount.restype = ctypes.c_int64
        self.lib.XkStagesCount.argtypes = [ctypes.c_int32]

    def __getitem__(self, which):
        return self.lib.XkStagesCount(which)

    def snapshot(self):
        return [self[i] for i in range(5)]


# ------------------------------------------------------------------------ declaration


def test_a_stage_dict_keeps_handler_as_the_execute_symbol():
    k = scale.kernels["cpu"]
    assert k.handler == "XkStagesExecute"
    assert k.stages == {"instantiate": "XkStagesInstantiate", "execute": "XkStagesExecute"}
    assert k.stateful and not xk.Kernel(["a.cc"], handler="A").stateful
    assert xk.Kernel(["a.cc"], handler="A").stages == {"execute": "A"}
    assert k.types == {"xk_tests.stages_scale.State": {
        "type_id": "XkStagesScaleStateId", "type_info": "XkStagesScaleStateInfo"}}
    assert xk.Kernel(["a.cc"], "A", types={"t": "TId"}).types == {
        "t": {"type_id": "TId", "type_info": None}}


def test_unknown_stage_name_is_refused():
    with pytest.raises(OpDeclarationError, match=r"unknown stage 'instanciate'.*Fix: name "
                       r"handlers for stages instantiate, prepare, initialize, execute"):
        xk.Kernel(["a.cc"], handler={"instanciate": "I", "execute": "E"})


def test_a_stage_dict_needs_an_execute_handler():
    with pytest.raises(OpDeclarationError, match=r"has no execute stage.*Fix: handler="
                       r"\{\"instantiate\": \"MyInstantiate\", \"execute\": \"MyExecute\"\}"):
        xk.Kernel(["a.cc"], handler={"instantiate": "I"})


def test_a_stage_symbol_must_be_an_identifier():
    with pytest.raises(OpDeclarationError, match=r"the prepare handler 'my-prep' is not a C "
                       r"identifier"):
        xk.Kernel(["a.cc"], handler={"prepare": "my-prep", "execute": "E"})


def test_a_bad_types_entry_is_refused():
    with pytest.raises(OpDeclarationError, match=r"Kernel types: bad entry 'S'.*Fix: write "
                       r"types=\{\"my_lib.MyState\": \"MyStateTypeId\"\}"):
        xk.Kernel(["a.cc"], handler="E", types={"S": {"id": "SId"}})


def test_a_missing_stage_symbol_names_the_stage_and_the_fix():
    op = _scale_op("xk_tests.stages_missing_stage", instantiate="NoSuchInstantiate")
    with pytest.raises(RegistrationError, match=r"xk_tests.stages_missing_stage: the cpu "
                       r"library built from \['state_cpu.cc'\] has no symbol "
                       r"'NoSuchInstantiate' \(its instantiate handler\). Fix: define it with "
                       r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(NoSuchInstantiate, ...\), or correct "
                       r"handler=\{'instantiate': ...\} in Kernel"):
        kernel_of(op, "cpu")


def test_a_missing_type_id_symbol_names_the_type_and_the_fix():
    op = xk.Op("xk_tests.stages_missing_type", inputs=[xk.Tensor("x", ("f32",), rank=1)],
               attrs=[xk.Attr("factor", float)], outputs=_rule,
               kernels={"cpu": xk.Kernel([CPU_SOURCE], handler="XkStagesExecute",
                                         types={"xk_tests.Nope": "NoSuchTypeId"})})
    with pytest.raises(RegistrationError, match=r"has no symbol 'NoSuchTypeId' \(the type_id "
                       r"of FFI type 'xk_tests.Nope'\). Fix: define the function with "
                       r"XLA_FFI_DECLARE_TYPE_ID_SYMBOL\(NoSuchTypeId\), or correct "
                       r"Kernel\(types=...\)"):
        kernel_of(op, "cpu")


def test_loaded_kernel_keeps_address_as_execute_and_lists_every_stage():
    kernel = kernel_of(scale_all, "cpu")
    lib = ctypes.CDLL(str(kernel.library))
    assert kernel.address == ctypes.cast(lib.XkStagesExecute, ctypes.c_void_p).value
    addresses = kernel.stage_addresses()
    assert list(addresses) == ["instantiate", "prepare", "initialize", "execute"]
    assert addresses["prepare"] == ctypes.cast(lib.XkStagesPrepare, ctypes.c_void_p).value
    assert [t.name for t in kernel.types] == ["xk_tests.stages_all.State"]


def test_one_type_name_for_two_type_objects_is_refused():
    # Two libraries (one per op), each with its own ScaleState::id, under one type name.
    first = _scale_op("xk_tests.stages_type_a", type_name="xk_tests.shared")
    second = _scale_op("xk_tests.stages_type_b", type_name="xk_tests.shared")
    ensure_registered(first, "cpu")
    with pytest.raises(RegistrationError, match=r"xk_tests.stages_type_b: the FFI type "
                       r"'xk_tests.shared' is already registered for cpu by "
                       r"xk_tests.stages_type_a .*Fix: give each state type its own name"):
        ensure_registered(second, "cpu")


# ------------------------------------------------------------------------ JAX on the CPU


def test_jax_makes_one_state_per_compiled_custom_call():
    counts = Counters(scale)
    x = jnp.arange(4, dtype=jnp.float32)
    before = counts[INSTANTIATED]

    def f(x, factor):
        return scale(x, factor=factor)

    out, serial = jax.jit(f, static_argnums=1)(x, 2.0)
    np.testing.assert_array_equal(out, np.arange(4) * 20.0)
    assert counts[INSTANTIATED] == before + 1
    # The cached executable keeps its state: a second run makes none.
    _, serial2 = jax.jit(f, static_argnums=1)(x, 2.0)
    assert int(serial2[0]) == int(serial[0]) and counts[INSTANTIATED] == before + 1
    # Other attributes: another executable, another state.
    out3, serial3 = jax.jit(f, static_argnums=1)(x, 3.0)
    np.testing.assert_array_equal(out3, np.arange(4) * 30.0)
    assert int(serial3[0]) == before + 2
    # Two custom calls in one program: a state each.
    _, s1, _, s2 = jax.jit(lambda x: (*f(x, 1.0), *f(x + 1, 1.0)))(x)
    assert int(s1[0]) != int(s2[0]) and counts[INSTANTIATED] == before + 4


def test_jax_deletes_states_with_the_executable():
    counts = Counters(scale)
    destroyed = counts[DESTROYED]
    g = jax.jit(lambda x: scale(x, factor=7.0))
    g(jnp.ones(3, jnp.float32))[0].block_until_ready()
    del g
    jax.clear_caches()
    gc.collect()
    assert counts[DESTROYED] > destroyed  # through the type's XLA_FFI_TypeInfo deleter


def test_jax_cpu_runs_instantiate_and_execute_only():
    """Observed with jaxlib 0.10 (XLA FFI API 0.3): the CPU runtime calls neither prepare
    nor initialize; the GPU runtime calls them before each execution."""
    counts = Counters(scale_all)
    before = counts.snapshot()
    out, _ = jax.jit(lambda x: scale_all(x, factor=0.5))(jnp.ones(2, jnp.float32))
    np.testing.assert_array_equal(out, [5.0, 5.0])
    after = counts.snapshot()
    assert after[INSTANTIATED] == before[INSTANTIATED] + 1
    assert after[PREPARED] == before[PREPARED] and after[INITIALIZED] == before[INITIALIZED]


# ------------------------------------------------------------------------ eager torch


@pytest.fixture
def torch_call():
    torch = pytest.importorskip("torch")
    from xla_kernels.frontends.torch import call

    return torch, call


def test_torch_eager_makes_one_state_per_attribute_values(torch_call):
    torch, call = torch_call
    op = _scale_op("xk_tests.stages_torch")
    counts = Counters(op)
    address = counts.kernel.address
    x = torch.arange(5, dtype=torch.float32)
    out, serial = call(op, x, factor=2.0)
    torch.testing.assert_close(out, x * 20.0)
    assert counts[INSTANTIATED] == 1 and int(serial[0]) == 1
    out, serial = call(op, x, factor=2.0)
    assert counts[INSTANTIATED] == 1 and int(serial[0]) == 1 and counts[EXECUTED] == 2
    out, serial = call(op, x, factor=0.25)
    torch.testing.assert_close(out, x * 2.5)
    assert int(serial[0]) == 2 and eager.state_count(address) == 2

    # Redeclaring the op (same kernel) deletes its states; the next call makes a new one.
    _scale_op("xk_tests.stages_torch")
    assert eager.state_count(address) == 0 and counts[DESTROYED] == 2
    _, serial = call(op, x, factor=2.0)
    assert int(serial[0]) == 3


def test_torch_eager_runs_prepare_and_initialize_once_per_state(torch_call):
    torch, call = torch_call
    counts = Counters(scale_all)
    before = counts.snapshot()
    x = torch.ones(3)
    for _ in range(3):
        out, _ = call(scale_all, x, factor=1.5)
    torch.testing.assert_close(out, x * 15.0)
    after = counts.snapshot()
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0, 1, 1, 3]


def test_torch_eager_instantiate_error_names_the_stage(torch_call):
    torch, call = torch_call
    address = kernel_of(scale, "cpu").address
    states = eager.state_count(address)
    with pytest.raises(KernelError, match=r"xk_tests.stages_scale: kernel failed: "
                       r"instantiate stage: factor must be >= 0"):
        call(scale, torch.ones(2), factor=-1.0)
    assert eager.state_count(address) == states  # nothing kept


def test_eager_state_type_without_an_instantiate_handler_is_an_error(torch_call):
    torch, call = torch_call
    op = _scale_op("xk_tests.stages_no_instantiate", stages=())  # types, execute only
    assert op.kernels["cpu"].stateful
    with pytest.raises(KernelError, match=r"(?s)xk_tests.stages_no_instantiate: kernel failed: "
                       r".*no instantiate state is set: declare an instantiate handler "
                       r"that returns one \(Kernel\(handler=\{'instantiate': ..., "
                       r"'execute': ...\}\)\)"):
        call(op, torch.ones(2), factor=1.0)


# ------------------------------------------------------------------------ CUDA


@requires_nvcc
def test_cuda_state_fixture_compiles(tmp_path):
    path = builder.build_library("xk_tests.stages_cuda", [STAGES / "state_cuda.cu"],
                                 platform="cuda", cuda_archs=["90"], cache_dir=tmp_path)
    lib = ctypes.CDLL(str(path))
    for symbol in ("XkStagesCudaInstantiate", "XkStagesCudaExecute",
                   "XkStagesCudaScaleStateId", "XkStagesCudaScaleStateInfo"):
        assert getattr(lib, symbol)
    meta = eager.handler_metadata(lib.XkStagesCudaExecute)
    assert meta.api_version == eager.ffi_api_version()
