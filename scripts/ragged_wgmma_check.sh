#!/usr/bin/env bash
# One call on an H100 (repo root, python3 with jax + CUDA): checks the sm_90a wgmma prefill
# kernel of ragged_paged_attention and times it against the mma.sync kernel. Finishes in
# under 5 minutes (every step has a timeout cut to the time left); outputs go to OUT_DIR.
#
#   bash scripts/ragged_wgmma_check.sh OUT_DIR
#
# Steps, most important first:
#   1. wgmma_unit.txt: tests/gpu/wgmma_unit_check.cu (nvcc -arch=sm_90a): one S = Q K^T and
#      one O = P V wgmma tile (descriptors, 128-byte swizzle, register-A and transposed-V
#      operands) against the host, bf16 and f16, isolated from the attention kernel.
#   2. tests_wgmma.txt: the wgmma tests of tests/gpu/test_ragged_paged_attention_gpu.py with
#      XLA_KERNELS_RAGGED_WGMMA=require (a bf16/f16 call fails if the wgmma kernel
#      cannot run, so a pass means it ran); builds the library (sm_90a) first.
#   3. bench.txt: benchmarks/ragged_paged_attention.py --quick, prefill and chunked rows:
#      "ours" (wgmma) and "ours_mma" (mma.sync) TFLOP/s, and FA3 / cuDNN when importable.
#   4. tests_mma.txt: a few of those tests with XLA_KERNELS_RAGGED_WGMMA=0 (the old kernel).
#   5. tests_rest.txt: the rest of the file with XLA_KERNELS_RAGGED_WGMMA=require.
# summary.txt has one line per step with its exit status (124: ran out of time).
set -uo pipefail
out=${1:?usage: ragged_wgmma_check.sh OUT_DIR}
mkdir -p "$out"
end=$(( $(date +%s) + 285 ))
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_KERNELS_CACHE_DIR=/tmp/xla-kernels-cache
summary="$out/summary.txt"
: > "$summary"

# Runs "$@" with a timeout of min(cap, time left - 5) seconds; logs to $out/name.txt.
step() {
  local name=$1 cap=$2; shift 2
  local left=$(( end - $(date +%s) - 5 ))
  local t=$(( cap < left ? cap : left ))
  if [ "$t" -le 5 ]; then echo "$name: skipped (no time left)" | tee -a "$summary"; return; fi
  echo "=== $name (timeout ${t}s)"
  local t0=$(date +%s)
  timeout "$t" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  tail -15 "$out/$name.txt"
  echo "$name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$summary"
}

# Carried wheels (flash-attn3-jax for the FA3 peer), as scripts/gpu_run.sh installs them.
wheels=$(ls .whl/*.whl 2>/dev/null | awk -F/ '!seen[$NF]++')
if [ -n "$wheels" ] && ! python3 -c "import flash_attn3_jax" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm --format=csv
  nvcc --version | tail -2
  git log --oneline -1 2>/dev/null
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

step wgmma_unit 60 bash -c "nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I src/xla_kernels/include \
  tests/gpu/wgmma_unit_check.cu -o /tmp/wgmma_unit_check && /tmp/wgmma_unit_check"

T=tests/gpu/test_ragged_paged_attention_gpu.py
PYT="python3 -m pytest -q -m gpu -p no:cacheprovider -x --durations=5"
step tests_wgmma 150 env XLA_KERNELS_RAGGED_WGMMA=require $PYT $T -k wgmma
step bench 70 python3 benchmarks/ragged_paged_attention.py --quick --budget 0.5 \
  --configs "prefill,chunked" --out "$out"
step tests_mma 40 env XLA_KERNELS_RAGGED_WGMMA=0 $PYT $T -k "wgmma_long_prefills and bf16"
step tests_rest 150 env XLA_KERNELS_RAGGED_WGMMA=require $PYT $T -k "not wgmma"
cat "$summary"
