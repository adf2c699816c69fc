#!/usr/bin/env bash
# Create (or bring up to date) the torch_xla test environment, .venv-torch-xla:
#
#   torch 2.9.0 + torch_xla 2.9.0   torch_xla's newest release; its built-in PJRT CPU client
#                                   runs our typed-FFI custom calls (docs/torch_xla.md)
#   jax 0.7.1 + jaxlib 0.7.1        jax.ffi.include_dir() = XLA FFI 0.1 headers, the version
#                                   torch_xla 2.9's XLA accepts; xla-kernels' build needs jax
#   pytest and xla-kernels' own dependencies
#
# PyPI's torch 2.9.0 for x86_64 is its CUDA build, so the env is ~7 GB and takes ~3 min
# on a fresh machine (measured: docs/torch_xla.md). Nothing in it runs CUDA.
#
# Disk: one `pip install` of the whole set downloads ~4 GB of wheels before it unpacks any,
# so it peaked at 11.7 GB on the disk, which once failed CI with "No space left on device".
# This script installs torch alone (--no-deps), then each of torch's own requirements in a
# pip call of its own (nvidia-* one wheel at a time), then the rest; triton, which only GPU
# code uses, is left out. The peak is the finished env plus one wheel (7.3 GB measured).
# Before it starts, it checks the free space and says how much it needs.
#
# Usage: bash scripts/torch_xla_env.sh   then: .venv-torch-xla/bin/python -m pytest tests/torch_xla_frontend
# Env:   XK_TORCH_XLA_VENV (default <repo>/.venv-torch-xla), PYTHON (default python3.11),
#        XK_TORCH_XLA_NEED_MB (free disk it insists on before building, default 8000).
# Idempotent: a second run checks the stamp and the imports and returns in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${XK_TORCH_XLA_VENV:-$ROOT/.venv-torch-xla}"
PY="${PYTHON:-python3.11}"
START=$(date +%s)
TORCH_PIN=torch==2.9.0      # installed first, alone (see Disk above)
OTHER_PINS=(torch_xla==2.9.0 jax==0.7.1 jaxlib==0.7.1 numpy==2.4.6 ml_dtypes==0.6.0
            filelock==4.2.11 pytest==9.2.0)
PINS=("$TORCH_PIN" "${OTHER_PINS[@]}")
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
NEED_MB=${XK_TORCH_XLA_NEED_MB:-8000}
FREE_MB=$(df -Pm "$(dirname "$VENV")" | awk 'NR==2 {print $4}')
if (( FREE_MB < NEED_MB )); then
  echo "torch_xla env: $(dirname "$VENV") has ${FREE_MB} MB free; building $VENV needs about" \
       "${NEED_MB} MB (torch 2.9.0 from PyPI is its CUDA build). Fix: free some disk, or" \
       "set XK_TORCH_XLA_VENV to a path on a larger disk." >&2
  exit 1
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
rm -f "$STAMP"
pip_install() {
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -q "$@" 2>&1 \
    | { grep -v -e "^WARNING: Location" -e "^ERROR: pip's dependency resolver" \
        -e "^torch .* requires triton" || true; }
  return "${PIPESTATUS[0]}"
}
# torch's requirements (markers evaluated here), without triton: one line each.
torch_requirements() {
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("torch") or []:
    req = Requirement(line)
    if req.name != "triton" and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(f"{req.name}{req.specifier}")
PY
}
pip_install --no-deps "$TORCH_PIN"
PLAIN=()
while read -r req; do
  if [[ "$req" == nvidia-* ]]; then
    pip_install --no-deps "$req"   # pinned by torch; their own requirements are in this list
  else
    PLAIN+=("$req")
  fi
done < <(torch_requirements)
pip_install "${PLAIN[@]}" "${OTHER_PINS[@]}"
check
echo "${PINS[*]}" > "$STAMP"
echo "torch_xla env: ready in $(( $(date +%s) - START )) s; $VENV is $(du -sm "$VENV" | cut -f1) MB"
