#!/usr/bin/env bash
# One full benchmark per call (the speed check of a change is gate.sh; these are the tables
# of benchmarks/results/<card>/ and the comparisons with the peers).
#
#   bash scripts/gpu/bench.sh OUT_DIR NAME [--quick]
#   bash scripts/gpu/bench.sh OUT_DIR moe [moe.py options, e.g. --peers ours ragged_dot tokamax]
#
# NAME (each fits one 10-minute call on one H100; --quick where the script has it):
#   simple_add       simple_add vs XLA's add over sizes and dtypes
#   eager_dispatch   the eager (torch) call's host cost
#   ragged           ragged_paged_attention vs plain XLA, FlashAttention-3 and cuDNN
#   ragged_dense     fresh causal prefills (5 shapes, 8 chained calls per program): ours vs
#                    FA3, cuDNN paged and cuDNN dense (jax.nn.dot_product_attention)
#   paged            paged_attention vs XLA, Pallas, FA3 and cuDNN ("peers" matrix)
#   fused_kv         the fused K/V cache vs separate caches
#   decode_trace     CUPTI kernel timestamps: ours, cuDNN and ours on fp8 caches
#   command_buffers  the kernels inside XLA's CUDA graphs
#   flashinfer       paged decode vs FlashInfer (its wheels in .whl-fi/)
#   sampling         sample vs FlashInfer's sampling (its wheels in .whl-fi/; sampling.py
#                    options after the name, e.g. --skip-fi fi_logits_k_int)
#   moe              fused_moe vs the ragged_dot MoE and the plain-XLA expert loop
#                    (Mixtral-8x7B and Qwen3-30B-A3B layers, bf16 and fp8); opt-in peers
#                    tokamax (its wheels in .whl/) and flashinfer (.whl-fi/, a long JIT build)
#   fp8_linear       fp8_linear vs XLA's fp8 dot, dequantize + bf16 dot and torch._scaled_mm
#                    (Llama-3-8B's linears, 1-256 tokens; fraction of the weight-read roofline)
#   step_profile     serve-bench's decode step kernel by kernel (CUPTI): categories, each
#                    GEMM's bandwidth, launch gaps, XLA's fusions (1b and 8b at 64 x 2000,
#                    8b at 256 x 512)
# Writes the benchmark's files and OUT_DIR/NAME.txt.
source "$(dirname "$0")/common.sh" "${1:-}"
name=${2:?usage: bench.sh OUT_DIR simple_add|eager_dispatch|ragged|ragged_dense|paged|fused_kv|decode_trace|command_buffers|flashinfer|sampling|moe|fp8_linear|step_profile [--quick]}
quick=${3:-}
case $name in
  simple_add) cmd=(benchmarks/simple_add.py --out "$out") ;;
  eager_dispatch) cmd=(benchmarks/eager_dispatch.py --out "$out") ;;
  ragged) cmd=(benchmarks/ragged_paged_attention.py --out "$out" $quick) ;;
  ragged_dense) cmd=(benchmarks/ragged_paged_attention.py --out "$out" --matrix dense $quick) ;;
  paged) cmd=(benchmarks/paged_attention.py --out "$out" --matrix peers $quick) ;;
  fused_kv) cmd=(benchmarks/fused_kv.py --out "$out") ;;
  decode_trace) cmd=(benchmarks/decode_trace.py --out "$out" --configs 128x8192 32x2048 8x32768
                     32x4096 16x2048/32 4x8192/32 32x2048/8/64 32x2048/8/256) ;;
  command_buffers) cmd=(benchmarks/command_buffers.py --out "$out") ;;
  flashinfer) cmd=(benchmarks/flashinfer_decode.py --out "$out" $quick) ;;
  sampling) cmd=(benchmarks/sampling.py --out "$out" "${@:3}") ;;
  moe) cmd=(benchmarks/moe.py --out "$out" "${@:3}") ;;
  fp8_linear) cmd=(benchmarks/fp8_linear.py --out "$out") ;;
  step_profile)  # three runs, one process each (each model alone on the card)
    for run in "1b 64 2000" "8b 64 2000" "8b 256 512"; do
      read -r preset batch context <<< "$run"
      python3 benchmarks/step_profile.py --out "$out" --preset "$preset" --batch "$batch" \
        --context "$context" 2>&1 | tee -a "$out/$name.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
    exit "$status" ;;
  *) echo "bench.sh: unknown benchmark '$name'" >&2; exit 2 ;;
esac
python3 "${cmd[@]}" 2>&1 | tee "$out/$name.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
