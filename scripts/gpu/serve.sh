#!/usr/bin/env bash
# The serving loop (xla-kernels serve-bench) on one GPU: the named runs, in order. A 1b run
# takes up to 4 minutes, a tiny one up to 2: name at most two 1b runs per call.
#
#   bash scripts/gpu/serve.sh OUT_DIR RUN...
#
# RUN:
#   1b_jax 1b_torchax        the 1b preset, timed (no reference check); 1b_jax also plots
#   1b_jax_async 1b_torchax_async   the same with --async-scheduling
#   1b_jax_plain_xla         1b with plain-XLA attention (the baseline of the kernels)
#   1b_jax_checked           1b with the f32 token-for-token check (up to ~7 minutes alone)
#   tiny_jax tiny_torchax tiny_jax_async tiny_torchax_async
#                            the tiny preset, checked token for token
#   moe_jax moe_torchax      the moe preset (fused_moe in every layer), timed, no check
#   moe_jax_checked          moe with the f32 token-for-token check (name it alone)
#   moe_jax_ragged_dot       moe with --moe ragged-dot: the experts through
#                            fused_moe_ragged_dot (two jax.lax.ragged_dot grouped GEMMs), the
#                            same attention kernels, timed, no check
#   moe_jax_fused_vs_ragged_dot   the moe preset with --moe xla-kernels (fused_moe) then
#                            --moe ragged-dot, one after the other, on 64 requests of ~512-token
#                            prompts (the MoE layers' share of the step is larger than at 2000):
#                            decode tokens/s of the two MoE layers (up to 6 minutes: name it
#                            alone)
#   tiny_moe_jax tiny_moe_torchax   the tiny-moe preset, checked token for token;
#                            tiny_moe_jax_ragged_dot: with --moe ragged-dot
#   8b_jax_async             the 8b preset, bf16 weights, async scheduling, timed (the fp8
#                            runs' baseline: name it in the same call or on the same machine)
#   8b_jax_fp8_async 8b_jax_fp8_dynamic_async
#                            8b with --weights fp8 (W8A16) / fp8-dynamic (W8A8) through the
#                            fp8_linear op; 8b_jax_fp8_plain_xla_async: fp8 through XLA's own
#                            dot (fp8_linear_xla). Up to 3 minutes each (4 for the fp8_linear
#                            runs, whose CUDA-core kernel is slow at prefill): two per call.
#   8b_jax_kvfp8_async       8b, bf16 weights, --kv-cache-dtype fp8 (e4m3 K/V caches), async,
#                            timed (up to 3 minutes); 8b_jax_fp8_kvfp8_async: fp8 weights and
#                            fp8 KV cache (up to 4). With 8b_jax_async and 8b_jax_fp8_async:
#                            the {bf16, fp8 weights} x {bf16, fp8 KV cache} table
#   tiny_jax_fp8 tiny_torchax_fp8 tiny_jax_fp8_dynamic tiny_jax_fp8_plain_xla
#                            the tiny preset with fp8 weights, checked token for token
#   tiny_jax_kvfp8 tiny_torchax_kvfp8
#                            the tiny preset with an fp8 KV cache, checked token for token
#   8b_table_WEIGHTS_KV_SHAPE   one cell of the 8b table: WEIGHTS bf16 or fp8 (W8A16 through
#                            fp8_linear), KV bf16 or fp8, SHAPE 64x2000 (the preset's 64
#                            requests of ~2000-token prompts) or 256x512 (256 of ~512, 256 at
#                            once); async scheduling, timed; e.g. 8b_table_fp8_bf16_256x512
# Writes OUT_DIR/serve_RUN.json and .txt per run.
source "$(dirname "$0")/common.sh" "${1:-}"
shift
[ $# -gt 0 ] || { echo "usage: serve.sh OUT_DIR RUN... (see the header)" >&2; exit 2; }
for name in "$@"; do
  echo "=== $name"
  case $name in
    1b_jax) serve_run 1b_jax 240 --preset 1b --frontend jax --no-reference \
              --plot "$out/serve_1b_jax.svg" ;;
    1b_jax_async) serve_run 1b_jax_async 240 --preset 1b --frontend jax --no-reference \
                    --async-scheduling ;;
    1b_torchax) serve_run 1b_torchax 240 --preset 1b --frontend torchax --no-reference ;;
    1b_torchax_async) serve_run 1b_torchax_async 240 --preset 1b --frontend torchax \
                        --no-reference --async-scheduling ;;
    1b_jax_plain_xla) serve_run 1b_jax_plain_xla 240 --preset 1b --frontend jax \
                        --attention plain-xla --no-reference ;;
    1b_jax_checked) serve_run 1b_jax_checked 400 --preset 1b --frontend jax --no-breakdown ;;
    tiny_jax) serve_run tiny_jax 120 --preset tiny --frontend jax ;;
    tiny_torchax) serve_run tiny_torchax 120 --preset tiny --frontend torchax ;;
    tiny_jax_async) serve_run tiny_jax_async 120 --preset tiny --frontend jax \
                      --async-scheduling ;;
    tiny_torchax_async) serve_run tiny_torchax_async 120 --preset tiny --frontend torchax \
                          --async-scheduling ;;
    moe_jax) serve_run moe_jax 240 --preset moe --frontend jax --no-reference ;;
    moe_torchax) serve_run moe_torchax 240 --preset moe --frontend torchax --no-reference ;;
    moe_jax_checked) serve_run moe_jax_checked 540 --preset moe --frontend jax --no-breakdown ;;
    moe_jax_ragged_dot) serve_run moe_jax_ragged_dot 240 --preset moe --frontend jax \
                          --moe ragged-dot --no-reference ;;
    moe_jax_fused_vs_ragged_dot)
      serve_run moe_jax_fused 180 --preset moe --frontend jax --moe xla-kernels --no-reference \
        --prompt-len 512
      serve_run moe_jax_ragged_dot 180 --preset moe --frontend jax --moe ragged-dot \
        --prompt-len 512 --no-reference ;;
    tiny_moe_jax) serve_run tiny_moe_jax 120 --preset tiny-moe --frontend jax ;;
    tiny_moe_jax_ragged_dot) serve_run tiny_moe_jax_ragged_dot 120 --preset tiny-moe \
                               --frontend jax --moe ragged-dot ;;
    tiny_moe_torchax) serve_run tiny_moe_torchax 120 --preset tiny-moe --frontend torchax ;;
    8b_jax_async) serve_run 8b_jax_async 180 --preset 8b --frontend jax --no-reference \
                    --async-scheduling ;;
    8b_jax_fp8_async) serve_run 8b_jax_fp8_async 240 --preset 8b --frontend jax \
                        --weights fp8 --no-reference --async-scheduling ;;
    8b_jax_fp8_dynamic_async) serve_run 8b_jax_fp8_dynamic_async 240 --preset 8b \
                                --frontend jax --weights fp8-dynamic --no-reference \
                                --async-scheduling ;;
    8b_jax_fp8_plain_xla_async) serve_run 8b_jax_fp8_plain_xla_async 180 --preset 8b \
                                  --frontend jax --weights fp8 --attention plain-xla \
                                  --no-reference --async-scheduling ;;
    tiny_jax_fp8) serve_run tiny_jax_fp8 120 --preset tiny --frontend jax --weights fp8 ;;
    tiny_torchax_fp8) serve_run tiny_torchax_fp8 120 --preset tiny --frontend torchax \
                        --weights fp8 ;;
    tiny_jax_fp8_dynamic) serve_run tiny_jax_fp8_dynamic 120 --preset tiny --frontend jax \
                            --weights fp8-dynamic ;;
    tiny_jax_fp8_plain_xla) serve_run tiny_jax_fp8_plain_xla 120 --preset tiny \
                              --frontend jax --weights fp8 --attention plain-xla ;;
    8b_jax_kvfp8_async) serve_run 8b_jax_kvfp8_async 180 --preset 8b --frontend jax \
                          --kv-cache-dtype fp8 --no-reference --async-scheduling ;;
    8b_jax_fp8_kvfp8_async) serve_run 8b_jax_fp8_kvfp8_async 240 --preset 8b --frontend jax \
                              --weights fp8 --kv-cache-dtype fp8 --no-reference \
                              --async-scheduling ;;
    tiny_jax_kvfp8) serve_run tiny_jax_kvfp8 120 --preset tiny --frontend jax \
                      --kv-cache-dtype fp8 ;;
    tiny_torchax_kvfp8) serve_run tiny_torchax_kvfp8 120 --preset tiny --frontend torchax \
                          --kv-cache-dtype fp8 ;;
    8b_table_*)
      IFS=_ read -r _ _ weights kv shape <<< "$name"
      cell=(--preset 8b --frontend jax --no-reference --async-scheduling
            --weights "$([ "$weights" = fp8 ] && echo fp8 || echo model)"
            --kv-cache-dtype "$([ "$kv" = fp8 ] && echo fp8 || echo auto)")
      case $shape in
        64x2000) ;;
        256x512) cell+=(--requests 256 --prompt-len 512 --max-num-seqs 256) ;;
        *) echo "serve.sh: unknown shape '$shape' in '$name'" >&2; status=1; continue ;;
      esac
      serve_run "$name" 240 "${cell[@]}" ;;
    *) echo "serve.sh: unknown run '$name'" >&2; status=1 ;;
  esac
done
exit "$status"
