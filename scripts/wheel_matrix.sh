#!/usr/bin/env bash
# The wheel on a version matrix (CI: `make test-wheel`), in two steps:
#
#   wheel_matrix.sh venvs   one fresh venv per (Python, torch) of the points below
#                           (build/matrix/py<python>-torch-<torch>): `make wheel` then
#                           prebuilds the torch dispatcher library for each of them
#   wheel_matrix.sh test    for each point: the wheel from dist/ (not this checkout's sources)
#                           and that jax+jaxlib installed into its venv; the shipped ops' CPU
#                           tests run with no compiler on PATH, an empty build cache and
#                           XLA_KERNELS_BUILD=never (a compile would be an error), and the
#                           cache must still be absent afterwards: nothing was compiled.
#
#   POINTS    the matrix, one point a line: "<python> <torch> <jax/jaxlib>" (default below)
#   SEED      a venv whose torch, where it is the Python and torch version wanted, is
#             hard-linked into the new venv instead of downloaded (default .venv)
#   PRUNE_ENVS  non-empty: remove the matrix venvs once tested (CI's disk)
#   JOBS      pytest-xdist workers for each point's tests (default auto: one per core)
#
# The default points, and why these (each point's tests take 1 to 1.5 min here, a torch venv
# 1 to 5 min; every point shares one wheel, so a point tests a torch dispatcher, a jaxlib and
# a Python against that one build):
#   3.11 2.13.0 0.10.0    torch's CPU build (on this machine's disk) on the jaxlib whose FFI
#                         headers (API 0.3) the wheel is built against
#   3.11 2.12.1 0.10.2    PyPI's CUDA build of the torch that .venv has (hard-linked, no
#                         download; it runs on the CPU), the newest jaxlib 0.10
#   3.12 2.11.0 0.10.2    PyPI's CUDA build of torch 2.11 (the GPU machine's torch; cp312, the
#                         second torch dispatcher ABI) on jaxlib 0.10
#   3.12 2.11.0 0.11.2    the GPU machine's versions; jaxlib 0.11 has FFI API 0.4
#   3.12 2.11.0 0.12.0.1  the newest jaxlib (FFI API 0.5)
# jaxlib 0.11 and 0.12 exist for Python >= 3.12 only, hence the 3.12 points; torch 2.13 with
# jaxlib 0.11+ would need a second ~5 GB torch download (PyPI has only its CUDA build for
# cp312) and tests no library the points above leave out.
#
# Left out of the tests: those that run torch.compile (inductor compiles C++ with the
# compilers this check removes) and the one that calls the builder on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/find_python.sh
POINTS=${POINTS:-"
3.11 2.13.0 0.10.0
3.11 2.12.1 0.10.2
3.12 2.11.0 0.10.2
3.12 2.11.0 0.11.2
3.12 2.11.0 0.12.0.1
"}
WORK=${WORK:-build/matrix}
SEED=${SEED:-.venv}
JOBS=${JOBS:-auto}
step=${1:?usage: wheel_matrix.sh venvs|test}
mapfile -t points < <(grep -vE '^\s*(#|$)' <<<"$POINTS")

venv_of() {  # python torch -> the point's venv
  echo "$WORK/py$1-torch-$2"
}

# The requirements of the installed torch that are nvidia-* wheels (markers evaluated).
nvidia_requirements() {
  "$1" - <<'PY'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("torch") or []:
    req = Requirement(line)
    if req.name.startswith("nvidia-") and (req.marker is None
                                           or req.marker.evaluate({"extra": ""})):
        print(f"{req.name}{req.specifier}")
PY
}

if [ "$step" = venvs ]; then
  rm -rf "$WORK"
  declare -A made=()
  for point in "${points[@]}"; do
    read -r python_version torch_version jax_version <<<"$point"
    venv=$(venv_of "$python_version" "$torch_version")
    [ -z "${made[$venv]:-}" ] || continue
    made[$venv]=1
    if ! python=$(find_python "$python_version"); then
      echo "error: no CPython $python_version found (python$python_version on PATH, pyenv's" \
           "versions/$python_version*, /usr/bin/python$python_version). Fix: install it" \
           "(pyenv install $python_version) or drop its points from POINTS." >&2
      exit 1
    fi
    start=$(date +%s)
    "$python" -m venv "$venv"
    pip=("$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check)
    # The torch that .venv already has is hard-linked in, not downloaded again (~5 GB of disk
    # for PyPI's CUDA build; scripts/link_dists.py).
    if [ -x "$SEED/bin/python" ] && [ "$("$SEED/bin/python" -c \
        'import importlib.metadata as m, sys; print("%d.%d" % sys.version_info[:2], m.version("torch"))' \
        2>/dev/null)" = "$python_version $torch_version" ]
    then
      "$SEED/bin/python" scripts/link_dists.py \
        "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" torch
    fi
    # torch and each nvidia-* wheel in a pip call of its own: the disk peak is the venv plus
    # one wheel, not the venv plus all ~3 GB of them (a no-op where they were linked).
    "${pip[@]}" --no-deps "torch==$torch_version"
    for req in $(nvidia_requirements "$venv/bin/python"); do
      "${pip[@]}" --no-deps "$req"
    done
    "${pip[@]}" "torch==$torch_version" "jax==$jax_version" "jaxlib==$jax_version" \
      pytest pytest-xdist hypothesis "torchax>=0.0.13" filelock flatbuffers
    echo "$venv: Python $python_version, torch $("$venv/bin/python" -c \
      'import torch; print(torch.__version__)'), $(du -sm "$venv" | cut -f1) MB (hard links" \
      "counted), $(( $(date +%s) - start )) s"
  done
  exit 0
fi
wheel=${WHEEL:-$(ls dist/xla_kernels-*.whl | head -1)}
tests="tests/test_simple_add.py tests/test_rms_norm.py tests/test_fused_add_rms_norm.py
       tests/test_kv_cache.py tests/test_fused_kv_cache.py tests/test_paged_attention.py
       tests/test_ragged_paged_attention.py tests/test_sampling.py
       tests/test_moe.py tests/test_moe_ep.py tests/test_fp8_linear.py"
deselect="not compile"
bare_bin="$WORK/bin"
mkdir -p "$bare_bin"
summary=()
for point in "${points[@]}"; do
  read -r python_version torch_version jax_version <<<"$point"
  venv=$(venv_of "$python_version" "$torch_version")
  start=$(date +%s)
  "$venv/bin/pip" install -q "$wheel" "jax==$jax_version" "jaxlib==$jax_version"
  # The same version number as an earlier wheel in this venv: replace it all the same.
  "$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
  cache=$(mktemp -d)/cache
  ln -sf "$(cd "$venv/bin" && pwd)/python" "$bare_bin/python"
  echo "== Python $python_version, torch $torch_version, jax/jaxlib $jax_version: $(
    "$venv/bin/python" -c 'import xla_kernels, os; print(os.path.dirname(xla_kernels.__file__))')"
  # PATH holds only python: no g++, c++, nvcc; CXX and XLA_KERNELS_NVCC unset.
  env -u CXX -u XLA_KERNELS_NVCC -u PYTHONPATH PATH="$(cd "$bare_bin" && pwd)" \
    XLA_KERNELS_CACHE_DIR="$cache" XLA_KERNELS_BUILD=never \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "$JOBS" $tests -k "$deselect"
  # Torch eager calls must have run on the prebuilt torch dispatcher, not on its fallback, and
  # the versions must be the point's.
  env -u CXX -u XLA_KERNELS_NVCC -u PYTHONPATH PATH="$(cd "$bare_bin" && pwd)" \
    XLA_KERNELS_CACHE_DIR="$cache" XLA_KERNELS_BUILD=never "$venv/bin/python" -c "
import sys, jax, jaxlib, torch
from xla_kernels.builder import used_libraries
from xla_kernels.frontends.torch import torch_op
from xla_kernels.frontends.torch.native import native_status
from xla_kernels.kernels.simple_add import simple_add
versions = ('%d.%d' % sys.version_info[:2], torch.__version__.split('+')[0], jax.__version__,
            jaxlib.__version__)
assert versions == ('$python_version', '$torch_version', '$jax_version', '$jax_version'), versions
assert torch_op(simple_add)(torch.ones(3), torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
assert native_status().startswith('active: ') and '_prebuilt' in native_status(), native_status()
kinds = {name: r.kind for (name, _), r in used_libraries().items()}
assert set(kinds.values()) == {'prebuilt'}, kinds
print('torch', torch.__version__, 'jaxlib', jaxlib.__version__,
      '- torch dispatcher and kernels prebuilt:', sorted(kinds))"
  if [ -e "$cache" ]; then
    echo "error: Python $python_version, torch $torch_version, jax $jax_version: the build" \
         "cache was written:" >&2
    ls -la "$cache" >&2
    exit 1
  fi
  summary+=("py$python_version torch $torch_version x jax $jax_version: passed, nothing compiled ($(( $(date +%s) - start )) s)")
done
printf '%s\n' "${summary[@]}"
if [ -n "${PRUNE_ENVS:-}" ]; then rm -rf "$WORK"; fi
