#!/usr/bin/env bash
# The benchmark gate (benchmarks/gate.py): every shipped kernel's headline configurations
# against benchmarks/results/latest/<card>/gate.json; exits 1 on a slowdown beyond the
# measured noise. Sized for one 10-minute call, the kernels' builds included (all at once).
#
#   bash scripts/gpu/gate.sh OUT_DIR             # compare with the card's baseline
#   bash scripts/gpu/gate.sh OUT_DIR --write     # record the card's baseline
#
# Further options go to benchmarks/gate.py (--only TEXT..., --rounds N, --budget S, --src
# DIR, --results DIR). A change against its base on one machine, in one call (base/src: the
# base commit's src/, e.g. `git archive BASE src | tar -x -C base`):
#   bash scripts/gpu/gate.sh OUT_DIR --src base/src --write --results OUT_DIR/base \
#     && bash scripts/gpu/gate.sh OUT_DIR --results OUT_DIR/base
# Writes OUT_DIR/gate_{write,compare}.txt and .json; a baseline written under
# benchmarks/results/latest/ is also copied under OUT_DIR (same path), to bring back.
source "$(dirname "$0")/common.sh" "${1:-}"
shift
mode=compare
[[ " $* " == *" --write "* ]] && mode=write
python3 benchmarks/gate.py --out "$out/gate_$mode.json" "$@" 2>&1 | tee "$out/gate_$mode.txt"
status=${PIPESTATUS[0]}
find benchmarks/results/latest -name gate.json -newer "$out/env.txt" \
  -exec cp --parents {} "$out/" \;
exit "$status"
