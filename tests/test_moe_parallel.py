"""fused_moe_sharded (expert, tensor and token parallel) on eight fake CPU devices: runs
tests/moe_parallel_cases.py under pytest in a fresh process, since the CPU device count is
fixed when JAX starts (this process may already have started it with one device)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("moe_parallel_cases.py")


def test_sharded_moe_cases_on_eight_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(CASES)], capture_output=True, text=True, timeout=900, env=env,
                            cwd=CASES.parent.parent)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
