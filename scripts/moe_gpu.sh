#!/usr/bin/env bash
# fused_moe on one GPU, one step per device call (each fits 10 minutes):
#
#   bash scripts/moe_gpu.sh OUT_DIR tests     # tests/gpu/test_moe_gpu.py
#   bash scripts/moe_gpu.sh OUT_DIR sanitize  # compute-sanitizer memcheck and racecheck on the
#                                             # moe sanitize cases (kernels/moe/testing.py)
#   bash scripts/moe_gpu.sh OUT_DIR bench     # benchmarks/moe.py (both models, bf16 and fp8)
#   bash scripts/moe_gpu.sh OUT_DIR serve     # serve-bench --preset moe, JAX then torchax
#
# Results go under OUT_DIR (moe_gpu_tests.txt, sanitizer_moe_*.txt, moe.json/md,
# serve_moe_*.json/txt). The CUDA library is built on first use into
# XLA_KERNELS_CACHE_DIR (default /tmp/xla-kernels-cache), so a warm machine builds it once.
# serve's torchax run needs torchax: a wheel in .whl/ is installed as gpu_run.sh does.
set -uo pipefail
usage="usage: moe_gpu.sh OUT_DIR tests|sanitize|bench|serve"
out=${1:?$usage}
mode=${2:?$usage}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export XLA_KERNELS_CACHE_DIR=${XLA_KERNELS_CACHE_DIR:-/tmp/xla-kernels-cache}
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
case $mode in
  tests)
    timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gpu.py 2>&1 \
      | tail -60 > "$out/moe_gpu_tests.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    tail -5 "$out/moe_gpu_tests.txt" ;;
  sanitize)
    for tool in memcheck racecheck; do
      timeout 280 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 -c \
        'from xla_kernels.kernels.moe.testing import sanitize_cases; sanitize_cases(); print("sanitize run finished")' \
        > "$out/sanitizer_moe_$tool.txt" 2>&1
      code=$?
      echo "exit code $code" >> "$out/sanitizer_moe_$tool.txt"
      [ "$code" -eq 0 ] || status=1
      tail -4 "$out/sanitizer_moe_$tool.txt"
    done ;;
  bench)
    timeout 570 python3 benchmarks/moe.py --out "$out" 2>&1 | tail -60 | tee "$out/moe.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
  serve)
    wheels=$(ls .whl/*.whl 2>/dev/null)
    if [ -n "$wheels" ] && ! python3 -c "import torchax" 2>/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site
    fi
    for frontend in jax torchax; do
      timeout 280 python3 -m xla_kernels.cli serve-bench --preset moe --platform gpu \
        --frontend "$frontend" --no-progress --json "$out/serve_moe_$frontend.json" 2>&1 \
        | tail -30 | tee "$out/serve_moe_$frontend.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done ;;
  *) echo "moe_gpu.sh: unknown mode '$mode' (tests, sanitize, bench or serve)" >&2; exit 2 ;;
esac
exit $status
