#!/usr/bin/env bash
# One call on the GPU machine: install what is missing, build, run the GPU tests and the
# benchmarks, and write every result under OUT_DIR.
#
#   bash scripts/gpu_run.sh OUT_DIR [all|tests|bench|serve|tp|profile] [--quick]
#
# "tests": environment, demo, GPU tests, compute-sanitizer; "bench": environment and the
# kernel benchmarks; "serve": the serving loop (serve-bench: the 1b preset timed with JAX,
# JAX with --async-scheduling, plain-XLA attention, torchax and torchax async, once more
# with the f32 token-for-token check, then tiny on the GPU for both frontends, checked
# token for token, synchronous and async); "tp" (a machine with 2 GPUs): paged attention
# split along kv heads over 2 GPUs vs 1 (benchmarks/tp_attention.py: paged decode and
# ragged batches), the 1b serving loop at --tp 1 and --tp 2 on the same machine, JAX and
# torchax, then benchmarks/tp_serving.py over those runs (tp_serving.md: tokens/s and
# decode tokens/s tp2 vs tp1, greedy tokens tp2 vs tp1 and torchax vs jax; if the call is
# cut before it, run it later over the JSONs); "profile": Nsight Compute profiles and
# compile-time A/Bs of the kernels (PROFILE_STEPS below); "all" (default): everything but
# "tp" and "profile" (more than one 10-minute device call: split it).
# Environment variables narrow a mode down to fit one call: GPU_TESTS (pytest paths,
# default tests/), GPU_TESTS_K (a pytest -k expression: the ragged attention GPU file alone
# outlasts one call on one GPU, e.g. GPU_TESTS_K="wgmma or fp8"; the tests are dealt over
# every visible GPU, one pytest process each, unless GPU_SHARDS says how many),
# SERVE_STEPS (names of the serve runs below, in order), BENCH_STEPS (names of the benchmarks below, in order: BENCH_STEPS=paged
# runs only the paged-attention peers matrix; BENCH_STEPS=sampling, named only, runs
# benchmarks/sampling.py: sample vs FlashInfer's sampling), TP_STEPS (names of the tp runs below, in
# order; default: attention 1b_tp1_jax 1b_tp2_jax 1b_tp1_torchax 1b_tp2_torchax compare;
# 1b_tp2_jax_checked, the --tp 2 run with the f32 token-for-token check, and
# 1b_tp1_jax_async / 1b_tp2_jax_async (--async-scheduling) only when named, e.g.
# TP_STEPS="1b_tp2_jax_checked"; so is dispatch: benchmarks/dispatch_variants.py, the 1b
# async run at DISPATCH_TP (default "2 1") under each XLA runtime variant of
# DISPATCH_VARIANTS (default: all of the script's VARIANTS, ~35 s each), where the host's
# time per step goes).
# Expects the torchax wheel in .whl/ (copied from
# ../shared/wheels and carried along), for the FlashAttention-3 peer the flash-attn3-jax
# wheel, and for the FlashInfer peer its two wheels in .whl-fi/ (FlashInfer's repacked by
# scripts/repack_flashinfer_wheel.py to fit the device tool's 64 MiB carry).
set -uo pipefail
out=${1:?usage: gpu_run.sh OUT_DIR [all|tests|bench|serve|tp|profile] [--quick]}
mode=${2:-all}
quick=${3:-}
case $mode in
  all|tests|bench|serve|tp|profile) ;;
  *) echo "gpu_run.sh: unknown mode '$mode' (all, tests, bench, serve, tp or profile)" >&2
     exit 2 ;;
esac
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_KERNELS_CACHE_DIR=/tmp/xla-kernels-cache
export XK_RESULTS_DIR=$out
status=0
step() { echo; echo "=== $1"; }
serve() {  # name, seconds, serve-bench options... (serve and tp modes)
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m xla_kernels.cli serve-bench --platform gpu --no-progress \
    --json "$out/serve_$name.json" "$@" 2>&1 | tail -25 | tee "$out/serve_$name.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

step "install what is missing"
# Carried wheels: .whl/ (torchax, flash-attn3-jax), .whl-fi/ (FlashInfer and apache-tvm-ffi,
# the peers of benchmarks/flashinfer_decode.py); each wheel once, by file name.
wheels=$(ls .whl/*.whl .whl-fi/*.whl 2>/dev/null | awk -F/ '!seen[$NF]++')
if [ -n "$wheels" ] && ! python3 -c "import torchax" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site PATH=$PATH:/tmp/site/bin
fi

step "environment"
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  python3 - <<'PY'
import importlib
for name in ("jax", "jaxlib", "torch", "torchax", "triton"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:
        print(name, "missing:", e)
PY
} 2>&1 | tee "$out/env.txt"

if [ "$mode" = tests ] || [ "$mode" = all ]; then
  step "demo"
  python3 -m xla_kernels.demo --json "$out/demo.json" 2>&1 | tee "$out/demo.txt" || status=1

  step "GPU tests"
  # One pytest process per visible GPU, the tests dealt between them (gpu_test_shards.py;
  # GPU_SHARDS=1 runs one process); the combined log is gpu_tests.txt.
  python3 scripts/gpu_test_shards.py --out "$out" --shards "${GPU_SHARDS:-0}" -- -q -m gpu \
    -p no:cacheprovider --durations=15 ${GPU_TESTS:-tests/} \
    ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} || status=1
  step "GPU torch tests through the Python eager kernels (the native kernel's fallback)"
  XLA_KERNELS_TORCH_NATIVE=0 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_torch_gpu.py 2>&1 | tee "$out/gpu_tests_python_path.txt" || status=1

  step "compute-sanitizer (memcheck, racecheck) on the CUDA kernels"
  # With two or more GPUs the two tools run at once, one card each (the cards this call may
  # use: CUDA_VISIBLE_DEVICES if set, else nvidia-smi's, as the test shards take them).
  read -r -a gpus <<< "$(python3 scripts/gpu_test_shards.py --list-gpus)"
  sanitize() {  # tool, GPU index
    CUDA_VISIBLE_DEVICES=$2 compute-sanitizer --tool "$1" --error-exitcode 9 \
      python3 scripts/sanitize_kernels.py > "$out/sanitizer_$1.txt" 2>&1
  }
  if [ "${#gpus[@]}" -ge 2 ]; then
    sanitize memcheck "${gpus[0]}" & mem=$!
    sanitize racecheck "${gpus[1]}" & race=$!
    wait $mem; codes="memcheck:$?"
    wait $race; codes="$codes racecheck:$?"
  else
    sanitize memcheck "${gpus[0]:-0}"; codes="memcheck:$?"
    sanitize racecheck "${gpus[0]:-0}"; codes="$codes racecheck:$?"
  fi
  for entry in $codes; do
    tool=${entry%%:*} code=${entry##*:}
    [ "$code" -eq 0 ] || status=1
    echo "$tool exit $code: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$out/sanitizer_$tool.txt" | tail -1)"
  done
fi

if [ "$mode" = bench ] || [ "$mode" = all ]; then
  step "benchmarks"
  # BENCH_STEPS picks and orders the benchmarks (default: all). paged: ours vs plain XLA,
  # Pallas, FlashAttention-3 and cuDNN over the "peers" matrix (--quick: six configs);
  # decode_trace: kernel timestamps (CUPTI) of ours, cuDNN and ours on fp8 caches.
  for name in ${BENCH_STEPS:-simple_add eager_dispatch ragged paged decode_trace command_buffers \
                flashinfer}; do
    case $name in
      simple_add) python3 benchmarks/simple_add.py --out "$out" 2>&1 | tail -20 || status=1 ;;
      eager_dispatch) python3 benchmarks/eager_dispatch.py --out "$out" 2>&1 \
                        | tee "$out/eager_dispatch.txt" || status=1 ;;
      ragged) python3 benchmarks/ragged_paged_attention.py --out "$out" 2>&1 \
                | tee "$out/ragged_paged_attention.txt" || status=1 ;;
      paged) python3 benchmarks/paged_attention.py --out "$out" --matrix peers $quick 2>&1 \
               | tee "$out/paged_attention.txt" || status=1 ;;
      decode_trace) python3 benchmarks/decode_trace.py --out "$out" --configs 128x8192 32x2048 \
                      8x32768 32x4096 16x2048/32 4x8192/32 32x2048/8/64 32x2048/8/256 2>&1 \
                      | grep -v -i warn | tee "$out/decode_trace.txt" || status=1 ;;
      command_buffers) python3 benchmarks/command_buffers.py --out "$out" 2>&1 \
                         | tee "$out/command_buffers.txt" || status=1 ;;
      flashinfer) python3 benchmarks/flashinfer_decode.py --out "$out" $quick 2>&1 \
                    | tee "$out/flashinfer_decode.txt" || status=1 ;;
      sampling) python3 benchmarks/sampling.py --out "$out" 2>&1 \
                  | tee "$out/sampling.txt" || status=1 ;;
      moe) python3 benchmarks/moe.py --out "$out" 2>&1 | tee "$out/moe.txt" || status=1 ;;
      *) echo "unknown bench step $name"; status=1 ;;
    esac
  done
fi

if [ "$mode" = serve ] || [ "$mode" = all ]; then
  step "serving loop"
  # SERVE_STEPS picks and orders the runs (default: all, the 1b targets first).
  for name in ${SERVE_STEPS:-1b_jax 1b_jax_async 1b_jax_plain_xla 1b_torchax 1b_torchax_async \
                1b_jax_checked tiny_jax tiny_torchax tiny_jax_async tiny_torchax_async}; do
    case $name in
      1b_jax) serve 1b_jax 240 --preset 1b --frontend jax --no-reference \
                --plot "$out/serve_1b_jax.svg" ;;
      1b_jax_async) serve 1b_jax_async 240 --preset 1b --frontend jax --no-reference \
                      --async-scheduling ;;
      1b_torchax_async) serve 1b_torchax_async 240 --preset 1b --frontend torchax \
                          --no-reference --async-scheduling ;;
      1b_jax_plain_xla) serve 1b_jax_plain_xla 240 --preset 1b --frontend jax \
                          --attention plain-xla --no-reference ;;
      1b_torchax) serve 1b_torchax 240 --preset 1b --frontend torchax --no-reference ;;
      1b_jax_checked) serve 1b_jax_checked 400 --preset 1b --frontend jax --no-breakdown ;;
      tiny_jax) serve tiny_jax 120 --preset tiny --frontend jax ;;
      tiny_torchax) serve tiny_torchax 120 --preset tiny --frontend torchax ;;
      tiny_jax_async) serve tiny_jax_async 120 --preset tiny --frontend jax --async-scheduling ;;
      tiny_torchax_async) serve tiny_torchax_async 120 --preset tiny --frontend torchax \
                            --async-scheduling ;;
      *) echo "unknown serve step $name"; status=1 ;;
    esac
  done
fi

if [ "$mode" = profile ]; then
  step "profiles (Nsight Compute) and compile-time A/Bs"
  # PROFILE_STEPS picks and orders them (default: the first three). fp8_stages: the fp8 decode
  # kernel's pipeline at 2 stages (default) vs 3 (-DXK_DECODE_FP8_STAGES=3, the depth before
  # 2026-11-26), benchmarks/decode_ab.py, CUPTI end to end, alternating processes;
  # fp8_ncu: ncu --set full of one launch each of ours bf16, cuDNN and ours fp8
  # (decode_trace.py --ncu) at PROFILE_DECODE_CONFIGS (default 32x4096), once per stage
  # count; decode_ncu (only when named): the same three launches on the default build at
  # PROFILE_DECODE_CONFIGS (default 128x8192 32x8192/32 32x2048: where cuDNN was ahead,
  # and the fp8 / bf16 ratio's weakest point); ragged_ncu: ours (wgmma) vs FA3 at
  # PROFILE_RAGGED_CONFIG (default chunked 8x512 of 8192); bt_ahead (only when named): the
  # decode kernels' block ids 2 tiles ahead (default) vs 1 (-DXK_DECODE_BT_AHEAD=1, the loop
  # before 2026-11-26), bf16 and fp8, d 64, 128 and 256 (non-fp8 caches at d 64 keep 1 in
  # both builds since 341d59c), decode_ab.py
  # as above; fp8_d256 (only when named): fp8 warp tiles of 16
  # tokens at head_dim 256 (default) vs 32 (-DXK_DECODE_FP8_D256_TOKENS=32), the same way;
  # l2_reuse (only when named): decode_trace.py with a new page order per call (default) and
  # with --same-order, alternating, twice, where the K+V is a few times the L2 (does the
  # fp8 / bf16 ratio depend on what one call leaves in L2 for the next? paged
  # PERFORMANCE.md, "fp8 at many waves, and tokens on the MMA rows"); l2_reuse.txt.
  # ragged_ab (only when named): compile-time A/B of the ragged wgmma kernel. RAGGED_AB_BUILDS
  # names the builds and their nvcc flags, "name:flags;name:flags" (default "A:;B:" plus
  # RAGGED_B_FLAGS); all are built first, in parallel, then benchmarks/ragged_env_ab.py runs
  # in processes alternating between them, twice (A B A B), over RAGGED_AB_CONFIGS with
  # RAGGED_AB_VARIANTS (environment variants, default one), FA3 alongside as the control
  # (ragged_ab.txt); then, if RAGGED_AB_TESTS is a pytest -k expression, those ragged GPU
  # tests on the last build under XLA_KERNELS_RAGGED_WGMMA=require (ragged_ab_tests.txt;
  # RAGGED_AB_TESTS_TIMEOUT seconds, default 240: the whole file takes ~8.5 minutes).
  # 2026-11-26's ping-pong runs: RAGGED_AB_BUILDS="A:;B:-DXK_RAGGED_PINGPONG=1;C:
  # -DXK_RAGGED_PINGPONG=1 -DXK_RAGGED_CONSUMER_REGS=240" (then: A without ping-pong)
  # RAGGED_AB_VARIANTS="t64:XLA_KERNELS_RAGGED_WGMMA_TILE=64;t128:XLA_KERNELS_RAGGED_WGMMA_TILE=128".
  # Each profile leaves ncu_<name>.ncu-rep, its raw page (_raw.csv.gz), its
  # source page (_source.csv.gz) and a summary table (benchmarks/ncu_summary.py, .md).
  ncu_run() {  # name, command...: every kernel between cudaProfilerStart and Stop
    local name=$1
    shift
    if ! ncu --profile-from-start off --set full --import-source yes --clock-control none \
        -f -o "$out/ncu_$name" "$@" > "$out/ncu_$name.log" 2>&1; then
      status=1
      tail -5 "$out/ncu_$name.log"
      return
    fi
    ncu --import "$out/ncu_$name.ncu-rep" --page raw --csv | gzip > "$out/ncu_${name}_raw.csv.gz"
    ncu --import "$out/ncu_$name.ncu-rep" --page source --csv 2>/dev/null \
      | gzip > "$out/ncu_${name}_source.csv.gz"
    python3 benchmarks/ncu_summary.py "$out/ncu_${name}_raw.csv.gz" --out "$out/ncu_$name.md" \
      || status=1
  }
  for name in ${PROFILE_STEPS:-fp8_stages fp8_ncu ragged_ncu}; do
    case $name in
      fp8_stages) python3 benchmarks/decode_ab.py --out "$out/fp8_stages" \
                    --b-flags=-DXK_DECODE_FP8_STAGES=3 --rounds 2 \
                    --configs 32x2048 32x4096 128x8192 8x32768 32x2048/8/256 \
                    32x2048/8/64 2>&1 \
                    | tee "$out/fp8_stages.txt" || status=1 ;;
      bt_ahead) python3 benchmarks/decode_ab.py --out "$out/bt_ahead" \
                  --b-flags=-DXK_DECODE_BT_AHEAD=1 --rounds 2 \
                  --configs 32x2048 32x4096 128x8192 8x32768 1x32768 32x2048/8/64 \
                  32x2048/8/256 2>&1 | tee "$out/bt_ahead.txt" || status=1 ;;
      fp8_d256) python3 benchmarks/decode_ab.py --out "$out/fp8_d256" \
                  --b-flags=-DXK_DECODE_FP8_D256_TOKENS=32 --rounds 2 \
                  --configs 32x2048/8/256 128x2048/8/256 8x8192/8/256 1x32768/8/256 \
                  32x4096/8/256 2>&1 | tee "$out/fp8_d256.txt" || status=1 ;;
      ragged_ab)
        IFS=';' read -r -a ab_builds <<< "${RAGGED_AB_BUILDS:-A:;B:${RAGGED_B_FLAGS:-}}"
        for build in "${ab_builds[@]}"; do
          NVCC_APPEND_FLAGS="${build#*:}" python3 -c "from xla_kernels.runtime.library import \
load_kernel; from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention \
as op; load_kernel(op, 'cuda')" &
        done
        wait
        for round in 1 2; do
          for build in "${ab_builds[@]}"; do
            echo "round $round build ${build%%:*} (${build#*:})"
            NVCC_APPEND_FLAGS="${build#*:}" timeout 200 python3 benchmarks/ragged_env_ab.py \
              --budget 0.3 --variants "${RAGGED_AB_VARIANTS:-ours:}" \
              --configs "${RAGGED_AB_CONFIGS:-prefill 4x4096,chunked 8x512 of 8192,prefill 1x16384,prefill 4x4096 MQA,prefill 4x4096 d64,prefill 4x4096 d256,mixed 64 decode + 4x512,prefill 4x4096 fp8}" \
              || status=1
          done
        done 2>&1 | tee "$out/ragged_ab.txt"
        if [ -n "${RAGGED_AB_TESTS:-}" ]; then
          NVCC_APPEND_FLAGS="${ab_builds[-1]#*:}" XLA_KERNELS_RAGGED_WGMMA=require \
            timeout "${RAGGED_AB_TESTS_TIMEOUT:-240}" \
            python3 -m pytest -q -m gpu tests/gpu/test_ragged_paged_attention_gpu.py \
            -k "$RAGGED_AB_TESTS" 2>&1 | tail -15 | tee "$out/ragged_ab_tests.txt"
        fi ;;
      l2_reuse) for round in 1 2; do
                  for order in new same; do
                    flag=""
                    [ "$order" = same ] && flag=--same-order
                    python3 benchmarks/decode_trace.py --out "$out/l2_reuse" \
                      --tag "${order}_order$round" $flag --configs 32x2048 1x32768 \
                      32x2048/8/64 1x32768/8/256 128x2048 2>&1 | grep "cuDNN / ours" \
                      | sed "s/^/$order order, round $round: /" | tee -a "$out/l2_reuse.txt" \
                      || status=1
                  done
                done ;;
      fp8_ncu) for stages in 2 3; do
                 NVCC_APPEND_FLAGS="-DXK_DECODE_FP8_STAGES=$stages" ncu_run \
                   "decode_fp8_stages$stages" python3 benchmarks/decode_trace.py --ncu \
                   --out "$out/ncu_trace" --configs ${PROFILE_DECODE_CONFIGS:-32x4096}
               done ;;
      decode_ncu) ncu_run decode python3 benchmarks/decode_trace.py --ncu \
                    --out "$out/ncu_trace" \
                    --configs ${PROFILE_DECODE_CONFIGS:-128x8192 32x8192/32 32x2048} ;;
      ragged_ncu) ncu_run ragged python3 benchmarks/profile_ragged.py --variants ours,fa3 \
                    --configs "${PROFILE_RAGGED_CONFIG:-chunked 8x512 of 8192}" ;;
      *) echo "unknown profile step $name"; status=1 ;;
    esac
  done
fi

if [ "$mode" = tp ]; then
  step "tensor parallelism over 2 GPUs"
  # TP_STEPS picks and orders the runs (default: all but the checked one). The 1b runs skip
  # the reference check (slow) and are named serve_1b_tp<N>_<frontend> for tp_serving.py.
  for name in ${TP_STEPS:-attention 1b_tp1_jax 1b_tp2_jax 1b_tp1_torchax 1b_tp2_torchax compare}; do
    case $name in
      attention) python3 benchmarks/tp_attention.py --n 2 --out "$out" 2>&1 \
                   | tee "$out/tp_attention.txt" || status=1 ;;
      1b_tp1_jax) serve 1b_tp1_jax 240 --preset 1b --tp 1 --frontend jax --no-reference ;;
      1b_tp2_jax) serve 1b_tp2_jax 240 --preset 1b --tp 2 --frontend jax --no-reference ;;
      1b_tp1_torchax) serve 1b_tp1_torchax 240 --preset 1b --tp 1 --frontend torchax \
                        --no-reference ;;
      1b_tp2_torchax) serve 1b_tp2_torchax 240 --preset 1b --tp 2 --frontend torchax \
                        --no-reference ;;
      1b_tp2_jax_checked) serve 1b_tp2_jax_checked 400 --preset 1b --tp 2 --frontend jax \
                            --no-breakdown ;;
      1b_tp1_jax_async) serve 1b_tp1_jax_async 240 --preset 1b --tp 1 --frontend jax \
                          --no-reference --async-scheduling ;;
      1b_tp2_jax_async) serve 1b_tp2_jax_async 240 --preset 1b --tp 2 --frontend jax \
                          --no-reference --async-scheduling ;;
      compare) python3 benchmarks/tp_serving.py --out "$out" 2>&1 \
                 | tee "$out/tp_serving.txt" || status=1 ;;
      dispatch) python3 benchmarks/dispatch_variants.py --run --out "$out" \
                  --tp ${DISPATCH_TP:-2 1} \
                  ${DISPATCH_VARIANTS:+--variants $DISPATCH_VARIANTS} \
                  2>&1 | tee "$out/dispatch_variants.txt" || status=1 ;;
      *) echo "unknown tp step $name"; status=1 ;;
    esac
  done
fi

exit $status
