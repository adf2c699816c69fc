#!/usr/bin/env bash
# Create (or bring up to date) the torch_xla test environment, .venv-torch-xla:
#
#   torch 2.9.0 + torch_xla 2.9.0   torch_xla's newest release; its built-in PJRT CPU client
#                                   runs our typed-FFI custom calls (docs/torch_xla.md)
#   jax 0.7.1 + jaxlib 0.7.1        jax.ffi.include_dir() = XLA FFI 0.1 headers, the version
#                                   torch_xla 2.9's XLA accepts; xla-kernels' build needs jax
#   pytest and xla-kernels' own dependencies
#
# PyPI's torch 2.9.0 for x86_64 is its CUDA build, so the env is ~7.7 GB and takes ~3 min
# on a fresh machine (measured: docs/torch_xla.md). Nothing in it runs CUDA.
#
# Usage: bash scripts/torch_xla_env.sh   then: .venv-torch-xla/bin/python -m pytest tests/torch_xla_frontend
# Env:   XK_TORCH_XLA_VENV (default <repo>/.venv-torch-xla), PYTHON (default python3.11).
# Idempotent: a second run checks the stamp and the imports and returns in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${XK_TORCH_XLA_VENV:-$ROOT/.venv-torch-xla}"
PY="${PYTHON:-python3.11}"
START=$(date +%s)
PINS=(torch==2.9.0 torch_xla==2.9.0 jax==0.7.1 jaxlib==0.7.1 numpy==2.4.6 ml_dtypes==0.6.0
      filelock==4.2.11 pytest==9.2.0)
STAMP="$VENV/.xk-torch-xla-env"

check() {
  PJRT_DEVICE=CPU "$VENV/bin/python" - <<'PY'
import warnings
warnings.simplefilter("ignore")
import jax, torch, torch_xla
x = torch.tensor([1.0, 2.0, 3.0], device=torch_xla.device())
assert (x + 1).cpu().tolist() == [2.0, 3.0, 4.0]
print(f"torch {torch.__version__}, torch_xla {torch_xla.__version__}, jax {jax.__version__}, "
      f"FFI headers {jax.ffi.include_dir()}")
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "${PINS[*]}" ]] && check 2>/dev/null; then
  echo "torch_xla env: $VENV is up to date ($(( $(date +%s) - START )) s)"
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
rm -f "$STAMP"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q "${PINS[@]}" 2>&1 \
  | grep -v "^WARNING: Location" || true
check
echo "${PINS[*]}" > "$STAMP"
echo "torch_xla env: ready in $(( $(date +%s) - START )) s; $VENV is $(du -sm "$VENV" | cut -f1) MB"
