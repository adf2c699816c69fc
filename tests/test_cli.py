"""The xla-kernels command: user modules in doctor, clean errors, readable output and help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import xla_kernels as xk
from xla_kernels import cli

SRC = Path(xk.__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ECHO = FIXTURES / "attrs_echo" / "attrs_echo.cc"
BROKEN = FIXTURES / "broken" / "broken.cc"

# A user's ops module: one op on an existing test kernel, declared under a unique target.
USER_OPS = '''
import numpy as np

import xla_kernels as xk

echo = xk.Op(
    "{target}",
    inputs=[xk.Tensor("x", dtypes=("f32",), rank=1)],
    attrs=[xk.Attr("i", int), xk.Attr("i32", np.int32), xk.Attr("f", float),
           xk.Attr("d", np.float64), xk.Attr("b", bool), xk.Attr("s", str),
           xk.Attr("ints", list[int]), xk.Attr("floats", list[float]),
           xk.Attr("raw", bytes, default=b"")],
    outputs=lambda x, **_: xk.Spec((32,), "f64"),
    kernels={{"cpu": xk.Kernel([{source!r}], handler="{handler}")}},
)
'''


@pytest.fixture
def isolated_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))


def _user_module(folder: Path, name: str, target: str, source: Path = ECHO,
                 handler: str = "AttrsEcho") -> Path:
    path = folder / f"{name}.py"
    path.write_text(USER_OPS.format(target=target, source=str(source), handler=handler))
    return path


def _cli(*argv: str, extra_path: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    paths = [str(SRC)] + ([str(extra_path)] if extra_path else [])
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **(env or {}))
    return subprocess.run([sys.executable, "-m", "xla_kernels.cli", *argv], env=full_env,
                          capture_output=True, text=True, timeout=300)


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("xla-kernels: ")]
    assert len(lines) == 1, err  # one message, no traceback
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.slow
def test_doctor_imports_a_user_module_file_and_registers_its_op(tmp_path: Path):
    path = _user_module(tmp_path, "xk_cli_file_ops", "xk_cli.file_echo")
    proc = _cli("doctor", "xk_cli.file_echo", "--import", str(path), "--register")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(rf"^  {re.escape(str(path))}\s+xk_cli_file_ops$", out, re.MULTILINE)
    assert re.search(r"^  declared\s+yes, in module xk_cli_file_ops, kernels for cpu$", out,
                     re.MULTILINE)
    assert re.search(r"^  register cpu\s+ok: AttrsEcho from ", out, re.MULTILINE)
    assert re.search(r"^  xk_cli\.file_echo \[cpu\]\s+AttrsEcho \(jax\) from ", out, re.MULTILINE)


def test_doctor_imports_a_user_module_by_name(tmp_path: Path, isolated_path, capsys):
    _user_module(tmp_path, "xk_cli_named_ops", "xk_cli.named_echo")
    sys.path.insert(0, str(tmp_path))
    assert cli.main(["doctor", "xk_cli.named_echo", "--import", "xk_cli_named_ops"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  xk_cli\.named_echo\s+cpu\s+xk_cli_named_ops$", out, re.MULTILINE)
    assert "declared  yes, in module xk_cli_named_ops" in out
    assert "Pass --register to build and register it now." in out


def test_doctor_without_import_says_to_import_and_register(capsys):
    assert cli.main(["doctor", "xk_cli.nowhere"]) == 1
    out = capsys.readouterr().out
    assert ("fix: import the module that declares 'xk_cli.nowhere': run xla-kernels doctor "
            "xk_cli.nowhere --import MODULE (a module name or a .py file), and add --register "
            "to build and register it.") in out


def test_doctor_says_which_imported_modules_lack_the_target(capsys):
    assert cli.main(["doctor", "xk_cli.elsewhere", "--import", "ops"]) == 1
    assert "  imported ops, which declare no op 'xk_cli.elsewhere'" in capsys.readouterr().out


def test_doctor_import_of_a_missing_module_is_one_clean_error(capsys):
    assert cli.main(["doctor", "--import", "xk_cli_no_such_module"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert _error_line(captured.err) == (
        "xla-kernels doctor: error: --import xk_cli_no_such_module: cannot import module "
        "'xk_cli_no_such_module' (No module named 'xk_cli_no_such_module'). Fix: install its "
        "package or add its folder to PYTHONPATH, or pass the path of the .py file")


def test_doctor_import_of_a_missing_file_is_one_clean_error(tmp_path: Path, capsys):
    missing = tmp_path / "nope.py"
    assert cli.main(["doctor", "--import", str(missing)]) == 1
    assert _error_line(capsys.readouterr().err) == (
        f"xla-kernels doctor: error: --import {missing}: no such file. Fix: pass the path of "
        "a .py file that declares your ops, or a module name such as my_pkg.ops")


def test_doctor_import_of_a_module_with_a_bad_declaration(tmp_path: Path, isolated_path,
                                                           capsys):
    (tmp_path / "xk_cli_bad_decl.py").write_text(
        'import xla_kernels as xk\nxk.Op("bad name!", inputs=[], outputs=xk.like, kernels={})\n')
    assert cli.main(["doctor", "--import", str(tmp_path / "xk_cli_bad_decl.py")]) == 1
    line = _error_line(capsys.readouterr().err)
    assert line.startswith(f"xla-kernels doctor: error: --import {tmp_path}/xk_cli_bad_decl.py: "
                           "importing module 'xk_cli_bad_decl' failed: bad name!: the op name "
                           "must be a valid custom-call target. Fix: use letters")


def test_doctor_output_is_aligned_text_without_python_reprs(capsys):
    assert cli.main(["doctor", "xla_kernels.simple_add", "--register"]) == 0
    out = capsys.readouterr().out
    for marker in ("{'", "['", "PosixPath(", "Registration("):
        assert marker not in out
    section: list[str] = []
    for line in [*out.splitlines(), "end:"]:
        if not line.startswith("  "):  # a section title: check the previous section
            columns = {len(re.match(r"  (.*?\S)  +\S", row).group(0)) - 1
                       for row in section if re.match(r"  (.*?\S)  +\S", row)}
            assert len(columns) <= 1, section
            section = []
        elif not line.startswith("  fix:") and not line.startswith("  registration is"):
            section.append(line)
    assert re.search(r"^  CUDA archs\s+(sm_\d+|none)", out, re.MULTILINE)


@pytest.mark.parametrize("argv", [[], ["doctor"], ["build"]])
def test_help_is_plain_text(argv: list[str], capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: xla-kernels")
    assert "``" not in text and not re.search(r":(func|class|mod|meth):", text)


def test_build_of_a_missing_module_is_one_clean_error(capsys):
    assert cli.main(["build", "xk_cli_no_such_module:op"]) == 1
    assert _error_line(capsys.readouterr().err).startswith(
        "xla-kernels build: error: op path 'xk_cli_no_such_module:op': cannot import module "
        "'xk_cli_no_such_module'")


def test_build_of_a_missing_variable_lists_the_ops(capsys):
    assert cli.main(["build", "xla_kernels.kernels.simple_add:nope"]) == 1
    assert _error_line(capsys.readouterr().err) == (
        "xla-kernels build: error: op path 'xla_kernels.kernels.simple_add:nope': module "
        "'xla_kernels.kernels.simple_add' has no variable 'nope'. Fix: write "
        "xla_kernels.kernels.simple_add:OP_VARIABLE (ops in that module: simple_add)")


def test_build_of_something_that_is_not_an_op(capsys):
    assert cli.main(["build", "xla_kernels.kernels.simple_add:__all__"]) == 1
    assert "'__all__' in module 'xla_kernels.kernels.simple_add' is a list, not an " \
           "xla_kernels.Op" in _error_line(capsys.readouterr().err)


def test_build_for_a_platform_without_a_kernel(capsys):
    assert cli.main(["build", "ops:seeds_legacy_add", "--platform", "cpu"]) == 1
    assert _error_line(capsys.readouterr().err) == (
        "xla-kernels build: error: xk_tests.seeds_legacy_add: --platform cpu: the op has no "
        "kernel for cpu. Fix: pass --platform cuda")


def test_build_error_is_one_clean_message_naming_file_and_line(tmp_path: Path, capsys):
    path = _user_module(tmp_path, "xk_cli_broken_ops", "xk_cli.broken", source=BROKEN,
                        handler="Nothing")
    assert cli.main(["build", f"{path}:echo"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("xla-kernels build: error: ")
    assert "broken.cc:4" in err and "undefined_name" in err


@pytest.mark.slow
def test_missing_compiler_is_one_clean_message(tmp_path: Path):
    source = tmp_path / "fresh.cc"  # not in any cache: the build must look for a compiler
    source.write_text(ECHO.read_text() + "\n// fresh\n")
    path = _user_module(tmp_path, "xk_cli_nocxx_ops", "xk_cli.nocxx", source=source)
    proc = _cli("build", f"{path}:echo", env={"CXX": "/nonexistent/xk-g++",
                                              "XLA_KERNELS_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 1
    line = _error_line(proc.stderr)
    assert line.startswith("xla-kernels build: error: ") and "/nonexistent/xk-g++" in line


def test_registration_error_is_one_clean_message(tmp_path: Path, isolated_path, capsys):
    (tmp_path / "xk_cli_reg_ops.py").write_text(
        USER_OPS.format(target="xk_cli.reg_echo", source=str(ECHO), handler="AttrsEcho")
        + 'xk.ensure_registered(echo, "cpu", runtime="nope")\n')
    assert cli.main(["doctor", "--import", str(tmp_path / "xk_cli_reg_ops.py")]) == 1
    assert "xk_cli.reg_echo: unknown runtime 'nope'. Fix: use 'jax'" in _error_line(
        capsys.readouterr().err)
