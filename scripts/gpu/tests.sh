#!/usr/bin/env bash
# GPU tests, one part per call (parts sized for one 10-minute call on one H100: the ragged
# attention file whole outlasts one, so it is two parts; with several visible GPUs the tests
# are dealt over them, one pytest process per card: scripts/gpu_test_shards.py).
#
#   bash scripts/gpu/tests.sh OUT_DIR PART [pytest options...]
#
# PART:
#   core          every @pytest.mark.gpu test but the ragged attention, MoE and fp8_linear files
#                 (kernels, torch eager / native / in-place autograd, stages, fused K/V, rms_norm)
#   moe           tests/gpu/test_moe_gpu.py (fused_moe's CUDA kernels vs the float64 oracle)
#   fp8-linear    tests/gpu/test_fp8_linear_gpu.py (fp8_linear's CUDA kernel vs the float64
#                 oracle, the XLA fp8 peer, torch eager on poisoned memory, sanitizer cases)
#   ragged-wgmma  tests/gpu/test_ragged_paged_attention_gpu.py -k "wgmma or fp8", with
#                 XLA_KERNELS_RAGGED_WGMMA=require (a call the Hopper kernel should serve
#                 fails if it cannot: a pass means it ran)
#   ragged-rest   the rest of that file, also with XLA_KERNELS_RAGGED_WGMMA=require
#   torch-python  tests/gpu/test_torch_gpu.py through the Python eager kernels
#                 (XLA_KERNELS_TORCH_NATIVE=0, the native path's fallback)
#   wgmma-unit    tests/gpu/wgmma_unit_check.cu (nvcc, sm_90a): one S = Q K^T and one
#                 O = P V wgmma tile against the host, isolated from the attention kernel
#   demo          python -m xla_kernels.demo
# GPU_SHARDS=N deals the tests over N pytest processes instead of one per visible GPU.
# Writes OUT_DIR/gpu_tests_PART.txt (and the shards' logs), OUT_DIR/env.txt.
source "$(dirname "$0")/common.sh" "${1:-}"
part=${2:?usage: tests.sh OUT_DIR core|moe|fp8-linear|ragged-wgmma|ragged-rest|torch-python|wgmma-unit|demo [...]}
shift 2
ragged=tests/gpu/test_ragged_paged_attention_gpu.py
moe=tests/gpu/test_moe_gpu.py
fp8_linear=tests/gpu/test_fp8_linear_gpu.py
shards() {  # pytest arguments...: the selection dealt over the visible GPUs
  python3 scripts/gpu_test_shards.py --out "$out" --shards "${GPU_SHARDS:-0}" -- -q -m gpu \
    -p no:cacheprovider --durations=15 "$@" 2>&1 | tee "$out/gpu_tests_$part.txt"
  return "${PIPESTATUS[0]}"
}
case $part in
  core) shards tests/ --ignore="$ragged" --ignore="$moe" --ignore="$fp8_linear" "$@" \
          || status=1 ;;
  moe) shards "$moe" "$@" || status=1 ;;
  fp8-linear) shards "$fp8_linear" "$@" || status=1 ;;
  ragged-wgmma) XLA_KERNELS_RAGGED_WGMMA=require shards "$ragged" -k "wgmma or fp8" "$@" \
                  || status=1 ;;
  ragged-rest) XLA_KERNELS_RAGGED_WGMMA=require shards "$ragged" -k "not (wgmma or fp8)" "$@" \
                 || status=1 ;;
  torch-python) XLA_KERNELS_TORCH_NATIVE=0 python3 -m pytest -q -m gpu -p no:cacheprovider \
                  tests/gpu/test_torch_gpu.py "$@" 2>&1 | tee "$out/gpu_tests_$part.txt"
                [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
  wgmma-unit) { nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a \
                  -I src/xla_kernels/include tests/gpu/wgmma_unit_check.cu -o /tmp/wgmma_unit_check \
                  && /tmp/wgmma_unit_check; } 2>&1 | tee "$out/gpu_tests_$part.txt"
              [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
  demo) python3 -m xla_kernels.demo --json "$out/demo.json" 2>&1 | tee "$out/demo.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
  *) echo "tests.sh: unknown part '$part'" >&2; exit 2 ;;
esac
exit "$status"
