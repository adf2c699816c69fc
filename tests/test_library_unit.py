"""A compiled library is the unit of build: ops declared from one source set share one .so.

Fixtures in fixtures/library_unit/: ``counters.cc`` has three handlers that share one static
counter and a nanobind registration block; ``counters_pybind11.cc`` is the pybind11
flavour. Each test uses its own cache folder, hence its own library file and its own fresh
copy of the counter (a library is loaded once per path).
"""

from __future__ import annotations

import ctypes
import itertools
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

import xla_kernels as xk
from xla_kernels import cli
from xla_kernels.builder import build_library, compat_include_dir, find_cxx, find_nvcc
from xla_kernels.errors import (
    BuildError,
    CompilerNotFoundError,
    OpDeclarationError,
    RegistrationError,
)
from xla_kernels.frontends.torch import torch_op
from xla_kernels.runtime import kernel_of
from xla_kernels.runtime.library import library_name, load_library, loaded_libraries

FIXTURES = Path(__file__).parent / "fixtures" / "library_unit"
COUNTERS = {"bump_a": "LuBumpA", "bump_b": "LuBumpB", "peek": "LuPeek"}
PYBIND11_COUNTERS = {"bump": "LuPyBump", "read": "LuPyRead"}
_prefixes = itertools.count()


def declare(source: str, handlers: dict[str, str], **options: object) -> dict[str, xk.Op]:
    """One op per handler, all from ``source`` with the same build settings."""
    prefix = f"xk_tests.library_unit_{next(_prefixes)}"
    return {name: xk.Op(f"{prefix}.{name}", inputs=[xk.Tensor("x", ("f32",))],
                        outputs=lambda x: xk.like(x),
                        kernels={"cpu": xk.Kernel([FIXTURES / source], handler, **options)})
            for name, handler in handlers.items()}


def run_jax(op: xk.Op) -> np.ndarray:
    return np.asarray(jax.jit(op)(np.zeros(2, np.float32)))


def run_torch(op: xk.Op) -> np.ndarray:
    return torch_op(op)(torch.zeros(2)).numpy()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache folder, and a g++ wrapper that logs each link (one per build)."""
    log = tmp_path / "links.log"
    cxx = tmp_path / "logging-g++"
    cxx.write_text(f'#!/bin/sh\ncase " $* " in *" -shared "*) echo link >> {log};; esac\n'
                   f'exec {find_cxx()} "$@"\n')
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("XLA_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def builds(cache: Path) -> int:
    log = cache.parent / "links.log"
    return len(log.read_text().split()) if log.exists() else 0


def artifacts(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("*.so"))


# --------------------------------------------------------------------------- one build


def test_three_ops_from_one_source_share_one_build_and_one_handle(cache):
    ops = declare("counters.cc", COUNTERS)
    loaded = [kernel_of(op, "cpu") for op in ops.values()]
    assert builds(cache) == 1
    assert len({k.library for k in loaded}) == 1
    (so,) = artifacts(cache)
    assert so.startswith("counters-cpu-")  # named after the first source
    assert len(list(cache.glob("*.json"))) == 1
    assert [k.handler for k in loaded] == list(COUNTERS.values())
    path = loaded[0].library
    assert loaded_libraries().count(path) == 1
    assert load_library(path, "any") is load_library(path, "other")
    # An op declared later from the same sources reuses the build and the handle.
    again = kernel_of(declare("counters.cc", {"late": "LuPeek"})["late"], "cpu")
    assert again.library == path and builds(cache) == 1


def test_other_build_settings_make_another_library(cache):
    plain = declare("counters.cc", {"a": "LuBumpA"})["a"]
    tuned = declare("counters.cc", {"a": "LuBumpA"}, defines={"LU_TUNED": "1"})["a"]
    flagged = declare("counters.cc", {"a": "LuBumpA"}, flags=("-O2",))["a"]
    libraries = {kernel_of(op, "cpu").library for op in (plain, tuned, flagged)}
    assert len(libraries) == 3 and builds(cache) == 3
    # Separate libraries, separate counters.
    assert run_jax(plain).tolist() == [1.0, 1.0]
    assert run_jax(tuned).tolist() == [1.0, 1.0]


def test_library_name_is_the_first_sources_stem():
    kernel = xk.Kernel(["kernels/counters.cc", "util.cc"], handler="LuBumpA")
    assert library_name(kernel) == "counters"


# --------------------------------------------------------------------------- static state


def test_static_state_is_shared_through_jax(cache):
    ops = declare("counters.cc", COUNTERS)
    assert run_jax(ops["bump_a"]).tolist() == [1.0, 1.0]
    assert run_jax(ops["bump_a"]).tolist() == [2.0, 2.0]
    assert run_jax(ops["bump_b"]).tolist() == [3.0, 3.0]  # B sees A's two calls
    assert run_jax(ops["peek"]).tolist() == [3.0, 3.0]


def test_static_state_is_shared_through_eager_torch(cache):
    ops = declare("counters.cc", COUNTERS)
    assert run_torch(ops["bump_a"]).tolist() == [1.0, 1.0]
    assert run_torch(ops["bump_a"]).tolist() == [2.0, 2.0]
    assert run_torch(ops["bump_b"]).tolist() == [3.0, 3.0]
    assert run_torch(ops["peek"]).tolist() == [3.0, 3.0]


def test_jax_and_torch_run_the_same_library_copy(cache):
    ops = declare("counters.cc", COUNTERS)
    run_jax(ops["bump_a"])
    run_torch(ops["bump_a"])
    assert run_jax(ops["bump_b"]).tolist() == [3.0, 3.0]
    assert run_torch(ops["peek"]).tolist() == [3.0, 3.0]
    assert builds(cache) == 1


def test_a_handler_missing_from_the_shared_library_is_named_with_the_fix(cache):
    ops = declare("counters.cc", {"ok": "LuPeek", "typo": "LuPeak"})
    with pytest.raises(RegistrationError) as info:
        kernel_of(ops["typo"], "cpu")
    msg = str(info.value)
    assert msg.startswith(f"{ops['typo'].name}: the cpu library built from ['counters.cc'] "
                          "has no symbol 'LuPeak'")
    assert "XLA_FFI_DEFINE_HANDLER_SYMBOL(LuPeak, ...)" in msg and "handler= to Kernel" in msg
    assert run_jax(ops["ok"]).tolist() == [0.0, 0.0] and builds(cache) == 1


# --------------------------------------------------------------------------- redeclaration


def test_redeclaring_with_an_equal_kernel_after_load_is_accepted(cache):
    op = declare("counters.cc", {"a": "LuBumpA"})["a"]
    first = kernel_of(op, "cpu")
    kernel = op.kernels["cpu"]
    same = xk.Op(op.name, inputs=[xk.Tensor("x", ("f32",))], outputs=lambda x: xk.like(x),
                 kernels={"cpu": xk.Kernel(list(kernel.sources), "LuBumpA")})
    assert kernel_of(same, "cpu") is first
    with pytest.raises(OpDeclarationError) as info:
        xk.Op(op.name, inputs=[xk.Tensor("x", ("f32",))], outputs=lambda x: xk.like(x),
              kernels={"cpu": xk.Kernel(list(kernel.sources), "LuBumpB")})
    msg = str(info.value)
    assert op.name in msg and "LuBumpA from counters-cpu-" in msg
    assert "give this op another name" in msg


# --------------------------------------------------------------------------- bindings blocks


def test_nanobind_block_builds_unchanged_and_exports_no_module(cache):
    ops = declare("counters.cc", COUNTERS)
    path = kernel_of(ops["peek"], "cpu").library
    library = ctypes.CDLL(str(path))
    assert not hasattr(library, "PyInit__lu_counters")  # not a Python module
    assert all(hasattr(library, h) for h in COUNTERS.values())


def test_pybind11_block_builds_unchanged_and_runs_in_jax_and_torch(cache):
    ops = declare("counters_pybind11.cc", PYBIND11_COUNTERS)
    assert run_jax(ops["bump"]).tolist() == [1.0, 1.0]
    assert run_torch(ops["bump"]).tolist() == [2.0, 2.0]
    assert run_jax(ops["read"]).tolist() == [2.0, 2.0]
    assert run_torch(ops["read"]).tolist() == [2.0, 2.0]
    assert builds(cache) == 1
    library = ctypes.CDLL(str(kernel_of(ops["read"], "cpu").library))
    assert not hasattr(library, "PyInit__lu_counters_pybind11")


def test_stand_in_covers_its_documented_surface(tmp_path):
    # -Wall -Wextra -Werror on the blocks: the stand-in adds no warnings of its own.
    src = FIXTURES / "binding_surface.cc"
    subprocess.run([str(find_cxx()), "-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                    "-fsyntax-only", "-idirafter", str(compat_include_dir()), str(src)],
                   check=True, capture_output=True, text=True)
    so = build_library("binding_surface", [src], platform="cpu", cache_dir=tmp_path)
    assert ctypes.CDLL(str(so)).lu_surface_state() == 0


def test_real_nanobind_headers_on_the_include_path_win(tmp_path):
    so = build_library("uses_real_nanobind", [FIXTURES / "uses_real_nanobind.cc"],
                       platform="cpu", include_dirs=[FIXTURES / "real_nanobind"],
                       cache_dir=tmp_path)
    assert ctypes.CDLL(str(so)).lu_real_nanobind() == 1


def test_real_nanobind_headers_on_cplus_include_path_win(tmp_path, monkeypatch):
    monkeypatch.setenv("CPLUS_INCLUDE_PATH", str(FIXTURES / "real_nanobind"))
    so = build_library("uses_real_nanobind", [FIXTURES / "uses_real_nanobind.cc"],
                       platform="cpu", cache_dir=tmp_path)
    assert ctypes.CDLL(str(so)).lu_real_nanobind() == 1


def test_block_beyond_the_stand_in_fails_naming_op_stand_in_and_fix(cache):
    op = declare("unsupported_binding.cc", {"box": "LuUnused"})["box"]
    with pytest.raises(BuildError) as info:
        kernel_of(op, "cpu")
    msg = str(info.value)
    assert f"building 'unsupported_binding' (needed by op {op.name}) for cpu failed" in msg
    assert "class_" in msg  # the compiler's own error comes first
    assert "unsupported_binding.cc includes nanobind/nanobind.h" in msg
    assert str(compat_include_dir()) in msg and "not bound classes" in msg
    assert "Fix, if the errors are in the registration block:" in msg
    assert "Kernel(include_dirs=[...])" in msg and "XLA_KERNELS_COMPAT_BINDINGS" in msg


def test_unrelated_compile_errors_get_no_stand_in_note(tmp_path):
    src = tmp_path / "plain.cc"
    src.write_text('extern "C" int f() { return missing; }\n')
    with pytest.raises(BuildError) as info:
        build_library("plain", [src], platform="cpu", cache_dir=tmp_path / "c", for_op="x.y")
    assert "(needed by op x.y)" in str(info.value) and "stand-in" not in str(info.value)


def _have_nvcc() -> bool:
    try:
        find_nvcc()
    except CompilerNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc is not installed")
def test_nanobind_block_in_a_cuda_source_builds_with_nvcc(tmp_path):
    so = build_library("counters_nb", [FIXTURES / "counters_nb.cu"], platform="cuda",
                       cuda_archs=["90"], cache_dir=tmp_path)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(so)], check=True,
                             capture_output=True, text=True).stdout
    assert " LuAddOneCuda" in symbols and "PyInit" not in symbols


# --------------------------------------------------------------------------- cli


def test_cli_build_gives_every_op_of_a_source_the_same_library(cache, capsys):
    spec = str(FIXTURES / "library_unit_ops.py")
    assert cli.main(["build", f"{spec}:bump_a"]) == 0
    assert cli.main(["build", f"{spec}:peek"]) == 0
    lines = capsys.readouterr().out.splitlines()
    paths = {line.rsplit(": ", 1)[1] for line in lines}
    assert len(paths) == 1 and builds(cache) == 1
    assert lines[0].startswith("library_unit.bump_a [cpu]: ")
