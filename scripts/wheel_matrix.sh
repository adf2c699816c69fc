#!/usr/bin/env bash
# The wheel on a version matrix (CI: `make test-wheel`), in two steps:
#
#   wheel_matrix.sh venvs   one fresh venv per torch (torch, jax, pytest): `make wheel` then
#                           prebuilds the torch dispatcher library for each of them
#   wheel_matrix.sh test    for each torch venv and each jaxlib: the wheel from dist/ (not this
#                           checkout's sources) and that jax+jaxlib installed into it; the
#                           shipped ops' CPU tests run with no compiler on PATH, an empty build
#                           cache and XLA_KERNELS_BUILD=never (a compile would be an error), and
#                           the cache must still be absent afterwards: nothing was compiled.
#
#   TORCHES   torch versions (default "2.13.0 2.12.1": the CPU build on this disk, and PyPI's
#             CUDA build of 2.12.1, which imports and runs on a CPU machine)
#   JAXLIBS   jax/jaxlib versions (default "0.10.0 0.10.2")
#   SEED      a venv whose torch, where it is the version wanted, is hard-linked into the new
#             venv instead of downloaded (default .venv)
#   PRUNE_ENVS  non-empty: remove the matrix venvs once tested (CI's disk)
#
# Left out of the tests: those that run torch.compile (inductor compiles C++ with the
# compilers this check removes) and the one that calls the builder on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHES=${TORCHES:-"2.13.0 2.12.1"}
JAXLIBS=${JAXLIBS:-"0.10.0 0.10.2"}
WORK=${WORK:-build/matrix}
PYTHON=${PYTHON:-python3}
SEED=${SEED:-.venv}
step=${1:?usage: wheel_matrix.sh venvs|test}
first_jax=${JAXLIBS%% *}
if [ "$step" = venvs ]; then
  for torch_version in $TORCHES; do
    venv="$WORK/torch-$torch_version"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    # The torch that .venv already has is hard-linked in, not downloaded again (~5 GB of disk
    # for PyPI's CUDA build; scripts/link_dists.py).
    if [ -x "$SEED/bin/python" ] && [ "$("$SEED/bin/python" -c \
        'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)" = "$torch_version" ]
    then
      "$SEED/bin/python" scripts/link_dists.py \
        "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" torch
    fi
    "$venv/bin/pip" install -q --no-cache-dir "torch==$torch_version" "jax==$first_jax" "jaxlib==$first_jax" \
      pytest hypothesis "torchax>=0.0.13" filelock flatbuffers
  done
  exit 0
fi
wheel=${WHEEL:-$(ls dist/xla_kernels-*.whl | head -1)}
tests="tests/test_simple_add.py tests/test_rms_norm.py tests/test_kv_cache.py
       tests/test_fused_kv_cache.py tests/test_paged_attention.py
       tests/test_ragged_paged_attention.py tests/test_sampling.py
       tests/test_moe.py tests/test_fp8_linear.py"
deselect="not compile"
bare_bin="$WORK/bin"
mkdir -p "$bare_bin"
summary=()
for torch_version in $TORCHES; do
  venv="$WORK/torch-$torch_version"
  for jax_version in $JAXLIBS; do
    "$venv/bin/pip" install -q "$wheel" "jax==$jax_version" "jaxlib==$jax_version"
    # The same version number as an earlier wheel in this venv: replace it all the same.
    "$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
    cache=$(mktemp -d)/cache
    ln -sf "$(cd "$venv/bin" && pwd)/python" "$bare_bin/python"
    echo "== torch $torch_version, jax/jaxlib $jax_version: $($venv/bin/python -c \
      'import xla_kernels, os; print(os.path.dirname(xla_kernels.__file__))')"
    # PATH holds only python: no g++, c++, nvcc; CXX and XLA_KERNELS_NVCC unset.
    env -u CXX -u XLA_KERNELS_NVCC -u PYTHONPATH PATH="$(cd "$bare_bin" && pwd)" \
      XLA_KERNELS_CACHE_DIR="$cache" XLA_KERNELS_BUILD=never \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider $tests -k "$deselect"
    # Torch eager calls must have run on the prebuilt torch dispatcher, not on its fallback.
    env -u CXX -u XLA_KERNELS_NVCC -u PYTHONPATH PATH="$(cd "$bare_bin" && pwd)" \
      XLA_KERNELS_CACHE_DIR="$cache" XLA_KERNELS_BUILD=never "$venv/bin/python" -c "
import torch
from xla_kernels.builder import used_libraries
from xla_kernels.frontends.torch import torch_op
from xla_kernels.frontends.torch.native import native_status
from xla_kernels.kernels.simple_add import simple_add
assert torch_op(simple_add)(torch.ones(3), torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
assert native_status().startswith('active: ') and '_prebuilt' in native_status(), native_status()
kinds = {name: r.kind for (name, _), r in used_libraries().items()}
assert set(kinds.values()) == {'prebuilt'}, kinds
print('torch dispatcher and kernels prebuilt:', sorted(kinds))"
    if [ -e "$cache" ]; then
      echo "error: torch $torch_version, jax $jax_version: the build cache was written:" >&2
      ls -la "$cache" >&2
      exit 1
    fi
    summary+=("torch $torch_version x jax $jax_version: passed, nothing compiled")
  done
done
printf '%s\n' "${summary[@]}"
if [ -n "${PRUNE_ENVS:-}" ]; then rm -rf "$WORK"; fi
