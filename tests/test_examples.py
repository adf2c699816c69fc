"""The README's example op works as written, on the CPU here and on the GPU there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xla_kernels.bench import load_script

EXAMPLES = Path(__file__).parents[1] / "examples"


scale = load_script(EXAMPLES / "scale" / "scale.py").scale


def test_readme_scale_op_runs_with_its_attribute(rng):
    x = rng.standard_normal(1001).astype(np.float32)
    out = jax.jit(lambda x: scale(x, factor=-1.5))(x)
    np.testing.assert_allclose(np.asarray(out), x * np.float32(-1.5), rtol=0)


def test_readme_scale_example_script_prints_the_custom_call():
    result = subprocess.run([sys.executable, str(EXAMPLES / "scale" / "scale.py")],
                            capture_output=True, text=True, timeout=300, check=True)
    assert 'custom_call_target="my_project.scale"' in result.stdout


@pytest.mark.gpu
def test_readme_scale_op_runs_on_the_gpu(rng):
    x = jnp.asarray(rng.standard_normal(100_003).astype(np.float32))
    assert x.devices().pop().platform == "gpu"
    np.testing.assert_allclose(np.asarray(scale(x, factor=3.0)), np.asarray(x) * 3.0, rtol=0)


def test_demo_main_job_runs_and_checks_its_results(tmp_path):
    out = tmp_path / "demo.json"
    result = subprocess.run([sys.executable, "-m", "xla_kernels.demo", "--size-log2", "12",
                             "--iters", "2", "--json", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "simple_add([1, 2, 3], [4, 5, 6]) = [5.0, 7.0, 9.0]" in result.stdout
    assert 'custom_call_target="xla_kernels.simple_add"' in result.stdout
    assert 'custom_call_target="xla_kernels.pa' in result.stdout
    numbers = json.loads(out.read_text())
    assert numbers["simple_add"]["exact"] and numbers["paged_attention"]["rel_error"] < 1e-5
    if numbers["backend"] != "gpu":  # each CPU ratio is printed with its caveat
        assert result.stdout.count("this ratio says nothing about speed") == 2, result.stdout
