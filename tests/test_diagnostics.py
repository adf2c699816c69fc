"""Errors a user meets at run time: unregistered targets, compile errors, and `doctor`."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import xla_kernels as xk
from xla_kernels import cli
from xla_kernels.diagnostics import explain, explained_errors

unregistered = xk.Op("xk_tests.never_registered", inputs=[xk.Tensor("x", ("f32",))],
                     outputs=xk.like,
                     kernels={"cpu": xk.Kernel(["fixtures/broken/broken.cc"], "Nothing")})


def _run_raw_ffi_call(target: str) -> None:
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((3,), jnp.float32))
    jax.block_until_ready(jax.jit(call)(jnp.ones(3)))


def test_unregistered_xla_kernels_op_is_explained_with_the_fix():
    with pytest.raises(xk.RegistrationError) as e, explained_errors():
        _run_raw_ffi_call("xk_tests.never_registered")
    message = str(e.value)
    assert message.startswith("xk_tests.never_registered: no handler is registered for "
                              "platform cpu in this process")
    assert "xla_kernels.ensure_registered(op, 'cpu')" in message


def test_unknown_target_is_explained_with_doctor():
    with pytest.raises(xk.RegistrationError, match=r"xla-kernels doctor nobody\.knows"), \
            explained_errors():
        _run_raw_ffi_call("nobody.knows")


def test_other_errors_pass_through_unchanged():
    assert explain(ValueError("something else")) is None
    with pytest.raises(ValueError, match="something else"), explained_errors():
        raise ValueError("something else")


def test_gpu_wording_of_the_error_is_recognized():
    err = RuntimeError("No registered implementation for FFI custom call to "
                       "xk_tests.never_registered for platform CUDA")
    assert "has kernels for cpu only" in str(explain(err))


def test_compile_error_names_the_op_file_and_line():
    with pytest.raises(xk.BuildError) as e:
        unregistered(jnp.ones(3))
    message = str(e.value)
    assert "xk_tests.never_registered" in message
    assert "broken.cc:4" in message and "undefined_name" in message


def test_doctor_registers_a_shipped_op(capsys):
    assert cli.main(["doctor", "xla_kernels.simple_add", "--register"]) == 0
    out = capsys.readouterr().out
    assert "register cpu" in out and "ok: XlaKernelsSimpleAddCpu" in out
    assert "xla_kernels.simple_add [cpu]" in out


def test_doctor_on_an_unknown_target_says_what_to_do(capsys):
    assert cli.main(["doctor", "no.such_op"]) == 1
    assert "import the module that declares 'no.such_op'" in capsys.readouterr().out


def test_doctor_says_once_that_a_package_ships_no_prebuilt_libraries(capsys):
    assert cli.main(["doctor"]) == 0
    assert capsys.readouterr().out.count("ships no prebuilt libraries") <= 1


def test_doctor_lists_the_runtimes(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "jax" in out and "default backend" in out
    assert "torchax" in out and "torch_xla" in out
    assert "xla_kernels.paged_attention" in out and "xla_kernels.simple_add" in out


def _doctor_row(capsys, name: str) -> str:
    assert cli.main(["doctor"]) == 0
    return next(line for line in capsys.readouterr().out.splitlines()
                if line.split() and line.split()[0] == name)


def test_doctor_torchax_row_says_what_a_plain_import_does(capsys):
    plain = subprocess.run([sys.executable, "-c", "import torchax"], capture_output=True)
    row = _doctor_row(capsys, "torchax")
    assert ("a plain `import torchax` fails" in row) == (plain.returncode != 0), row


def test_doctor_names_the_fix_when_only_the_workaround_imports_torchax(capsys, monkeypatch):
    monkeypatch.setattr(cli, "plain_torchax_import", lambda: (
        False, "AttributeError: The underlying op of 'aten.prod' has no overload name "
               "'dim_Dimname'"))
    row = _doctor_row(capsys, "torchax")
    assert "but a plain `import torchax` fails with torch " in row
    assert "no overload name 'dim_Dimname'" in row
    assert "Fix: install torch<2.13" in row and "import_torchax()" in row


def test_undeclared_target_fix_gives_the_import_and_the_register_step():
    err = RuntimeError("No FFI handler registered for xk_tests.declared_nowhere on a platform "
                       "Host (canonical host)")
    message = str(explain(err))
    assert "(1) import the module that declares it, then (2) register its handler: call " \
           "xla_kernels.ensure_registered(op, 'cpu') with that op, or call the op once" in message
    assert "`xla-kernels doctor xk_tests.declared_nowhere --import MODULE --register` checks " \
           "both" in message
    assert "xla_kernels.deserialize does both steps by itself" in message


def test_declared_target_fix_names_its_module():
    err = RuntimeError("No FFI handler registered for xk_tests.never_registered on a platform "
                       "Host")
    assert str(explain(err)).endswith(f"The op is declared in module {__name__}.")


PLAIN_JAX_LOADER = '''
import sys
import jax, numpy as np
import xla_kernels as xk
prog = jax.export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
x = np.ones(3, np.float32)
try:
    with xk.explained_errors():
        jax.block_until_ready(prog.call(x, x))
except xk.RegistrationError as e:
    print("explained:", e)
import xla_kernels.kernels.simple_add as m   # step 1 of the fix
xk.ensure_registered(m.simple_add, "cpu")    # step 2 of the fix
print("after fix:", np.asarray(prog.call(x, x)).tolist())
'''


@pytest.mark.slow
def test_following_the_explained_fix_runs_a_plain_jax_export(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from xla_kernels.kernels.simple_add import simple_add

    x = jnp.ones(3)
    path = tmp_path / "plain.jax"
    path.write_bytes(xk.export(simple_add, x, x).exported.serialize())
    env = dict(os.environ, PYTHONPATH=str(Path(xk.__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", PLAIN_JAX_LOADER, str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("explained: xla_kernels.simple_add: no handler is registered for platform cpu in "
            "this process") in proc.stdout
    assert "after fix: [2.0, 2.0, 2.0]" in proc.stdout


def test_the_pinned_torch_imports_torchax_plainly():
    """`make demo` / `make test` pin torch below 2.13 (Makefile TORCH_SPEC, the torchax
    extra), where a plain `import torchax` works and doctor says nothing is wrong."""
    import importlib.metadata

    from packaging.version import Version

    pytest.importorskip("torchax")
    torch_version = Version(importlib.metadata.version("torch"))
    if torch_version >= Version("2.13"):
        pytest.skip(f"torch {torch_version} is outside the pin (<2.13): the two tests above "
                    "cover what doctor says there")
    plain = subprocess.run([sys.executable, "-c", "import torchax, torchax.ops.jaten"],
                           capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr[-2000:]


def test_makefile_and_extra_pin_a_torch_torchax_imports_under():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = next(line for line in (root / "Makefile").read_text().splitlines()
                if line.startswith("TORCH_SPEC ?="))
    assert spec.split("==")[1].startswith("2.12"), spec
    assert '"torch>=2.5,<2.13"' in (root / "pyproject.toml").read_text()
