#!/usr/bin/env bash
# Nsight Compute profiles (ncu --set full) of our kernels and their peers, with their raw and
# source pages and a summary table (benchmarks/ncu_summary.py).
#
#   bash scripts/gpu/profile.sh OUT_DIR decode [CONFIG...]   # ours bf16, cuDNN, ours fp8
#                                                            # (default 128x8192 32x8192/32 32x2048)
#   bash scripts/gpu/profile.sh OUT_DIR ragged [CONFIG]      # ours vs FA3
#                                                            # (default "chunked 8x512 of 8192")
#   bash scripts/gpu/profile.sh OUT_DIR prefill [CONFIG...]  # ours vs cuDNN dense, fresh causal
#                                                            # prefills (default: the 3 shapes
#                                                            # where cuDNN leads most)
#   bash scripts/gpu/profile.sh OUT_DIR fp8_linear           # W8A16, W8A8, XLA fp8 dot, dequant
#                                                            # + bf16 dot at 1 and 64 tokens
#   bash scripts/gpu/profile.sh OUT_DIR moe [--moe-tokens N...] [--moe-peers ours]
#                                                            # fused_moe vs the ragged_dot MoE
#   bash scripts/gpu/profile.sh OUT_DIR sampling             # sample: batch 16/64/256, top-k/p, plain
# Writes OUT_DIR/ncu_NAME.ncu-rep, _raw.csv.gz, _source.csv.gz and .md. NCU_SOURCE=0 skips the
# source page (its export took minutes for the sampling and MoE reports).
source "$(dirname "$0")/common.sh" "${1:-}"
name=${2:?usage: profile.sh OUT_DIR decode|ragged|prefill|fp8_linear|moe|sampling [CONFIG...]}
shift 2
case $name in
  decode) configs=("$@")
          [ ${#configs[@]} -gt 0 ] || configs=(128x8192 32x8192/32 32x2048)
          cmd=(benchmarks/decode_trace.py --ncu --out "$out/ncu_trace" --configs "${configs[@]}") ;;
  ragged) cmd=(benchmarks/profile_ragged.py --variants ours,fa3
               --configs "${1:-chunked 8x512 of 8192}") ;;
  prefill) configs=("$@")
           [ ${#configs[@]} -gt 0 ] \
             || configs=("prefill 4x4096 d64" "prefill 8x2048 MHA" "prefill 4x4096")
           cmd=(benchmarks/profile_ragged.py --variants ours,cudnn_dense --configs "${configs[@]}") ;;
  fp8_linear|moe|sampling) cmd=(benchmarks/profile_ops.py --cases "$name" "$@") ;;
  *) echo "profile.sh: unknown profile '$name'" >&2; exit 2 ;;
esac
# XLA's GEMM autotuning crashed (SIGSEGV) while compiling under ncu: the XLA-program profiles
# run once without it first, into JAX's persistent compilation cache, which the profiled run
# then loads instead of compiling.
if [ "$name" != decode ]; then
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax-cache-profile}
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
  python3 "${cmd[@]}" > "$out/ncu_${name}_compile.log" 2>&1 || { tail -5 "$out/ncu_${name}_compile.log"; exit 1; }
fi
if ! ncu --profile-from-start off --set full --import-source yes --clock-control none \
    -f -o "$out/ncu_$name" python3 "${cmd[@]}" > "$out/ncu_$name.log" 2>&1; then
  tail -5 "$out/ncu_$name.log"
  exit 1
fi
ncu --import "$out/ncu_$name.ncu-rep" --page raw --csv | gzip > "$out/ncu_${name}_raw.csv.gz"
if [ "${NCU_SOURCE:-1}" != 0 ]; then
  ncu --import "$out/ncu_$name.ncu-rep" --page source --csv 2>/dev/null \
    | gzip > "$out/ncu_${name}_source.csv.gz"
fi
python3 benchmarks/ncu_summary.py "$out/ncu_${name}_raw.csv.gz" --out "$out/ncu_$name.md" \
  || status=1
exit "$status"
