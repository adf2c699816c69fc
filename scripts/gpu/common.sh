# Sourced by every job in scripts/gpu/: the settings a GPU run needs, a results folder and
# the record of the machine. Expects to be run from the repository root.
#
#   source scripts/gpu/common.sh OUT_DIR     # sets $out (created), $status (0), step()
set -uo pipefail
out=${1:?usage: <job>.sh OUT_DIR [options]}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# XLA takes memory as needed (the tests and benchmarks also use torch on the same card).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export XLA_KERNELS_CACHE_DIR=${XLA_KERNELS_CACHE_DIR:-/tmp/xla-kernels-cache}
export XK_RESULTS_DIR=$out  # where GPU tests that measure leave their numbers
status=0
step() { echo; echo "=== $1"; }

# Wheels carried along in .whl/ (torchax, flash-attn3-jax, tokamax and its pure-Python
# dependencies) and .whl-fi/ (FlashInfer and apache-tvm-ffi), installed under /tmp/site once
# per machine each: a wheel not yet installed there (no marker in /tmp/site/.wheels) is, so a
# warm machine also takes wheels that a later call carries.
wheels=$(ls .whl/*.whl .whl-fi/*.whl 2>/dev/null | awk -F/ '!seen[$NF]++')
new_wheels=$(for w in $wheels; do [ -e "/tmp/site/.wheels/${w##*/}" ] || echo "$w"; done)
if [ -n "$new_wheels" ] && python3 -m pip install -q --no-index --no-deps --no-compile \
    --upgrade --target /tmp/site $new_wheels; then
  mkdir -p /tmp/site/.wheels
  for w in $new_wheels; do touch "/tmp/site/.wheels/${w##*/}"; done
fi
[ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site PATH=$PATH:/tmp/site/bin

{
  date -u +%FT%TZ
  git log -1 --format='commit %h %s' 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  python3 -c 'import importlib
for name in ("jax", "jaxlib", "torch", "torchax", "triton"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:
        print(name, "missing:", e)'
} > "$out/env.txt" 2>&1

# serve_run NAME SECONDS OPTIONS...: one serve-bench run on the GPU with a time limit,
# writing OUT_DIR/serve_NAME.json and .txt (the last lines of its output).
serve_run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m xla_kernels.cli serve-bench --platform gpu --no-progress \
    --json "$out/serve_$name.json" "$@" 2>&1 | tail -25 | tee "$out/serve_$name.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
