"""xla_kernels.env: the one list of the environment variables the library reads, and the
one place that reads them."""

from __future__ import annotations

import ast
import doctest
import re
from pathlib import Path

import pytest

from xla_kernels import env

SRC = Path(env.__file__).parent

# Modules that touch os.environ for another reason than reading a setting, with the reason.
OTHER_USES = {
    "env.py": "the reader",
    "bench.py": "environment(): sets variables for a block and restores them",
    "serving/bench.py": "records the runtime's settings (XLA_FLAGS, ...) in result files",
    "serving/cli.py": "serve-bench sets PJRT_GPU_ENABLE_ASYNC_DISPATCH for JAX unless already set",
    "vllm/check.py": "sets vLLM's and JAX's variables before importing them",
    "vllm/platform.py": "sets vLLM's VLLM_ENABLE_V1_MULTIPROCESSING",
}


def test_doctests_pass():
    assert doctest.testmod(env).failed == 0


def test_an_undeclared_variable_is_refused_with_where_to_declare_it():
    with pytest.raises(KeyError, match=r"add it to xla_kernels\.env\.VARIABLES"):
        env.get("XLA_KERNELS_NOT_A_SETTING")


def test_unset_variables_give_their_defaults_and_set_ones_their_value():
    assert env.get("XLA_KERNELS_VLLM_DEVICE_MEMORY_GB", {}) == "4"
    assert env.get("XLA_KERNELS_CACHE_DIR", {}) is None
    assert env.get("XLA_KERNELS_CACHE_DIR", {"XLA_KERNELS_CACHE_DIR": "/c"}) == "/c"


def test_the_build_key_takes_exactly_the_compilers_variables():
    environ = {"NVCC_APPEND_FLAGS": "-G", "CPATH": "/i", "XLA_KERNELS_QUIET": "1", "HOME": "/"}
    assert env.build_env(environ) == ["CPATH=/i", "NVCC_APPEND_FLAGS=-G"]


def test_no_other_module_reads_the_environment():
    readers = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.setdefault(rel, node.lineno)
    assert set(readers) <= set(OTHER_USES), {k: v for k, v in readers.items()
                                              if k not in OTHER_USES}


def test_every_variable_the_cuda_sources_read_is_declared_as_theirs():
    read = set()
    for path in [*SRC.rglob("*.cu"), *SRC.rglob("*.cuh"), *SRC.rglob("*.h"), *SRC.rglob("*.cc")]:
        read |= set(re.findall(r'getenv\("(\w+)"\)', path.read_text()))
    declared = {v.name for v in env.VARIABLES.values() if v.reader == "cuda kernel"}
    assert read == declared
