"""tests/vllm runs in .venv-vllm only (scripts/vllm_env.sh; `make test-vllm`): elsewhere,
without vllm and tpu-inference installed, its tests are not collected."""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("tpu_inference") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # Set before vLLM or tpu-inference is imported (xla_kernels.vllm.check.configure).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for name, value in {"TPU_NAME": "none", "TPU_ACCELERATOR_TYPE": "none",
                        "TPU_WORKER_ID": "0"}.items():
        os.environ.setdefault(name, value)


@pytest.fixture
def engine_config():
    """``engine_config(model_dir, **engine_args)``: vLLM's engine configuration for a model
    folder, in this process (which runs our platform's ``check_and_update_config``); no
    model is loaded. dtype defaults to float32."""

    def configure(model_dir, **engine):
        from vllm.engine.arg_utils import EngineArgs

        engine = {"dtype": "float32", **engine}
        return EngineArgs(model=str(model_dir), max_model_len=512, skip_tokenizer_init=True,
                          **engine).create_engine_config()

    return configure
