"""The plugins select our platform and backend off TPU, and nothing on a TPU host."""

from __future__ import annotations

import pytest

from xla_kernels.vllm import platform


def test_detect_selects_us_without_a_tpu(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv(platform.ENV, raising=False)
    assert platform.detect() == "xla_kernels.vllm.platform.XlaKernelsPlatform"


@pytest.mark.parametrize(("jax_platforms", "choice", "selected"),
                         [("tpu", "", False), ("cpu", "0", False), ("tpu", "1", True),
                          ("cuda", "", True)])
def test_detect_respects_tpu_and_the_switch(monkeypatch, jax_platforms, choice, selected):
    monkeypatch.setenv("JAX_PLATFORMS", jax_platforms)
    monkeypatch.setenv(platform.ENV, choice)
    assert (platform.detect() is not None) == selected


def test_entry_points_are_installed():
    from importlib.metadata import entry_points

    assert any(e.value == "xla_kernels.vllm.platform:detect"
               for e in entry_points(group="vllm.platform_plugins"))
    assert any(e.value == "xla_kernels.vllm:register"
               for e in entry_points(group="vllm.general_plugins"))


def test_register_makes_the_default_backend_run_ours_on_both_model_paths(monkeypatch):
    """Both model paths reach RPAAttentionBackend (the JAX-native models through
    attention()'s default, the PyTorch models through the name "rpa"); after register() its
    methods are ours, and the name a spawned EngineCore unpickles is still the plain "rpa"."""
    import jax.numpy as jnp
    from tpu_inference.layers.common import attention_backend

    import xla_kernels.vllm
    from xla_kernels.vllm import attention
    from xla_kernels.vllm.backend import XlaKernelsAttentionBackend

    xla_kernels.vllm.register()
    rpa = attention_backend.create_attention_backend("rpa")
    ours = XlaKernelsAttentionBackend()
    assert (rpa.get_kv_cache_shape(64, 16, 4, 128, jnp.bfloat16)
            == ours.get_kv_cache_shape(64, 16, 4, 128, jnp.bfloat16))
    calls = []
    monkeypatch.setattr(attention, "attend", lambda *a, **k: calls.append(k) or ("cache", "out"))
    cache = jnp.zeros((1, 16, 2, 2, 128), jnp.bfloat16)
    assert rpa.attention(cache, "q", "k", "v", _Metadata(), _Metadata(), _Mesh(),
                         **_ATTENTION_KWARGS) == ("cache", "out")
    assert calls and calls[0]["scale"] == 0.125


class _Metadata:
    seq_lens = block_tables = query_start_loc = request_distribution = None


class _Mesh:
    def __init__(self):
        self.shape = {"data": 1, "model": 1}


_ATTENTION_KWARGS = dict(head_dim_original=128, sm_scale=0.125, attention_chunk_size=None,
                         q_scale=None, k_scale=None, v_scale=None, sinks=None,
                         update_kv_cache=True, use_causal_mask=True, attn_logits_soft_cap=None,
                         decode_query_size=1)


def test_core_never_imports_vllm():
    """Integrations sit on top: only xla_kernels/vllm may import vllm or tpu_inference."""
    import re
    from pathlib import Path

    import xla_kernels

    root = Path(xla_kernels.__file__).parent
    pattern = re.compile(r"^\s*(from|import)\s+(vllm|tpu_inference)\b", re.MULTILINE)
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if "vllm" not in p.relative_to(root).parts[:1] and pattern.search(p.read_text())]
    assert offenders == []


def test_detect_keeps_the_engine_in_process_unless_told(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    platform.detect()
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    platform.detect()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_detect_turns_on_async_dispatch_unless_told(monkeypatch):
    import os

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv(platform.ASYNC_DISPATCH, raising=False)
    platform.detect()
    assert os.environ[platform.ASYNC_DISPATCH] == "1"
    monkeypatch.setenv(platform.ASYNC_DISPATCH, "0")
    platform.detect()
    assert os.environ[platform.ASYNC_DISPATCH] == "0"
    monkeypatch.setenv("XLA_KERNELS_VLLM", "0")
    monkeypatch.delenv(platform.ASYNC_DISPATCH)
    assert platform.detect() is None
    assert platform.ASYNC_DISPATCH not in os.environ


def _hide_our_entry_points(monkeypatch):
    """What a process sees when xla_kernels is importable but not installed."""
    import importlib.metadata as metadata

    real = metadata.entry_points

    def without_ours(**selection):
        return metadata.EntryPoints(e for e in real(**selection)
                                    if not e.value.startswith("xla_kernels."))

    monkeypatch.setattr(metadata, "entry_points", without_ours)


def test_plugin_problem_is_none_when_installed():
    assert platform.plugin_installed() and platform.plugin_problem() is None


def test_plugin_problem_names_the_cause_and_both_fixes(monkeypatch):
    _hide_our_entry_points(monkeypatch)
    problem = platform.plugin_problem()
    assert problem is not None
    assert "no installed distribution declares its vllm.platform_plugins entry point" in problem
    assert "vllm._C_stable_libtorch" in problem
    assert "Fix: install the package (pip install" in problem
    assert "xla_kernels.vllm.activate()" in problem


def test_doctor_says_whether_vllm_finds_our_platform(monkeypatch):
    from xla_kernels import cli

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv(platform.ENV, raising=False)
    assert "xla-kernels' platform plugin installed, selected where JAX has no TPU" in cli._vllm()
    _hide_our_entry_points(monkeypatch)
    assert "vLLM will not find xla-kernels' platform" in cli._vllm()


def test_detect_warns_when_a_tpu_setting_hides_an_nvidia_gpu(monkeypatch, caplog):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    monkeypatch.delenv(platform.ENV, raising=False)
    monkeypatch.setattr(platform.glob, "glob",
                        lambda pattern: ["/dev/nvidia0"] if "nvidia" in pattern else [])
    with caplog.at_level("WARNING", logger=platform.__name__):
        assert platform.detect() is None
    assert "Fix: set XLA_KERNELS_VLLM=1" in caplog.text


_ACTIVATE = """
import importlib.metadata as metadata
real = metadata.entry_points
metadata.entry_points = lambda **s: metadata.EntryPoints(
    e for e in real(**s) if not e.value.startswith("xla_kernels."))
import xla_kernels.vllm as xv
from xla_kernels.vllm import platform
assert platform.plugin_problem() is not None
if {activate}:
    xv.activate()
    xv.activate()  # a second call is harmless
from vllm.platforms import current_platform
print(type(current_platform).__name__, platform._registered)
if not {activate}:
    try:
        xv.activate()
    except RuntimeError as e:
        print(e)
"""


@pytest.mark.parametrize("activate", [True, False])
def test_activate_selects_our_platform_without_the_entry_points(activate):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ACTIVATE.format(activate=activate)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    if activate:
        assert lines[-1] == "XlaKernelsPlatform True"
    else:  # vLLM picked its own platform; activate() then refuses, naming it and the fix
        assert not lines[0].startswith("XlaKernelsPlatform")
        assert "vLLM already selected" in lines[-1] and "Fix: call activate()" in lines[-1]


def test_every_program_is_cached_unless_the_user_set_the_thresholds(monkeypatch):
    import jax

    names = list(platform.CACHE_THRESHOLDS)
    before = {n: getattr(jax.config, n) for n in names}
    try:
        for n in names:
            monkeypatch.delenv(n.upper(), raising=False)
        jax.config.update(names[0], 1.0)
        platform.cache_every_program()
        assert {n: getattr(jax.config, n) for n in names} == platform.CACHE_THRESHOLDS
        jax.config.update(names[0], 1.0)
        monkeypatch.setenv(names[0].upper(), "1.0")
        platform.cache_every_program()
        assert getattr(jax.config, names[0]) == 1.0
    finally:
        for n, v in before.items():
            jax.config.update(n, v)
