#!/usr/bin/env bash
# Create (or bring up to date) the vLLM environment, .venv-vllm: vLLM's own engine
# (vllm-tpu 0.32.0 + tpu-inference 0.32.0, its JAX backend) with xla-kernels installed
# editable, so that `python -m xla_kernels.vllm.check` and tests/vllm run through our kernels.
#
#   Python 3.12     vllm-tpu 0.32.0 ships a wheel for cp312 only (for 3.11 there is just an
#                   sdist that builds against torch 2.14), and tokamax needs >= 3.12
#   torch 2.10.0    torchvision 0.25.0 (tpu-inference's pin) pins it; PyPI has only its CUDA
#                   build, which does not import without the nvidia-* libraries, so they come too
#   jax 0.11.2      tpu-inference's pin (the CPU jaxlib; the GPU plugin is not installed here)
#
# Measured on a fresh 2-core machine: ~4-7 min (most of it unpacking torch and nvidia-*),
# 8.0 GB.
#
# scripts/vllm_requirements.txt pins every package, each installed with --no-deps: what
# vLLM and tpu-inference require but never import on this path (ray, nixl, libtpu, numba,
# opencv, xprof, triton, torchvision, runai/gcs streamers, ...) is left out, which saves
# about 3 GB. torch and each nvidia-* wheel go in a pip call of their own so the disk peak
# is the finished env plus one wheel. Before it starts, the script checks the free space.
#
# Usage: bash scripts/vllm_env.sh   then: .venv-vllm/bin/python -m xla_kernels.vllm.check
# Env:   XK_VLLM_VENV (default <repo>/.venv-vllm), PYTHON (a CPython 3.12; default: the first
#        of python3.12 on PATH and pyenv's 3.12.*), XK_VLLM_NEED_MB (free disk it insists on
#        before building, default 9000).
# Idempotent: a second run checks the stamp and the imports and returns in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${XK_VLLM_VENV:-$ROOT/.venv-vllm}"
REQS="$ROOT/scripts/vllm_requirements.txt"
STAMP="$VENV/.xk-vllm-env"
START=$(date +%s)

source "$ROOT/scripts/find_python.sh"

check() {
  # The TPU_* values keep tpu-inference's import from polling the GCE metadata server.
  JAX_PLATFORMS=cpu TPU_NAME=none TPU_ACCELERATOR_TYPE=none TPU_WORKER_ID=0 \
    "$VENV/bin/python" - <<'PY'
import warnings
warnings.simplefilter("ignore")
import jax, torch, vllm, tpu_inference, xla_kernels.vllm  # noqa: F401
import importlib.metadata as md
print(f"vllm {vllm.__version__}, tpu-inference {md.version('tpu-inference')}, "
      f"jax {jax.__version__}, torch {torch.__version__}")
PY
}

want="$(sha256sum "$REQS" | cut -d' ' -f1) $(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && check 2>/dev/null; then
  echo "vllm env: $VENV is up to date ($(( $(date +%s) - START )) s)"
  exit 0
fi
if ! PY="$(find_python 3.12 "${PYTHON:-}")"; then
  echo "vllm env: no CPython 3.12 found (tried \$PYTHON, python3.12 on PATH, pyenv's" \
       "versions/3.12*, /usr/bin/python3.12). vllm-tpu 0.32.0 has a wheel for 3.12 only." \
       "Fix: install Python 3.12 (pyenv install 3.12) or set PYTHON=/path/to/python3.12." >&2
  exit 1
fi
NEED_MB=${XK_VLLM_NEED_MB:-9000}
mkdir -p "$(dirname "$VENV")"
FREE_MB=$(df -Pm "$(dirname "$VENV")" | awk 'NR==2 {print $4}')
if [[ ! -f "$VENV/bin/python" ]] && (( FREE_MB < NEED_MB )); then
  echo "vllm env: $(dirname "$VENV") has ${FREE_MB} MB free; building $VENV needs about" \
       "${NEED_MB} MB (PyPI's torch 2.10.0 is its CUDA build, with ~3 GB of nvidia-* wheels)." \
       "Fix: free some disk, or set XK_VLLM_VENV to a path on a larger disk." >&2
  exit 1
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
rm -f "$STAMP"
pip_install() {
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -q --no-deps \
    "$@" 2>&1 | { grep -v -e "^WARNING: Location" || true; }
  return "${PIPESTATUS[0]}"
}
mapfile -t ALL < <(grep -vE '^\s*(#|$)' "$REQS")
BIG=() REST=()
for req in "${ALL[@]}"; do
  if [[ "$req" == torch==* || "$req" == nvidia-* ]]; then BIG+=("$req"); else REST+=("$req"); fi
done
for req in "${BIG[@]}"; do
  pip_install "$req"   # an exact pin already installed costs no download
done
pip_install "${REST[@]}"
pip_install -e "$ROOT"
check
echo "$want" > "$STAMP"
echo "vllm env: ready in $(( $(date +%s) - START )) s; $VENV is $(du -sm "$VENV" | cut -f1) MB"
