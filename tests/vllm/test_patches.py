"""The patches fit the installed vLLM / tpu-inference / JAX: a new release that changes a
patched function fails here, naming the patch, before anything runs on wrong assumptions."""

from __future__ import annotations

import importlib.metadata

import pytest

from xla_kernels.vllm import patches


def test_installed_versions_are_the_pinned_ones():
    found = {name: importlib.metadata.version(name) for name in patches.PINNED}
    assert found == patches.PINNED


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.where)
def test_upstream_function_is_the_pinned_one(patch):
    patch.check()


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.where)
def test_patch_has_a_docstring_naming_upstream(patch):
    doc = patch.replacement.__doc__ or ""
    assert patch.name in doc, f"{patch.replacement.__name__}'s docstring must name {patch.name}"


def test_drift_is_reported_with_the_patch_name_and_the_fix():
    patch = patches.PATCHES[0]
    drifted = patches.Patch(patch.owner, patch.name, "0" * 64, patch.replacement, patch.kind)
    with pytest.raises(patches.PatchDriftError, match=patch.replacement.__name__) as error:
        drifted.check()
    assert "scripts/vllm_env.sh" in str(error.value)


def test_apply_all_is_idempotent_and_keeps_upstream_reachable():
    patches.apply_all()
    patches.apply_all()
    assert patches.applied() == [p.where for p in patches.PATCHES]
    for patch in patches.PATCHES:
        patch.check()   # the hash is of upstream's function, also once it is replaced


def _aligned_int32(n):
    """An int32 view whose data starts on a 64-byte boundary: one JAX's CPU client aliases."""
    import numpy as np

    raw = np.zeros(4 * n + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start : start + 4 * n].view(np.int32)


def test_upstream_device_put_aliases_aligned_numpy_on_cpu():
    """The cause of the intermittent wrong tokens: a later write to the NumPy buffer shows
    through the jax.Array (tpu-inference's runner refills its input buffers every step)."""
    import jax

    upstream = next(p for p in patches.PATCHES if p.where == "jax.device_put").upstream()
    host = _aligned_int32(16)
    array = upstream(host, jax.devices("cpu")[0], may_alias=False)
    array.block_until_ready()
    host[0] = 7
    assert int(array[0]) == 7


def test_patched_device_put_copies_numpy_on_cpu():
    import jax

    patches.apply_all()
    host = _aligned_int32(16)
    array = jax.device_put(host, jax.devices("cpu")[0])
    array.block_until_ready()
    host[0] = 7
    assert int(array[0]) == 0
