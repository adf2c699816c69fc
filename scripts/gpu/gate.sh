#!/usr/bin/env bash
# The benchmark gate (benchmarks/gate.py): every shipped kernel's headline configurations
# against benchmarks/results/latest/<card>/gate.json; exits 1 on a slowdown beyond the
# measured noise. About 3 minutes on one H100, first-use kernel builds included.
#
#   bash scripts/gpu/gate.sh OUT_DIR             # compare with the card's baseline
#   bash scripts/gpu/gate.sh OUT_DIR --write     # record the baseline (on main's kernels)
#
# Further options go to benchmarks/gate.py (--only TEXT..., --rounds N, --budget S).
# Writes OUT_DIR/gate.txt and OUT_DIR/gate_run.json; with --write also the baseline
# benchmarks/results/latest/<card>/gate.json and its copy under OUT_DIR (with the same
# path), to bring back and commit.
source "$(dirname "$0")/common.sh" "${1:-}"
shift
python3 benchmarks/gate.py --out "$out/gate_run.json" "$@" 2>&1 | tee "$out/gate.txt"
status=${PIPESTATUS[0]}
# A baseline written under benchmarks/results/latest/ comes back under OUT_DIR/ as well.
find benchmarks/results/latest -name gate.json -newer "$out/env.txt" \
  -exec cp --parents {} "$out/" \;
exit "$status"
