"""Setup for the torch_xla tests: CPU runtime, xla_kernels importable from src/."""

import os
import sys
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")

_SRC = Path(__file__).resolve().parents[2] / "src"
try:
    import xla_kernels  # noqa: F401
except ImportError:
    sys.path.insert(0, str(_SRC))
