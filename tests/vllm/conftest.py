"""tests/vllm runs in .venv-vllm only (scripts/vllm_env.sh; `make test-vllm`): elsewhere,
without vllm and tpu-inference installed, its tests are not collected."""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("tpu_inference") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # Set before vLLM or tpu-inference is imported (xla_kernels.vllm.check.configure).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for name, value in {"TPU_NAME": "none", "TPU_ACCELERATOR_TYPE": "none",
                        "TPU_WORKER_ID": "0"}.items():
        os.environ.setdefault(name, value)
