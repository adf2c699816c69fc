#!/usr/bin/env bash
# Nsight Compute profiles (ncu --set full) of the attention kernels, with their raw and
# source pages and a summary table (benchmarks/ncu_summary.py).
#
#   bash scripts/gpu/profile.sh OUT_DIR decode [CONFIG...]   # ours bf16, cuDNN, ours fp8
#                                                            # (default 128x8192 32x8192/32 32x2048)
#   bash scripts/gpu/profile.sh OUT_DIR ragged [CONFIG]      # ours vs FA3
#                                                            # (default "chunked 8x512 of 8192")
# Writes OUT_DIR/ncu_NAME.ncu-rep, _raw.csv.gz, _source.csv.gz and .md.
source "$(dirname "$0")/common.sh" "${1:-}"
name=${2:?usage: profile.sh OUT_DIR decode|ragged [CONFIG...]}
shift 2
case $name in
  decode) configs=("$@")
          [ ${#configs[@]} -gt 0 ] || configs=(128x8192 32x8192/32 32x2048)
          cmd=(benchmarks/decode_trace.py --ncu --out "$out/ncu_trace" --configs "${configs[@]}") ;;
  ragged) cmd=(benchmarks/profile_ragged.py --variants ours,fa3
               --configs "${1:-chunked 8x512 of 8192}") ;;
  *) echo "profile.sh: unknown profile '$name'" >&2; exit 2 ;;
esac
if ! ncu --profile-from-start off --set full --import-source yes --clock-control none \
    -f -o "$out/ncu_$name" python3 "${cmd[@]}" > "$out/ncu_$name.log" 2>&1; then
  tail -5 "$out/ncu_$name.log"
  exit 1
fi
ncu --import "$out/ncu_$name.ncu-rep" --page raw --csv | gzip > "$out/ncu_${name}_raw.csv.gz"
ncu --import "$out/ncu_$name.ncu-rep" --page source --csv 2>/dev/null \
  | gzip > "$out/ncu_${name}_source.csv.gz"
python3 benchmarks/ncu_summary.py "$out/ncu_${name}_raw.csv.gz" --out "$out/ncu_$name.md" \
  || status=1
exit "$status"
