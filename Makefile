# Two commands on a fresh machine:
#   make demo      create .venv, install xla-kernels, build/register/run the kernels, time them
#   make test      same set-up, then ruff and the CPU suite less its slow cases, in parallel
#   make test-all  (CI) the whole CPU suite, slow cases too, then the torch_xla and vLLM suites,
#                  each in its own env, and the wheel on its version matrix
#   make wheel     dist/xla_kernels-*.whl with every shipped library prebuilt (docs/prebuilt.md)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.12.1: the newest torch that torchax 0.0.13 imports under (torch 2.13 removed
# named-tensor overloads that torchax's tables name). PyPI ships its CUDA build, which runs
# on CPU-only machines too; override with e.g. TORCH_SPEC=torch==2.11.0 on a GPU machine.
TORCH_SPEC ?= torch==2.12.1
PYTEST_ARGS ?=
# pytest-xdist workers (-n; 0: no workers), one per core by default, each given whole test
# files (module fixtures are built once). They share the build cache (one file lock per
# library, artifacts renamed into place), so each library compiles once.
PYTEST_JOBS ?= auto
# The cases `make test` leaves out (`@pytest.mark.slow`); `make test-all` runs them too.
QUICK := -m "not slow"
# Non-empty: each suite's own environment is removed once its tests pass, so that
# `make test-all` never holds them all on disk at once (~20 GB together; CI sets it).
PRUNE_ENVS ?=

# Other torch interpreters whose torch dispatcher library `make wheel` also prebuilds; by default
# those of the wheel matrix's venvs where they exist (`bash scripts/wheel_matrix.sh venvs`:
# cp311 torch 2.13.0 and 2.12.1, cp312 torch 2.11.0).
WHEEL_TORCH_PYTHONS ?= $(wildcard build/matrix/py*/bin/python)

.PHONY: demo test test-all test-main test-torch-xla test-vllm test-wheel wheel lint gpu clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e ".[dev,torchax]" "$(TORCH_SPEC)"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python -m xla_kernels.demo

test: $(BIN)/.installed
	$(MAKE) test-main MARKS='$(QUICK)'

test-all: test-main test-torch-xla test-vllm test-wheel

wheel: $(BIN)/.installed
	nice $(BIN)/python scripts/build_wheel.py \
		$(foreach p,$(WHEEL_TORCH_PYTHONS),--torch-python $(p))

# The wheel installed into fresh venvs (its points: Python 3.11 and 3.12, torch 2.11 to 2.13,
# jax 0.10 to 0.12), the shipped ops' CPU tests run there with no compiler and nothing
# compiled (scripts/wheel_matrix.sh)
test-wheel: $(BIN)/.installed
	bash scripts/wheel_matrix.sh venvs
	$(MAKE) wheel WHEEL_TORCH_PYTHONS="$$(ls build/matrix/py*/bin/python)"
	PRUNE_ENVS=$(PRUNE_ENVS) bash scripts/wheel_matrix.sh test

# MARKS: a marker selection, e.g. -m "not slow" (`make test`); empty: every case
MARKS ?=
test-main: $(BIN)/.installed
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/python -m pytest -q -n $(PYTEST_JOBS) --dist loadfile $(MARKS) \
		--ignore=tests/torch_xla_frontend --ignore=src/xla_kernels/vllm \
		--doctest-modules src tests $(PYTEST_ARGS)

test-torch-xla:
	bash scripts/torch_xla_env.sh
	.venv-torch-xla/bin/python -m pytest -q tests/torch_xla_frontend $(PYTEST_ARGS)
	$(if $(PRUNE_ENVS),rm -rf .venv-torch-xla)

# vLLM's engine (vllm-tpu + tpu-inference, Python 3.12) on our attention: docs/vllm.md
test-vllm:
	bash scripts/vllm_env.sh
	.venv-vllm/bin/python -m pytest -q tests/vllm --doctest-modules src/xla_kernels/vllm \
		$(PYTEST_ARGS)
	$(if $(PRUNE_ENVS),rm -rf .venv-vllm)

lint: $(BIN)/.installed
	$(BIN)/ruff check src tests benchmarks examples scripts

clean:
	rm -rf $(VENV) .venv-torch-xla .venv-vllm .pytest_cache build dist
