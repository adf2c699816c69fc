"""Kernels written for XLA's original custom-call signature run unchanged, as typed FFI."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ops import legacy_add, seeds_legacy_add, size_opaque
from toolchain import requires_nvcc
from xla_kernels import builder
from xla_kernels.hlo import assert_single_custom_call, hlo_text
from xla_kernels.runtime import library


@pytest.mark.parametrize("size", [1, 3, 13, 1000])
def test_legacy_cpu_kernel_runs_with_its_opaque_bytes(rng, size):
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    out = jax.jit(lambda a, b: legacy_add(a, b, opaque=size_opaque(size)))(a, b)
    np.testing.assert_array_equal(np.asarray(out), a + b)


def test_legacy_kernel_appears_as_typed_ffi_not_the_deprecated_api():
    text = hlo_text(lambda a, b: legacy_add(a, b, opaque=size_opaque(3)), jnp.ones(3),
                    jnp.ones(3))
    assert_single_custom_call(text, "xk_tests.legacy_add", "API_VERSION_TYPED_FFI")
    assert "API_VERSION_ORIGINAL" not in text



@requires_nvcc
@pytest.mark.parametrize("op", [seeds_legacy_add, legacy_add], ids=lambda op: op.name)
def test_legacy_cuda_adapters_compile_with_nvcc(op, tmp_path):
    kernel = op.kernels["cuda"]
    sources, defines = library._sources(op, kernel, "cuda")
    path = builder.build_library(op.name, sources, platform="cuda", cuda_archs=["90"],
                                 defines=defines, cache_dir=tmp_path)
    assert path.exists()


@pytest.mark.gpu
def test_seeds_legacy_kernel_runs_on_the_gpu():
    a, b = jnp.array([1.0, 2.0, 3.0]), jnp.array([4.0, 5.0, 6.0])
    assert jax.jit(seeds_legacy_add)(a, b).tolist() == [5.0, 7.0, 9.0]
    assert_single_custom_call(hlo_text(seeds_legacy_add, a, b), "xk_tests.seeds_legacy_add",
                              "API_VERSION_TYPED_FFI")


@pytest.mark.gpu
@pytest.mark.parametrize("size", [1, 3, 257, 100_003])
def test_sized_legacy_kernel_runs_on_the_gpu(rng, size):
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    out = jax.jit(lambda a, b: legacy_add(a, b, opaque=size_opaque(size)))(a, b)
    np.testing.assert_array_equal(np.asarray(out), a + b)


def test_missing_legacy_source_names_the_op_and_how_paths_resolve():
    import xla_kernels as xk
    from xla_kernels.errors import BuildError

    op = xk.Op("xk_tests.legacy_missing", inputs=[xk.Tensor("a", dtypes=("f32",))],
               outputs=lambda a: xk.like(a),
               kernels={"cpu": xk.Kernel.legacy(["fixtures/legacy/nope.cc"], function="Nope")})
    with pytest.raises(BuildError) as info:
        library.load_kernel(op, "cpu")
    msg = str(info.value)
    here = Path(__file__).resolve().parent
    assert msg.startswith("xk_tests.legacy_missing: the cpu kernel's legacy source "
                          "'fixtures/legacy/nope.cc' does not exist")
    assert str(here / "fixtures" / "legacy" / "nope.cc") in msg
    assert f"folder of the file that declares the op, {here}" in msg
    assert "current directory" not in msg and "Fix:" in msg


def test_legacy_build_uses_the_shipped_adapter_and_no_generated_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_KERNELS_CACHE_DIR", str(tmp_path))
    kernel = legacy_add.kernels["cpu"]
    sources, defines = library._sources(legacy_add, kernel, "cpu")
    assert sources[0] == builder.package_include_dir() / "xla_kernels" / "legacy_adapter.cc"
    assert defines["XK_LEGACY_SOURCE"] == f'"{kernel.resolved_sources()[0]}"'
    assert defines["XK_LEGACY_FUNCTION"] == "LegacyAddCpu"
    assert not (tmp_path / "generated").exists()
