#!/usr/bin/env bash
# vLLM's own engine on XLA:GPU through xla-kernels (docs/vllm.md), on the GPU machine. One job
# per call (each fits a 10-minute device call):
#
#   bash scripts/gpu_vllm.sh install WHEEL_DIR  carried wheels -> .site-vllm (the packages the
#                                               GPU image lacks; --no-deps, once per machine)
#   bash scripts/gpu_vllm.sh check OUT          vllm.LLM on a tiny Llama, both model paths,
#                                               greedy tokens vs transformers f32
#   bash scripts/gpu_vllm.sh serve OUT TOKDIR   vllm serve + the openai client, texts vs
#                                               transformers f32 (TOKDIR: SmolLM2's tokenizer)
#   bash scripts/gpu_vllm.sh bench OUT          Llama-3-8B shape, 64 x 2000 + 256 tokens: vLLM
#                                               (benchmarks/vllm_throughput.py) and
#                                               serve-bench --preset 8b on the same workload
set -uo pipefail
job=${1:?usage: gpu_vllm.sh install|check|serve|bench ARG}
arg=${2:?usage: gpu_vllm.sh $job DIR}
export PYTHONPATH=$PWD/src:$PWD/.site-vllm${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# JAX_PLATFORMS stays unset: tpu-inference accepts only "", tpu, cpu or proxy there, and
# JAX then takes the GPU.
unset JAX_PLATFORMS
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export XLA_KERNELS_CACHE_DIR=${XLA_KERNELS_CACHE_DIR:-/tmp/xla-kernels-cache}
export TPU_NAME=none TPU_ACCELERATOR_TYPE=none TPU_WORKER_ID=0
status=0
case $job in
  install)
    python3 -m pip install -q --no-index --no-deps --no-compile --target .site-vllm \
      "$arg"/*.whl || status=1 ;;
  check)
    mkdir -p "$arg"
    for impl in flax_nnx vllm; do
      timeout 300 python3 -m xla_kernels.vllm.check --model tiny --platform gpu \
        --model-impl $impl --json "$arg/vllm_check_tiny_$impl.json" > "$arg/vllm_check_$impl.log" 2>&1
      rc=$?; echo "check tiny $impl: exit $rc"; tail -2 "$arg/vllm_check_$impl.log"
      [ $rc -eq 0 ] || status=1
    done ;;
  serve)
    mkdir -p "$arg"
    timeout 420 python3 benchmarks/vllm_serve.py --tokenizer "${3:?TOKDIR}" --out "$arg" \
      > "$arg/vllm_serve.log" 2>&1 || status=1
    tail -30 "$arg/vllm_serve.log" ;;
  bench)
    mkdir -p "$arg"
    timeout 330 python3 benchmarks/vllm_throughput.py --out "$arg" > "$arg/vllm_throughput.log" \
      2>&1 || status=1
    tail -25 "$arg/vllm_throughput.log"
    timeout 240 python3 -m xla_kernels.cli serve-bench --preset 8b --platform gpu \
      --async-scheduling --no-reference --no-progress --json "$arg/serve_bench_8b.json" \
      > "$arg/serve_bench_8b.log" 2>&1 || status=1
    tail -25 "$arg/serve_bench_8b.log" ;;
  *) echo "gpu_vllm.sh: unknown job '$job' (install, check, serve or bench)" >&2; exit 2 ;;
esac
exit $status
