"""Prebuilt libraries shipped in a package: served without a compiler, refused when stale.

A user's package (``pkg_add``, written into a temporary folder) declares one op; ``xla-kernels
build --aot`` prebuilds it into ``pkg_add/_prebuilt``; a fresh interpreter with no compiler
on PATH, an empty cache and ``XLA_KERNELS_BUILD=never`` then runs the op from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xla_kernels import aot
from xla_kernels.builder import BuildSpec, prebuilt
from xla_kernels.errors import BuildError

KERNELS = Path(__file__).resolve().parent.parent / "src" / "xla_kernels" / "kernels"

DECLARATION = textwrap.dedent('''
    from xla_kernels.op import Kernel, Op, Tensor, like

    add = Op("pkg_add.add", inputs=[Tensor("a", dtypes=("f32",)), Tensor("b", dtypes=("f32",))],
             outputs=lambda a, b: like(a),
             kernels={"cpu": Kernel(["add_cpu.cc"], handler="XlaKernelsSimpleAddCpu")})
''')

RUN = textwrap.dedent('''
    import os, numpy as np, jax.numpy as jnp
    from pkg_add import add
    from xla_kernels.builder import used_libraries
    out = np.asarray(add(jnp.arange(4.0, dtype=jnp.float32), jnp.ones(4, jnp.float32)))
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0], out
    kinds = {name: r.kind for (name, _), r in used_libraries().items()}
    print(kinds["add_cpu"], os.path.exists(os.environ["XLA_KERNELS_CACHE_DIR"]))
''')


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/pkg_add``, its op prebuilt into ``pkg_add/_prebuilt`` (on sys.path)."""
    root = tmp_path_factory.mktemp("site")
    pkg = root / "pkg_add"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(DECLARATION)
    for name in ("simple_add_cpu.cc", "simple_add.h"):
        shutil.copy(KERNELS / "simple_add" / name, pkg / name)
    (pkg / "simple_add_cpu.cc").rename(pkg / "add_cpu.cc")
    sys.path.insert(0, str(root))
    try:
        built = aot.build_aot("pkg_add", platforms=["cpu"],
                              cache_dir=tmp_path_factory.mktemp("aot-cache"), report=print)
    finally:
        sys.path.remove(str(root))
    assert [b.name for b in built] == ["add_cpu"]
    return pkg


def _spec(package: Path) -> BuildSpec:
    return BuildSpec.create("add_cpu", [package / "add_cpu.cc"], platform="cpu")


def _run_without_compilers(package: Path, cache: Path, **env: str) -> subprocess.CompletedProcess:
    bare = {k: v for k, v in os.environ.items() if k not in ("CXX", "XLA_KERNELS_NVCC")}
    bare.update(PATH=str(Path(sys.executable).parent), XLA_KERNELS_CACHE_DIR=str(cache),
                PYTHONPATH=os.pathsep.join([str(package.parent), *sys.path]), **env)
    return subprocess.run([sys.executable, "-c", RUN], env=bare, capture_output=True,
                          text=True, timeout=300)


def test_the_index_records_sources_inside_the_package_and_the_ffi_version(package: Path):
    entry = json.loads((package / "_prebuilt" / "index.json").read_text())["entries"][0]
    assert entry["sources"] == ["pkg_add/add_cpu.cc"]
    assert set(entry["dependencies"]) == {"pkg_add/add_cpu.cc", "pkg_add/simple_add.h"}
    assert entry["ffi"][0] == 0 and entry["archs"] == []


def test_a_prebuilt_library_runs_with_no_compiler_and_an_empty_cache(package: Path,
                                                                     tmp_path: Path):
    proc = _run_without_compilers(package, tmp_path / "cache", XLA_KERNELS_BUILD="never")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["prebuilt", "False"]


def test_build_always_ignores_the_prebuilt_library(package: Path, monkeypatch):
    monkeypatch.setenv("XLA_KERNELS_BUILD", "always")
    found = _spec(package).resolve(cache_dir=package / "no-cache")
    assert found.kind == "build" and "XLA_KERNELS_BUILD=always" in found.reason


def test_a_matching_prebuilt_library_is_resolved_first(package: Path):
    found = _spec(package).resolve(cache_dir=package / "no-cache")
    assert found.kind == "prebuilt" and found.path.parent == package / "_prebuilt"


def test_a_changed_header_makes_the_prebuilt_library_stale(package: Path, tmp_path: Path):
    copy = tmp_path / "pkg_add"
    shutil.copytree(package, copy)
    with open(copy / "simple_add.h", "a") as f:
        f.write("\n// edited\n")
    match = _spec(copy).prebuilt()
    assert match.path is None and "pkg_add/simple_add.h changed since it was built" in match.reason


def test_a_damaged_library_is_refused(package: Path, tmp_path: Path):
    copy = tmp_path / "pkg_add"
    shutil.copytree(package, copy)
    so = next((copy / "_prebuilt").glob("*.so"))
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    match = _spec(copy).prebuilt()
    assert match.path is None and f"{so.name} is damaged" in match.reason


def test_never_mode_names_why_nothing_serves_and_the_fix(package: Path, tmp_path: Path,
                                                         monkeypatch):
    copy = tmp_path / "pkg_add"
    shutil.copytree(package, copy)
    (copy / "add_cpu.cc").write_text((copy / "add_cpu.cc").read_text() + "\n// edited\n")
    monkeypatch.setenv("XLA_KERNELS_BUILD", "never")
    with pytest.raises(BuildError, match=r"XLA_KERNELS_BUILD=never forbids compiling.*"
                                         r"pkg_add/add_cpu.cc changed since it was built.*Fix: "):
        _spec(copy).load_path(cache_dir=tmp_path / "cache")


def test_other_abi_tags_are_not_served(package: Path):
    spec = dataclasses.replace(_spec(package), abi=(("torch", "0.0.1"),))
    match = spec.prebuilt()
    assert match.path is None
    assert "built for no ABI tags, this process has torch 0.0.1" in match.reason


def test_a_library_built_against_a_newer_ffi_minor_is_not_served(package: Path):
    want = dataclasses.replace(_spec(package).wanted(), ffi=(0, 0))
    match = prebuilt.find(want)
    assert match.path is None and "the installed jaxlib has 0.0" in match.reason


def test_one_library_per_python_and_torch_each_picked_by_its_abi(package: Path, tmp_path: Path):
    # What `make wheel` ships for the torch dispatcher: one entry per (Python, torch) build.
    copy = tmp_path / "pkg_add"
    shutil.copytree(package, copy)
    want = _spec(copy).wanted()
    builds = {"cp311": "2.13.0+cpu", "cp312": "2.11.0+cu130"}
    added = {}
    for python, torch in builds.items():
        artifact = tmp_path / f"{python}.so"  # distinct contents, distinct files
        artifact.write_bytes(next((copy / "_prebuilt").glob("*.so")).read_bytes() + python.encode())
        abi = (("cxx11abi", "1"), ("python", python), ("torch", torch))
        added[python] = prebuilt.add(copy / "_prebuilt", dataclasses.replace(want, abi=abi),
                                     artifact, [copy / "add_cpu.cc"])
    for python, torch in builds.items():
        abi = (("cxx11abi", "1"), ("python", python), ("torch", torch))
        assert prebuilt.find(dataclasses.replace(want, abi=abi)).path == added[python]
    other = prebuilt.find(dataclasses.replace(
        want, abi=(("cxx11abi", "1"), ("python", "cp312"), ("torch", "2.13.0+cpu"))))
    assert other.path is None and "this process has cxx11abi 1, python cp312, torch 2.13.0+cpu" \
        in other.reason


def test_a_newer_ffi_minor_serves_and_another_major_does_not(package: Path):
    # jaxlib 0.10 has XLA FFI API 0.3, 0.11 has 0.4, 0.12 has 0.5: a 0.3 library serves them all.
    want = _spec(package).wanted()
    built = tuple(json.loads((package / "_prebuilt" / "index.json").read_text())
                  ["entries"][0]["ffi"])
    for minor in (built[1], built[1] + 1, built[1] + 2):
        assert prebuilt.find(dataclasses.replace(want, ffi=(built[0], minor))).path is not None
    match = prebuilt.find(dataclasses.replace(want, ffi=(built[0] + 1, built[1])))
    assert match.path is None and f"the installed jaxlib has {built[0] + 1}." in match.reason


def test_cuda_archs_must_be_covered():
    assert prebuilt.archs_cover(["80", "90a", "100a"], ["90", "100"])
    assert not prebuilt.archs_cover(["80", "90a"], ["100"])


def test_an_unknown_build_mode_names_the_choices(monkeypatch):
    monkeypatch.setenv("XLA_KERNELS_BUILD", "sometimes")
    with pytest.raises(BuildError, match=r"XLA_KERNELS_BUILD='sometimes' is not a build mode\. "
                                         r"Fix: set it to auto, always or never"):
        prebuilt.build_mode()


def test_aot_of_a_package_without_ops_names_the_fix(tmp_path: Path, monkeypatch):
    (tmp_path / "pkg_empty").mkdir()
    (tmp_path / "pkg_empty" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BuildError, match=r"it declares no op with a kernel for cpu.*Fix: pass "
                                         r"the package that declares the ops"):
        aot.build_aot("pkg_empty", platforms=["cpu"], report=lambda _: None)
