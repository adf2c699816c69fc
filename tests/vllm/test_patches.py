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
