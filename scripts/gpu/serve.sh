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
#   tiny_moe_jax tiny_moe_torchax   the tiny-moe preset, checked token for token
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
    tiny_moe_jax) serve_run tiny_moe_jax 120 --preset tiny-moe --frontend jax ;;
    tiny_moe_torchax) serve_run tiny_moe_torchax 120 --preset tiny-moe --frontend torchax ;;
    *) echo "serve.sh: unknown run '$name'" >&2; status=1 ;;
  esac
done
exit "$status"
