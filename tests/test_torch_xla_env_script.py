"""scripts/torch_xla_env.sh refuses to start a build the disk cannot hold, and says how
much it needs and what to do (its full install peaks at ~7.3 GB; a full disk once failed
CI half-way through pip)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "torch_xla_env.sh"


def test_too_little_free_disk_is_refused_with_the_need_and_the_fix(tmp_path):
    venv = tmp_path / "env"
    proc = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "XK_TORCH_XLA_VENV": str(venv),
             "XK_TORCH_XLA_NEED_MB": str(10**12)})
    assert proc.returncode == 1
    message = proc.stderr.strip()
    assert message.startswith(f"torch_xla env: {tmp_path} has "), message
    assert f"MB free; building {venv} needs about {10**12} MB" in message
    assert "Fix: free some disk, or set XK_TORCH_XLA_VENV to a path on a larger disk." \
        in message
    assert not venv.exists()                 # nothing was created
