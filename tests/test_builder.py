"""Tests of xla_kernels.builder: caching, rebuilds, concurrency, errors, g++ and nvcc builds."""

from __future__ import annotations

import ctypes
import io
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from xla_kernels.builder import (
    build_library,
    compiler,
    default_cache_dir,
    detect_cuda_archs,
    find_cxx,
    find_nvcc,
    toolchain,
    toolchain_report,
)
from xla_kernels.errors import BuildError, CompilerNotFoundError

FIXTURES = Path(__file__).parent / "fixtures" / "build"
SRC_ROOT = Path(__file__).resolve().parents[1] / "src"


def _have_nvcc() -> bool:
    try:
        find_nvcc()
    except CompilerNotFoundError:
        return False
    return True


HAVE_NVCC = _have_nvcc()
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not installed")

VALUE_SRC = 'extern "C" int value() { return VALUE; }\n'


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def call_value(so: Path) -> int:
    return ctypes.CDLL(str(so)).value()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("XLA_KERNELS_CUDA_ARCHS", "XLA_KERNELS_NVCC", "XLA_KERNELS_QUIET", "CXX"):
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------- caching


def test_cache_hit_runs_no_compiler(tmp_path, monkeypatch, capfd):
    src = write(tmp_path / "src" / "v.cc", VALUE_SRC)
    cache = tmp_path / "cache"
    first = build_library("v", [src], platform="cpu", defines={"VALUE": "7"}, cache_dir=cache)
    assert first.parent == cache and first.name.startswith("v-cpu-") and first.suffix == ".so"
    assert call_value(first) == 7

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"cache hit ran a subprocess: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    capfd.readouterr()
    again = build_library("v", [src], platform="cpu", defines={"VALUE": "7"}, cache_dir=cache)
    assert again == first
    assert capfd.readouterr().err == ""  # no progress output for hits
    # The library and, beside it, its manifest of dependencies (see test_cache_integrity.py).
    entries = sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))
    assert entries == sorted([first.name, first.name.rsplit("-", 1)[0] + ".json"])


def test_rebuild_on_source_change(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    a = build_library("v", [src], platform="cpu", defines={"VALUE": "1"}, cache_dir=tmp_path)
    write(src, 'extern "C" int value() { return VALUE + 10; }\n')
    b = build_library("v", [src], platform="cpu", defines={"VALUE": "1"}, cache_dir=tmp_path)
    assert a != b
    assert (call_value(a), call_value(b)) == (1, 11)


def test_rebuild_on_define_and_flag_change(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    a = build_library("v", [src], platform="cpu", defines={"VALUE": "1"}, cache_dir=tmp_path)
    b = build_library("v", [src], platform="cpu", defines={"VALUE": "2"}, cache_dir=tmp_path)
    c = build_library("v", [src], platform="cpu", defines={"VALUE": "2"}, extra_flags=["-O1"],
                      cache_dir=tmp_path)
    assert len({a, b, c}) == 3
    assert (call_value(a), call_value(b), call_value(c)) == (1, 2, 2)


def test_rebuild_on_header_change_in_source_dir(tmp_path):
    src = write(tmp_path / "v.cc", '#include "value.h"\nextern "C" int value() { return V; }\n')
    write(tmp_path / "value.h", "#define V 3\n")
    a = build_library("v", [src], platform="cpu", cache_dir=tmp_path / "c")
    write(tmp_path / "value.h", "#define V 4\n")
    b = build_library("v", [src], platform="cpu", cache_dir=tmp_path / "c")
    assert a != b
    assert (call_value(a), call_value(b)) == (3, 4)
    # Headers come from the compiler's depfile: an unrelated new header changes nothing.
    write(tmp_path / "other.cuh", "// new\n")
    assert build_library("v", [src], platform="cpu", cache_dir=tmp_path / "c") == b


def test_concurrent_builds_in_two_processes(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    log = tmp_path / "compiles.log"
    # A compiler wrapper that logs each real compile and is slow enough for the builds to overlap.
    cxx = write(tmp_path / "slow-g++", f"""\
        #!/bin/sh
        case " $* " in *" -shared "*) echo "$$" >> {log}; sleep 1.5;; esac
        exec {find_cxx()} "$@"
        """)
    cxx.chmod(0o755)
    script = (
        "import sys; from xla_kernels.builder import build_library; "
        f"print(build_library('v', [{str(src)!r}], platform='cpu', defines={{'VALUE': '5'}}, "
        f"cache_dir={str(tmp_path / 'cache')!r}))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC_ROOT), "CXX": str(cxx), "XLA_KERNELS_QUIET": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    paths = {Path(out.strip()) for out, _ in results}
    assert len(paths) == 1
    (so,) = paths
    assert call_value(so) == 5
    assert len(log.read_text().split()) == 1  # the second process reused the first's build
    leftovers = [p.name for p in so.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temp files or object dirs left behind


def test_stand_in_headers_are_searched_last_by_gxx_and_nvcc(tmp_path):
    # After every -I folder and the system's (-idirafter), so any real nanobind/pybind11 wins.
    steps = compiler.plan_steps(
        [Path("/s/a.cc"), Path("/s/b.cu")], platform="cuda", out=tmp_path / "x.so",
        obj_dir=tmp_path, flags=["-I/user"], cxx=(Path("g++"), "g++"),
        nvcc=(Path("nvcc"), "nvcc"), fallback_include=Path("/compat"))
    gxx, nvcc, link = (list(s.argv) for s in steps)
    after = gxx.index("-idirafter")
    assert after > gxx.index("-I/user") and gxx[after + 1] == "/compat"
    assert nvcc[nvcc.index("-idirafter,/compat") - 1] == "-Xcompiler"
    assert nvcc.index("-idirafter,/compat") > nvcc.index("-I/user")
    assert not any("compat" in a for a in link)


# --------------------------------------------------------------------------- errors


def test_compile_error_names_file_line_and_error(tmp_path):
    src = write(tmp_path / "broken.cc", 'extern "C" int f() {\n  return undefined_thing;\n}\n')
    with pytest.raises(BuildError) as info:
        build_library("broken_op", [src], platform="cpu", cache_dir=tmp_path / "c")
    msg = str(info.value)
    assert "broken_op" in msg and "cpu" in msg and "g++" in msg
    assert f"{src}:2:" in msg  # file:line of the first error
    assert "undefined_thing" in msg and "not declared" in msg
    assert "undefined_thing" in info.value.compiler_output
    assert str(src) in info.value.command
    assert not list((tmp_path / "c").glob("*.so"))


@needs_nvcc
def test_nvcc_compile_error_names_file_line_and_error(tmp_path):
    src = write(tmp_path / "broken.cu", '__global__ void k(float* x) {\n  x[0] = nope;\n}\n')
    with pytest.raises(BuildError) as info:
        build_library("broken_cu", [src], platform="cuda", cuda_archs=["90"],
                      cache_dir=tmp_path / "c")
    msg = str(info.value)
    assert "broken_cu" in msg and "cuda" in msg and "nvcc" in msg
    assert f"{src}:2: error:" in msg and "nope" in msg and "undefined" in msg


def test_missing_source_is_named(tmp_path):
    missing = tmp_path / "nowhere.cc"
    with pytest.raises(BuildError, match=r"nowhere\.cc") as info:
        build_library("m", [missing], platform="cpu", cache_dir=tmp_path)
    # Says where relative paths come from for build_library and for an op's Kernel.
    assert f"current directory, {Path.cwd()}" in str(info.value)
    assert "folder of the file that declares the op" in str(info.value)


def test_cuda_source_rejected_for_cpu(tmp_path):
    with pytest.raises(BuildError, match="platform='cuda'"):
        build_library("s", [FIXTURES / "scale.cu"], platform="cpu", cache_dir=tmp_path)


def test_missing_compilers_raise_with_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # empty directory
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(toolchain, "STANDARD_NVCC", tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setattr(toolchain, "_wheel_nvccs", list)

    with pytest.raises(CompilerNotFoundError) as info:
        find_nvcc()
    msg = str(info.value)
    assert "nvcc on PATH" in msg and "CUDA_HOME" in msg
    assert "pip install nvidia-cuda-nvcc" in msg and "XLA_KERNELS_NVCC" in msg

    with pytest.raises(CompilerNotFoundError, match=r"g\+\+.*Fix:.*CXX"):
        find_cxx()
    src = write(tmp_path / "v.cc", VALUE_SRC)
    with pytest.raises(CompilerNotFoundError):
        build_library("v", [src], platform="cpu", cache_dir=tmp_path / "c")

    report = toolchain_report()
    assert report["cxx"]["found"] is False and "Fix" in report["cxx"]["error"]
    assert report["nvcc"]["found"] is False

    monkeypatch.setenv("XLA_KERNELS_NVCC", str(tmp_path / "not-nvcc"))
    with pytest.raises(CompilerNotFoundError, match="XLA_KERNELS_NVCC"):
        find_nvcc()


def test_nvcc_override_and_cuda_home(tmp_path, monkeypatch):
    fake = write(tmp_path / "cuda" / "bin" / "nvcc", "#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_nvcc() == fake
    monkeypatch.setenv("XLA_KERNELS_NVCC", str(fake))
    assert find_nvcc() == fake


# --------------------------------------------------------------------------- real libraries


def test_ffi_handler_library_loads_and_runs(tmp_path):
    so = build_library("add_one", [FIXTURES / "ffi_add_one.cc"], platform="cpu",
                       cache_dir=tmp_path)
    lib = ctypes.CDLL(str(so))
    assert lib.AddOne  # the handler symbol is exported

    import jax
    import numpy as np

    jax.ffi.register_ffi_target("test_build_add_one", jax.ffi.pycapsule(lib.AddOne),
                                platform="cpu")
    x = np.arange(4, dtype=np.float32)
    y = jax.ffi.ffi_call("test_build_add_one", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    np.testing.assert_array_equal(np.asarray(y), x + 1)


@needs_nvcc
def test_cuda_library_builds_for_sm90(tmp_path, monkeypatch):
    commands: list[list[str]] = []
    real_run = subprocess.run

    def spy(argv, *args, **kwargs):
        commands.append(list(argv))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    sources = [FIXTURES / "scale.cu", FIXTURES / "scale_host.cc"]
    so = build_library("scale", sources, platform="cuda", cuda_archs=["90"], cache_dir=tmp_path)
    assert so.name.startswith("scale-cuda-")
    compiles = [c for c in commands if "--version" not in c]
    nvcc_cu = [c for c in compiles if str(FIXTURES / "scale.cu") in c]
    assert nvcc_cu and "-gencode=arch=compute_90,code=sm_90" in nvcc_cu[0]
    assert not any("compute_80" in flag for c in compiles for flag in c)
    gxx = [c for c in compiles if str(FIXTURES / "scale_host.cc") in c]
    assert gxx and Path(gxx[0][0]).name != "nvcc"  # .cc compiled by the host compiler
    assert b"sm_90" in so.read_bytes()
    lib = ctypes.CDLL(str(so))  # loads without a GPU; nothing is launched
    assert lib.LaunchScale and lib.ScaleBlockSize() == 256


# --------------------------------------------------------------------------- pieces


def test_cuda_arch_resolution_order(monkeypatch):
    monkeypatch.setattr(toolchain, "_nvidia_smi_archs", lambda: ("90",))
    assert toolchain.resolve_cuda_archs(["sm_90a", "80"]) == (["90a", "80"], "argument")
    assert toolchain.resolve_cuda_archs("90a,8.0") == (["90a", "80"], "argument")
    monkeypatch.setenv("XLA_KERNELS_CUDA_ARCHS", "90a, 80,80")
    assert toolchain.resolve_cuda_archs(None) == (["90a", "80"], "env")
    monkeypatch.delenv("XLA_KERNELS_CUDA_ARCHS")
    assert toolchain.resolve_cuda_archs(None) == (["90"], "nvidia-smi")
    assert detect_cuda_archs() == ["90"]
    monkeypatch.setattr(toolchain, "_nvidia_smi_archs", lambda: ())
    assert toolchain.resolve_cuda_archs(None) == (["80", "90"], "fallback")
    with pytest.raises(BuildError, match="invalid CUDA architecture"):
        toolchain.resolve_cuda_archs(["hopper"])


def test_gencode_flags():
    assert compiler.gencode_flags(["90a"], ptx=False) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert compiler.gencode_flags(["80", "90"], ptx=True) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_arch_specific_builds_90_as_90a_and_embeds_generic_ptx():
    assert toolchain.arch_specific_archs(["80", "90", "sm_90a", "86"]) == ["80", "90a", "86"]
    assert compiler.gencode_flags(["80", "90a"], ptx=True) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_kernel_arch_specific_reaches_nvcc(monkeypatch, tmp_path):
    """Kernel(arch_specific=True) makes load_kernel ask its BuildSpec for 90a; other
    kernels keep 90."""
    from xla_kernels import builder as builder_pkg
    from xla_kernels.op import Kernel
    from xla_kernels.runtime import library

    seen = {}

    def fake_load(spec, **kw):
        seen[spec.name] = spec.arch_specific
        raise BuildError("stop here")

    monkeypatch.setattr(builder_pkg.BuildSpec, "load_path", fake_load)
    for arch_specific in (False, True):
        k = Kernel([str(FIXTURES / "scale.cu")], handler="H", arch_specific=arch_specific)
        fake_op = types.SimpleNamespace(name="t.op", kernels={"cuda": k})
        with pytest.raises(BuildError, match="stop here"):
            library.load_kernel(fake_op, "cuda")  # type: ignore[arg-type]
        assert seen["scale"] is arch_specific


def test_first_errors_parses_gcc_and_nvcc():
    out = (
        "a.cc: In function 'int f()':\n"
        "a.cc:3:10: error: 'y' was not declared in this scope\n"
        "k.cu(12): error: identifier \"z\" is undefined\n"
        "inc.cu:1:10: fatal error: nope.h: No such file or directory\n"
    )
    assert compiler.first_errors(out) == [
        "a.cc:3:10: error: 'y' was not declared in this scope",
        'k.cu:12: error: identifier "z" is undefined',
        "inc.cu:1:10: error: nope.h: No such file or directory",
    ]
    assert compiler.first_errors("/usr/bin/ld: undefined reference to `g'\ncollect2: error: "
                                 "ld returned 1 exit status") == [
        "collect2: error: ld returned 1 exit status"]


def test_default_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("XLA_KERNELS_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("XLA_KERNELS_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "xla_kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "xla_kernels"


def test_progress_line_only_for_slow_builds(monkeypatch):
    import time

    fast, slow, quiet = io.StringIO(), io.StringIO(), io.StringIO()
    with compiler.Progress("building fast for cpu (g++ 12)", delay=0.5, stream=fast):
        pass
    with compiler.Progress("building slow for cuda (nvcc 13.0, sm_90)", delay=0.05, stream=slow):
        time.sleep(0.2)
    monkeypatch.setenv("XLA_KERNELS_QUIET", "1")
    with compiler.Progress("building quiet for cpu", delay=0.05, stream=quiet):
        time.sleep(0.2)
    assert fast.getvalue() == "" and quiet.getvalue() == ""
    lines = slow.getvalue().splitlines()
    assert lines[0] == "xla-kernels: building slow for cuda (nvcc 13.0, sm_90)..."
    assert lines[1].startswith("xla-kernels: ... done in ") and lines[1].endswith(" s")


def test_short_version():
    nvcc_text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13"
    assert toolchain.short_version(Path("/x/nvcc"), nvcc_text) == "nvcc 13.0"
    gcc_text = "g++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022"
    assert toolchain.short_version(Path("/usr/bin/g++"), gcc_text) == "g++ 12.2.0"
