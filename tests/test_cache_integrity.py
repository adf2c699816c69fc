"""The build cache, seen from fresh processes: real dependencies, damaged files, no compiler,
read-only and moved caches, concurrent builders, and the messages they print.

Each scenario builds with the real g++ (nvcc for the CUDA case) in a temporary cache and
checks the outcome in a new Python process, as a user's next run would see it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from toolchain import requires_nvcc
from xla_kernels.builder import build_library, find_cxx
from xla_kernels.errors import BuildError

SRC_ROOT = Path(__file__).resolve().parents[1] / "src"
TESTS = Path(__file__).resolve().parent

# Builds a library (or loads an op) in a fresh process and prints what it got as JSON.
LIB_SCRIPT = """
import ctypes, json, sys
from xla_kernels.builder import build_library
args = json.loads(sys.argv[1])
so = build_library(args["name"], args["sources"], platform=args.get("platform", "cpu"),
                   include_dirs=args.get("include_dirs", ()), defines=args.get("defines", {}),
                   cuda_archs=args.get("cuda_archs"), cache_dir=args["cache"])
value = ctypes.CDLL(str(so)).value() if args.get("call", True) else None
print(json.dumps({"path": str(so), "value": value}))
"""

# LIB_SCRIPT for a cache that is damaged while it runs: build_library returns a path it has
# verified, and damage that lands between that and the dlopen makes the dlopen fail cleanly
# (an OSError, never a crash); as any caller would, the script then asks build_library again,
# which must notice the damage and rebuild. Tries and retries are printed.
LIB_SCRIPT_RETRYING = """
import ctypes, json, sys
from xla_kernels.builder import build_library
args = json.loads(sys.argv[1])
for attempt in range(20):
    so = build_library(args["name"], args["sources"], platform=args.get("platform", "cpu"),
                       cache_dir=args["cache"], defines=args.get("defines", {}))
    try:
        value = ctypes.CDLL(str(so)).value()
        break
    except OSError as e:
        print(f"damaged after verification, retrying: {e}", file=sys.stderr)
print(json.dumps({"path": str(so), "value": value, "attempts": attempt + 1}))
"""

# Declares a legacy op on the given source and runs it through JAX in a fresh process.
LEGACY_SCRIPT = """
import json, sys
import numpy as np, jax
import xla_kernels as xk
args = json.loads(sys.argv[1])
op = xk.Op("xk_cache_tests.legacy", inputs=[xk.Tensor("a", dtypes=("f32",), rank=1)],
           outputs=lambda a: xk.like(a),
           kernels={"cpu": xk.Kernel.legacy([args["source"]], function="LegacyScale")})
out = jax.jit(lambda a: op(a, opaque=np.int64(4).tobytes()))(np.ones(4, np.float32))
from xla_kernels.runtime.library import load_kernel
print(json.dumps({"path": str(load_kernel(op, "cpu").library), "value": float(out[0])}))
"""

VALUE_SRC = 'extern "C" int value() { return VALUE; }\n'


def _can_mount_read_only() -> bool:
    probe = Path(__file__).parent
    cmd = ["unshare", "-rm", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0"',
           str(probe)]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


requires_read_only_mount = pytest.mark.skipif(
    not _can_mount_read_only(), reason="needs `unshare -rm` to bind-mount a folder read-only")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CXX", "XLA_KERNELS_NVCC", "XLA_KERNELS_CUDA_ARCHS", "XLA_KERNELS_QUIET")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC_ROOT), str(TESTS)])
    env.update(extra)
    return env


def fresh(script: str, args: dict, *, env: dict[str, str] | None = None,
          read_only: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a new interpreter; ``read_only`` is bind-mounted read-only for it."""
    argv = [sys.executable, "-c", script, json.dumps(args)]
    if read_only is not None:
        argv = ["unshare", "-rm", "sh", "-c",
                'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
                str(read_only), *argv]
    return subprocess.run(argv, env=env or base_env(), capture_output=True, text=True,
                          timeout=300)


def ok(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def no_compiler_env(tmp_path: Path) -> dict[str, str]:
    """PATH with python's folder only (no g++, c++ or nvcc), and no CUDA_HOME/CUDA_PATH."""
    bin_dir = tmp_path / "bin-without-compilers"
    bin_dir.mkdir(exist_ok=True)
    env = base_env(PATH=str(bin_dir))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        env.pop(var, None)
    return env


# --------------------------------------------------------------------------- dependencies


def _project(tmp_path: Path) -> dict:
    """A source that reaches headers in every place the old key missed."""
    root = tmp_path / "proj"
    src = write(root / "src" / "v.cc", """\
        #include "detail/sub.h"
        #include "../up.h"
        #include <incdir.h>
        #include "impl.inl"
        extern "C" int value() { return SUB + UP + INC + INL; }
        """)
    write(root / "src" / "detail" / "sub.h", "#define SUB 1000\n")
    write(root / "up.h", "#define UP 100\n")
    write(root / "inc" / "incdir.h", "#define INC 10\n")
    write(root / "src" / "impl.inl", "#define INL 1\n")
    return {"name": "v", "sources": [str(src)], "include_dirs": [str(root / "inc")],
            "cache": str(tmp_path / "cache")}


@pytest.mark.parametrize("header, define, delta", [
    ("src/detail/sub.h", "SUB", 1000), ("up.h", "UP", 100), ("inc/incdir.h", "INC", 10),
    ("src/impl.inl", "INL", 1)], ids=["subfolder", "parent_folder", "include_dirs", "inl"])
def test_editing_any_included_file_rebuilds(tmp_path, header, define, delta):
    args = _project(tmp_path)
    first = ok(fresh(LIB_SCRIPT, args))
    assert first["value"] == 1111
    assert ok(fresh(LIB_SCRIPT, args)) == first  # unchanged: a hit on the same file
    write(tmp_path / "proj" / header, f"#define {define} {delta * 2}\n")
    second = ok(fresh(LIB_SCRIPT, args))
    assert second["value"] == 1111 + delta
    assert second["path"] != first["path"]


def test_editing_a_header_next_to_a_legacy_source_rebuilds(tmp_path):
    folder = tmp_path / "legacy"
    write(folder / "scale.h", "#define SCALE 2.0f\n")
    source = write(folder / "scale.cc", """\
        #include <cstddef>
        #include "scale.h"
        void LegacyScale(void*, void** buffers, const char*, size_t) {
          const float* a = static_cast<const float*>(buffers[0]);
          float* out = static_cast<float*>(buffers[1]);
          for (int i = 0; i < 4; ++i) out[i] = a[i] * SCALE;
        }
        """)
    env = base_env(XLA_KERNELS_CACHE_DIR=str(tmp_path / "cache"))
    assert ok(fresh(LEGACY_SCRIPT, {"source": str(source)}, env=env))["value"] == 2.0
    write(folder / "scale.h", "#define SCALE 3.0f\n")
    assert ok(fresh(LEGACY_SCRIPT, {"source": str(source)}, env=env))["value"] == 3.0
    # Nothing is generated inside the cache any more: only libraries, manifests and locks.
    kinds = {p.suffix for p in (tmp_path / "cache").iterdir()}
    assert kinds <= {".so", ".json", ".lock"}, kinds


def test_compiler_version_change_rebuilds(tmp_path):
    log = tmp_path / "wrapper.log"
    wrapper = write(tmp_path / "other-g++", f"""\
        #!/bin/sh
        case "$1" in --version) echo "other-g++ 99.1"; exit 0;; esac
        echo compile >> {log}
        exec {find_cxx()} "$@"
        """)
    wrapper.chmod(0o755)
    src = write(tmp_path / "v.cc", VALUE_SRC)
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "4"},
            "cache": str(tmp_path / "cache")}
    ok(fresh(LIB_SCRIPT, args))
    assert ok(fresh(LIB_SCRIPT, args, env=base_env(CXX=str(wrapper))))["value"] == 4
    assert log.read_text().split().count("compile") == 2  # compiled and linked again
    manifest = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())
    assert manifest["compilers"]["cxx"] == "other-g++ 99.1"


def test_editing_a_stand_in_header_rebuilds(tmp_path, monkeypatch):
    # The nanobind/pybind11 stand-ins are read through -idirafter, a system folder to the
    # compilers, so depfiles leave them out: their contents are in the key instead. (In this
    # process: the stand-in folder is redirected to an editable copy.)
    import xla_kernels.builder as builder

    compat = tmp_path / "compat"
    shutil.copytree(builder.compat_include_dir(), compat)
    monkeypatch.setattr(builder, "compat_include_dir", lambda: compat)
    source = TESTS / "fixtures" / "library_unit" / "counters.cc"
    first = builder.build_library("counters", [source], platform="cpu", cache_dir=tmp_path / "c")
    assert builder.build_library("counters", [source], platform="cpu",
                                 cache_dir=tmp_path / "c") == first
    header = compat / "xk_compat_bindings.h"
    header.write_text(header.read_text() + "\n// edited\n")
    again = builder.build_library("counters", [source], platform="cpu", cache_dir=tmp_path / "c")
    assert again != first
    compile_command = json.loads(next((tmp_path / "c").glob("*.json")).read_text())["commands"][0]
    assert compile_command[compile_command.index(str(compat)) - 1] == "-idirafter"


# --------------------------------------------------------------------------- damage


@pytest.mark.parametrize("damage", ["truncate", "zero", "garbage", "delete"])
def test_damaged_library_is_rebuilt_not_loaded(tmp_path, damage):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "9"},
            "cache": str(tmp_path / "cache")}
    so = Path(ok(fresh(LIB_SCRIPT, args))["path"])
    good = so.read_bytes()
    if damage == "truncate":  # e.g. a copy cut short: used to end in SIGBUS inside dlopen
        with open(so, "r+b") as f:
            f.truncate(len(good) // 2)
    elif damage == "zero":  # e.g. a full disk: used to raise on every run, never healing
        so.write_bytes(b"")
    elif damage == "garbage":
        so.write_bytes(b"\0" * len(good))
    else:
        so.unlink()
    again = ok(fresh(LIB_SCRIPT, args))
    assert again["value"] == 9
    assert Path(again["path"]).read_bytes() == good  # rebuilt, same content
    assert ok(fresh(LIB_SCRIPT, args)) == again  # and a hit afterwards


def test_damaged_manifest_is_rebuilt(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "2"},
            "cache": str(tmp_path / "cache")}
    ok(fresh(LIB_SCRIPT, args))
    (manifest,) = (tmp_path / "cache").glob("*.json")
    manifest.write_text(manifest.read_text()[:40])
    assert ok(fresh(LIB_SCRIPT, args))["value"] == 2
    assert json.loads(manifest.read_text())["artifact"]["size"] > 0


# --------------------------------------------------------------------------- no compiler


def test_hit_needs_no_compiler_and_miss_says_which_is_missing(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "6"},
            "cache": str(tmp_path / "cache")}
    built = ok(fresh(LIB_SCRIPT, args))
    env = no_compiler_env(tmp_path)
    assert ok(fresh(LIB_SCRIPT, args, env=env)) == built
    miss = fresh(LIB_SCRIPT, {**args, "defines": {"VALUE": "7"}}, env=env)
    assert miss.returncode != 0
    assert "CompilerNotFoundError" in miss.stderr and "g++" in miss.stderr


# Hides nvcc from discovery in the fresh process: PATH is stripped by the caller, and these
# two fixed places (the standard toolkit folder, pip wheels) are looked at regardless.
HIDE_NVCC = """
import pathlib
from xla_kernels.builder import toolchain
toolchain.STANDARD_NVCC = pathlib.Path("/nonexistent/nvcc")
toolchain._wheel_nvccs = list
"""


@requires_nvcc
def test_cuda_hit_needs_no_nvcc(tmp_path):
    src = write(tmp_path / "k.cu", """\
        __global__ void twice(float* x) { x[threadIdx.x] *= 2; }
        extern "C" int value() { return VALUE; }
        """)
    args = {"name": "k", "sources": [str(src)], "platform": "cuda", "cuda_archs": ["90"],
            "defines": {"VALUE": "3"}, "cache": str(tmp_path / "cache"), "call": False}
    built = ok(fresh(LIB_SCRIPT, args))
    assert Path(built["path"]).name.startswith("k-cuda-")
    env = no_compiler_env(tmp_path)
    assert ok(fresh(HIDE_NVCC + LIB_SCRIPT, args, env=env)) == built
    miss = fresh(HIDE_NVCC + LIB_SCRIPT, {**args, "cuda_archs": ["80"]}, env=env)
    assert miss.returncode != 0 and "Could not find the CUDA compiler nvcc" in miss.stderr


# --------------------------------------------------------------------------- read-only, moved


def test_a_cache_path_that_is_a_file_is_named_a_file_with_the_fix(tmp_path, monkeypatch):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    cache = write(tmp_path / "cache", "not a folder")
    monkeypatch.setenv("XLA_KERNELS_CACHE_DIR", str(cache))
    with pytest.raises(BuildError) as e:
        build_library("v", [str(src)], platform="cpu", defines={"VALUE": "1"})
    assert str(e.value) == (
        f"building 'v' for cpu: the cache folder {cache} is a file, not a folder. Fix: point "
        "XLA_KERNELS_CACHE_DIR (or cache_dir=) at a folder (it is created if missing), or move "
        f"the file {cache} away.")


def test_a_cache_folder_under_a_file_names_the_file(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    blocking = write(tmp_path / "cache", "not a folder")
    with pytest.raises(BuildError, match=rf"the cache folder {blocking}/sub lies under "
                                            rf"{blocking}, which is a file, not a folder"):
        build_library("v", [str(src)], platform="cpu", defines={"VALUE": "1"},
                      cache_dir=blocking / "sub")



@requires_read_only_mount
def test_read_only_cache_serves_hits_and_explains_misses(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    cache = tmp_path / "cache"
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "8"}, "cache": str(cache)}
    built = ok(fresh(LIB_SCRIPT, args))
    for lock in cache.glob("*.lock"):
        lock.unlink()  # a shipped cache need not carry lock files
    assert ok(fresh(LIB_SCRIPT, args, read_only=cache)) == built
    miss = fresh(LIB_SCRIPT, {**args, "defines": {"VALUE": "1"}}, read_only=cache)
    assert miss.returncode != 0
    assert "BuildError" in miss.stderr and "read-only" in miss.stderr
    assert "XLA_KERNELS_CACHE_DIR" in miss.stderr and "Errno" not in miss.stderr.splitlines()[-1]


@requires_read_only_mount
def test_read_only_empty_cache_raises_build_error(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    proc = fresh(LIB_SCRIPT, {"name": "v", "sources": [str(src)], "defines": {"VALUE": "1"},
                              "cache": str(cache)}, read_only=cache)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("xla_kernels.errors.BuildError: building 'v' for cpu: the cache "
                           f"folder {cache} is read-only"), last
    assert "XLA_KERNELS_CACHE_DIR" in last


@requires_read_only_mount
def test_read_only_cache_with_damaged_library_raises_instead_of_loading(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    cache = tmp_path / "cache"
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "8"}, "cache": str(cache)}
    so = Path(ok(fresh(LIB_SCRIPT, args))["path"])
    with open(so, "r+b") as f:
        f.truncate(so.stat().st_size // 2)
    proc = fresh(LIB_SCRIPT, args, read_only=cache)
    assert proc.returncode == 1, proc.stderr  # an exception, not a signal
    assert "BuildError" in proc.stderr and "is damaged" in proc.stderr


def test_moved_cache_still_hits_without_a_compiler(tmp_path):
    folder = tmp_path / "legacy"
    source = write(folder / "scale.cc", """\
        #include <cstddef>
        void LegacyScale(void*, void** buffers, const char*, size_t) {
          const float* a = static_cast<const float*>(buffers[0]);
          float* out = static_cast<float*>(buffers[1]);
          for (int i = 0; i < 4; ++i) out[i] = a[i] * 5.0f;
        }
        """)
    old, new = tmp_path / "old-cache", tmp_path / "new-cache"
    built = ok(fresh(LEGACY_SCRIPT, {"source": str(source)},
                     env=base_env(XLA_KERNELS_CACHE_DIR=str(old))))
    shutil.copytree(old, new)
    shutil.rmtree(old)
    env = {**no_compiler_env(tmp_path), "XLA_KERNELS_CACHE_DIR": str(new)}
    moved = ok(fresh(LEGACY_SCRIPT, {"source": str(source)}, env=env))
    assert moved["value"] == built["value"] == 5.0
    assert Path(moved["path"]).parent == new


# --------------------------------------------------------------------------- concurrency


def _slow_cxx(tmp_path: Path, seconds: float) -> Path:
    """g++ behind a wrapper that logs each link and sleeps, so builds overlap."""
    log = tmp_path / "links.log"
    cxx = write(tmp_path / "slow-g++", f"""\
        #!/bin/sh
        case " $* " in *" -shared "*) echo "$$" >> {log}; sleep {seconds};; esac
        exec {find_cxx()} "$@"
        """)
    cxx.chmod(0o755)
    return cxx


def test_waiting_process_says_it_waited(tmp_path):
    src = write(tmp_path / "v.cc", VALUE_SRC)
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "5"},
            "cache": str(tmp_path / "cache")}
    env = base_env(CXX=str(_slow_cxx(tmp_path, 6)))
    argv = [sys.executable, "-c", LIB_SCRIPT, json.dumps(args)]
    first = subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (tmp_path / "links.log").exists():  # the first one is linking, lock held
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=120)
    out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, (err1, second.stderr)
    assert "xla-kernels: building 'v' for cpu" in err1 and "done in" in err1
    assert "another process is building 'v' for cpu; waiting..." in second.stderr
    assert "waited" in second.stderr and "using its result" in second.stderr
    assert "done in" not in second.stderr and "building 'v' for cpu (" not in second.stderr
    assert json.loads(second.stdout)["path"] == json.loads(out1)["path"]


def test_two_builders_and_a_corrupter_all_succeed(tmp_path):
    """Two processes build and load one op at once while a third keeps damaging its library.

    The corrupter replaces the library with damaged copies (cut short, zeroed) by rename,
    as a crashed copy or a full disk leaves it; each builder must notice, rebuild and load
    a good library, never crash or load the damaged one.
    """
    src = write(tmp_path / "v.cc", VALUE_SRC)
    cache = tmp_path / "cache"
    args = {"name": "v", "sources": [str(src)], "defines": {"VALUE": "12"}, "cache": str(cache)}
    env = base_env(CXX=str(_slow_cxx(tmp_path, 0.5)), XLA_KERNELS_QUIET="1")
    stop = threading.Event()
    damaged = [0]

    def corrupt() -> None:
        while not stop.is_set():
            for so in cache.glob("v-cpu-*.so"):
                data = so.read_bytes()
                bad = data[: len(data) // 2] if damaged[0] % 2 else b"\0" * len(data)
                tmp = so.with_name(".corrupt.tmp")
                tmp.write_bytes(bad)
                os.replace(tmp, so)
                damaged[0] += 1
            stop.wait(0.4)

    corrupter = threading.Thread(target=corrupt, daemon=True)
    corrupter.start()
    try:
        rounds = []
        for _ in range(3):
            argv = [sys.executable, "-c", LIB_SCRIPT_RETRYING, json.dumps(args)]
            procs = [subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE) for _ in range(2)]
            rounds.append([(p, *p.communicate(timeout=300)) for p in procs])
    finally:
        stop.set()
        corrupter.join()
    for proc, out, err in (r for round_ in rounds for r in round_):
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out)["value"] == 12
    assert damaged[0] > 0
