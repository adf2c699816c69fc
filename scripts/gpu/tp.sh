#!/usr/bin/env bash
# Tensor parallelism over 2 GPUs of one host: the named runs, in order (a 1b run takes up to
# 4 minutes: name at most two per call, then `compare` over the folder's JSONs).
#
#   bash scripts/gpu/tp.sh OUT_DIR RUN...
#
# RUN:
#   attention            benchmarks/tp_attention.py: paged decode and ragged batches split
#                        along kv heads over 2 GPUs vs 1
#   1b_tp1_jax 1b_tp2_jax 1b_tp1_torchax 1b_tp2_torchax   the 1b serving loop, timed
#   1b_tp1_jax_async 1b_tp2_jax_async                     the same with --async-scheduling
#   1b_tp2_jax_checked   --tp 2 with the f32 token-for-token check
#   compare              benchmarks/tp_serving.py over the folder: tp2 vs tp1 (tp_serving.md)
#   dispatch             benchmarks/dispatch_variants.py: where the host's time per step goes
#                        under each XLA runtime variant (DISPATCH_TP, default "2 1")
source "$(dirname "$0")/common.sh" "${1:-}"
shift
[ $# -gt 0 ] || { echo "usage: tp.sh OUT_DIR RUN... (see the header)" >&2; exit 2; }
for name in "$@"; do
  echo "=== $name"
  case $name in
    attention) python3 benchmarks/tp_attention.py --n 2 --out "$out" 2>&1 \
                 | tee "$out/tp_attention.txt"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    1b_tp1_jax|1b_tp2_jax|1b_tp1_torchax|1b_tp2_torchax)
      tp=${name:4:1} frontend=${name#1b_tp?_}
      serve_run "$name" 240 --preset 1b --tp "$tp" --frontend "$frontend" --no-reference ;;
    1b_tp1_jax_async|1b_tp2_jax_async)
      serve_run "$name" 240 --preset 1b --tp "${name:4:1}" --frontend jax --no-reference \
        --async-scheduling ;;
    1b_tp2_jax_checked) serve_run "$name" 400 --preset 1b --tp 2 --frontend jax --no-breakdown ;;
    compare) python3 benchmarks/tp_serving.py --out "$out" 2>&1 | tee "$out/tp_serving.txt"
             [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    dispatch) python3 benchmarks/dispatch_variants.py --run --out "$out" --tp ${DISPATCH_TP:-2 1} \
                2>&1 | tee "$out/dispatch_variants.txt"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    *) echo "tp.sh: unknown run '$name'" >&2; status=1 ;;
  esac
done
exit "$status"
