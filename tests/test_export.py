"""xk.export / serialize / deserialize: a program using xla-kernels ops, loaded elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_kernels as xk
from xla_kernels.kernels.simple_add import simple_add

SRC = Path(xk.__file__).resolve().parents[1]
USER_MODULE = "xk_export_user_ops"

USER_OPS = '''
"""A user's op, declared outside xla-kernels."""
import xla_kernels as xk

scale_shift = xk.Op(
    "xk_user.scale_shift",
    inputs=[xk.Tensor("x", dtypes=("f32",))],
    outputs=lambda x: xk.like(x),
    kernels={"cpu": xk.Kernel(["scale_shift.cc"], handler="XkUserScaleShift")},
)
'''

USER_KERNEL = r'''
#include <cstdint>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
static ffi::Error Impl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> out) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  for (int64_t i = 0; i < n; ++i) out->typed_data()[i] = 2.0f * x.typed_data()[i] + 1.0f;
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkUserScaleShift, Impl,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
'''

# Run in a new interpreter: imports nothing but xla_kernels, loads, runs, prints JSON.
LOADER = textwrap.dedent('''
    import json, sys
    import numpy as np
    import xla_kernels as xk
    before = "xk_export_user_ops" in sys.modules
    try:
        prog = xk.deserialize(open(sys.argv[1], "rb").read())
    except xk.RegistrationError as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(3)
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    out = prog.call(a, b)
    print(json.dumps({"before": before, "after": "xk_export_user_ops" in sys.modules,
                      "registered": [r.target for r in xk.registrations()],
                      "out": np.asarray(out).tolist()}))
''')


def _add(a, b):
    return simple_add(a, b)


@pytest.fixture(scope="module")
def user_ops(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("user_ops")
    (folder / f"{USER_MODULE}.py").write_text(USER_OPS)
    (folder / "scale_shift.cc").write_text(USER_KERNEL)
    sys.path.insert(0, str(folder))
    try:
        import xk_export_user_ops

        yield folder, xk_export_user_ops
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def saved(user_ops, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, module = user_ops

    def f(a, b):
        return module.scale_shift(simple_add(a, b)) - a

    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    exported = xk.export(f, spec, spec, platforms=["cpu"])
    path = tmp_path_factory.mktemp("saved") / "program.xk"
    path.write_bytes(xk.serialize(exported))
    return path


def _load_in_fresh_process(path: Path, *extra_path: Path) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in (SRC, *extra_path)))
    proc = subprocess.run([sys.executable, "-c", LOADER, str(path)], env=env, cwd=path.parent,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    return proc.returncode, json.loads(lines[-1])


def test_plain_jax_export_refuses_the_op_without_the_checks():
    x = jnp.ones(3)
    with pytest.raises(ValueError, match=r"custom calls whose targets have no compatibility"):
        jax.export.export(jax.jit(_add))(x, x)


def test_export_allows_exactly_the_targets_the_program_uses():
    x = jnp.ones(3)
    exported = xk.export(_add, x, x, platforms=["cpu"])
    assert exported.ops == (xk.ExportedOp("xla_kernels.simple_add",
                                          "xla_kernels.kernels.simple_add", ("cpu",)),)
    assert exported.disabled_safety_checks == (
        jax.export.DisabledSafetyCheck.custom_call("xla_kernels.simple_add"),)
    assert exported.platforms == ("cpu",)
    np.testing.assert_array_equal(exported.call(x, 2 * x), np.full(3, 3.0, np.float32))


def test_export_accepts_a_jitted_function_and_keyword_arguments():
    def f(a, *, b):
        return simple_add(a, b) * 2

    x = jnp.arange(3.0)
    exported = xk.export(jax.jit(f), x, b=x)
    assert exported.targets == ("xla_kernels.simple_add",)
    np.testing.assert_array_equal(exported.call(x, b=x), 4 * np.arange(3.0))


def _symbolic(spec: str) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(jax.export.symbolic_shape(spec), jnp.float32)


def test_export_with_symbolic_shapes_runs_at_every_size():
    n = _symbolic("n")
    program = xk.deserialize(xk.serialize(xk.export(_add, n, n, platforms=["cpu"])))
    for size in (3, 7):
        x = jnp.arange(size, dtype=jnp.float32)
        np.testing.assert_array_equal(program.call(x, x), 2 * np.arange(size))


def _at_most_4(x: xk.Spec) -> xk.Spec:
    if x.shape[0] > 4:
        raise xk.Invalid("x", f"{x.shape[0]} rows, more than 4", "pass at most 4 rows")
    return xk.like(x)


at_most_4 = xk.Op("xk_tests.at_most_4", inputs=[xk.Tensor("x", ("f32",))],
                  outputs=_at_most_4, kernels=simple_add.kernels)


def test_a_shape_rule_comparing_a_symbolic_dimension_names_op_argument_and_fix():
    with pytest.raises(xk.OpInputError) as e:
        xk.export(at_most_4, _symbolic("n"))
    message = str(e.value)
    assert message.startswith(
        "xk_tests.at_most_4: argument 'x': the shape rule needs a concrete value of a "
        "symbolic dimension (shape (n,); JAX said: Symbolic dimension comparison 'n' > '4' ")
    assert message.endswith(
        "Fix: export with concrete sizes for this input, add the bound the rule tests to "
        "jax.export.symbolic_shape(..., constraints=[...]), or write the rule with arithmetic "
        "and == on dimensions only.")


def test_a_symbolic_dimension_with_the_rules_bound_as_a_constraint_exports():
    n = jax.ShapeDtypeStruct(jax.export.symbolic_shape("n", constraints=["n <= 4"]),
                             jnp.float32)
    assert xk.export(at_most_4, n).targets == ("xk_tests.at_most_4",)


def test_program_without_ops_round_trips():
    exported = xk.export(jnp.sin, jnp.ones(2))
    assert exported.ops == ()
    np.testing.assert_allclose(xk.deserialize(xk.serialize(exported)).call(jnp.ones(2)),
                               np.sin(np.ones(2)), rtol=1e-6)


def test_manifest_lists_each_op_and_its_declaring_module(saved: Path):
    ops, payload = xk.read_manifest(saved.read_bytes())
    assert ops == (xk.ExportedOp("xla_kernels.simple_add", "xla_kernels.kernels.simple_add",
                                 ("cpu",)),
                   xk.ExportedOp("xk_user.scale_shift", USER_MODULE, ("cpu",)))
    assert jax.export.deserialize(bytearray(payload)).platforms == ("cpu",)


@pytest.mark.slow
def test_round_trip_in_a_fresh_process(saved: Path, user_ops):
    folder, _ = user_ops
    rc, result = _load_in_fresh_process(saved, folder)
    assert rc == 0, result
    assert result["before"] is False and result["after"] is True
    assert result["registered"] == ["xk_user.scale_shift", "xla_kernels.simple_add"]
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    np.testing.assert_allclose(result["out"], 2 * (a + b) + 1 - a, rtol=0)


@pytest.mark.slow
def test_fresh_process_without_the_user_module_names_module_and_op(saved: Path):
    rc, result = _load_in_fresh_process(saved)
    assert rc == 3
    message = result["error"]
    assert message.startswith("xk_user.scale_shift: the exported program calls this op, which "
                              f"module '{USER_MODULE}' declares, and importing "
                              f"'{USER_MODULE}' failed (ModuleNotFoundError")
    assert "Fix: install the package that provides" in message and "PYTHONPATH" in message


def _with_ops(*ops: xk.ExportedOp) -> bytes:
    x = jnp.ones(3)
    return xk.serialize(xk.ExportedProgram(xk.export(_add, x, x).exported, ops))


def test_unimportable_module_is_a_registration_error():
    data = _with_ops(xk.ExportedOp("xk_tests.absent", "no_such_module_xk", ("cpu",)))
    with pytest.raises(xk.RegistrationError,
                       match=r"^xk_tests\.absent: .*module 'no_such_module_xk'.* Fix: "):
        xk.deserialize(data)


def test_module_that_no_longer_declares_the_op_is_a_registration_error():
    data = _with_ops(xk.ExportedOp("xk_tests.renamed_away", "json", ("cpu",)))
    with pytest.raises(xk.RegistrationError,
                       match=r"^xk_tests\.renamed_away: module 'json' was imported but declares "
                             r"no op 'xk_tests\.renamed_away'.*Fix: import the module"):
        xk.deserialize(data)


def test_op_declared_in_main_cannot_be_serialized():
    x = jnp.ones(3)
    program = xk.ExportedProgram(xk.export(_add, x, x).exported,
                                 (xk.ExportedOp("xk_tests.scripted", "__main__", ("cpu",)),))
    with pytest.raises(xk.OpDeclarationError,
                       match=r"^xk_tests\.scripted: it is declared in __main__.*Fix: move the "
                             r"op's declaration into an importable module"):
        xk.serialize(program)


def test_plain_jax_bytes_are_rejected_with_the_fix():
    x = jnp.ones(3)
    raw = xk.export(_add, x, x).exported.serialize()
    with pytest.raises(xk.ExportFormatError,
                       match=r"^deserialize: argument 'data': not an xla-kernels export.*"
                             r"Fix: pass bytes from xla_kernels\.serialize"):
        xk.deserialize(raw)


def test_damaged_manifest_is_a_format_error():
    data = _with_ops()
    damaged = data[:25]
    with pytest.raises(xk.ExportFormatError, match=r"manifest is damaged.*Fix: serialize"):
        xk.deserialize(damaged)


def test_unknown_platform_argument_is_named():
    x = jnp.ones(3)
    data = xk.serialize(xk.export(_add, x, x))
    with pytest.raises(xk.RegistrationError, match=r"argument 'platforms': unknown platforms "
                                                   r"\['tpu'\]. Fix: pass some of cpu, cuda"):
        xk.deserialize(data, platforms=["tpu"])


def test_deserialized_program_is_registered_for_the_requested_platforms():
    x = jnp.ones(3)
    prog = xk.deserialize(xk.serialize(xk.export(_add, x, x)), platforms=["cpu"])
    assert prog.ops[0].target == "xla_kernels.simple_add"
    assert "custom_call @xla_kernels.simple_add" in prog.mlir_module()
    np.testing.assert_array_equal(prog.call(x, x), np.full(3, 2.0, np.float32))
