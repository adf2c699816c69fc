#!/usr/bin/env bash
# compute-sanitizer (memcheck and racecheck) on every CUDA kernel (scripts/sanitize_kernels.py:
# small calls of each op, every path). With two or more GPUs the tools run at once, one card
# each.
#
#   bash scripts/gpu/sanitize.sh OUT_DIR [memcheck|racecheck]    # default: both
#
# Writes OUT_DIR/sanitizer_TOOL.txt and OUT_DIR/sanitizers.txt (one line per tool: its exit
# code and summary); exits 1 if a tool reports an error.
source "$(dirname "$0")/common.sh" "${1:-}"
tools=${2:-memcheck racecheck}
read -r -a gpus <<< "$(python3 scripts/gpu_test_shards.py --list-gpus)"
sanitize() {  # tool, GPU index: one line, "TOOL exit CODE: SUMMARY"
  CUDA_VISIBLE_DEVICES=$2 compute-sanitizer --tool "$1" --error-exitcode 9 \
    python3 scripts/sanitize_kernels.py > "$out/sanitizer_$1.txt" 2>&1
  echo "$1 exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_$1.txt" \
    | tail -1)" > "$out/sanitizer_$1.status"
}
i=0
for tool in $tools; do
  gpu=${gpus[$(( i % (${#gpus[@]} > 0 ? ${#gpus[@]} : 1) ))]:-0}
  if [ "${#gpus[@]}" -ge 2 ]; then sanitize "$tool" "$gpu" & else sanitize "$tool" "$gpu"; fi
  i=$(( i + 1 ))
done
wait
for tool in $tools; do cat "$out/sanitizer_$tool.status"; done | tee "$out/sanitizers.txt"
rm -f "$out"/sanitizer_*.status
grep -qv " exit 0:" "$out/sanitizers.txt" && status=1
exit "$status"
