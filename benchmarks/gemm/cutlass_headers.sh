#!/usr/bin/env bash
# Puts CUTLASS 4.2's C++ headers (include/cutlass, include/cute, tools/util/include) from the
# nvidia-cutlass wheel into the git-ignored .cutlass/ at the repository root, for
# benchmarks/gemm/cutlass_decode_gemm.cu and the Hopper paths of linear and fp8_linear. The GPU
# machines cannot download, so the headers travel with the working tree; to keep that small
# (27 MB -> ~15 MB) only the headers those sources read are kept, as `nvcc -M` lists them
# (skipped when nvcc or cuBLAS's headers are missing: then all of them stay).
#
#   bash benchmarks/gemm/cutlass_headers.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$root/.cutlass"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

python3 -m pip download --no-deps --quiet nvidia-cutlass==4.2.0.0 -d "$tmp"
python3 -m zipfile -e "$tmp"/nvidia_cutlass-4.2.0.0-py3-none-any.whl "$tmp/whl"
src="$tmp/whl/cutlass_library/source"
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/tools/util"
cp -r "$src/include/cutlass" "$src/include/cute" "$dest/include/"
cp -r "$src/tools/util/include" "$dest/tools/util/"
cp "$tmp"/whl/nvidia_cutlass-4.2.0.0.dist-info/licenses/LICENSE.txt "$dest/"

# cuBLAS's headers may come from the nvidia-cublas wheel rather than the toolkit.
blas_inc="$(python3 -c 'import nvidia.cu13, os; print(os.path.join(nvidia.cu13.__path__[0], "include"))' 2>/dev/null || true)"
# Keep what the harness and the project's own Hopper translation units include (a header the
# harness never reads, such as the mixed-input mainloop fp8_linear uses, must survive).
kernels="$root/src/xla_kernels/kernels"
sources=(
  "$root/benchmarks/gemm/cutlass_decode_gemm.cu"
  "$kernels/linear/linear_sm90.cu"
  "$kernels/fp8_linear/fp8_linear_sm90.cu"
)
deps_ok=1
for source in "${sources[@]}"; do
  if ! command -v nvcc > /dev/null ||
    ! nvcc -std=c++17 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
      -I "$dest/include" -I "$dest/tools/util/include" -I "$root/src/xla_kernels/include" \
      ${blas_inc:+-isystem "$blas_inc"} -M "$source" -o "$tmp/deps.d"; then
    deps_ok=0
    break
  fi
  tr ' \\' '\n\n' < "$tmp/deps.d" | grep -F "$dest/" >> "$tmp/keep.all" || true
done
if [ "$deps_ok" = 1 ]; then
  sort -u "$tmp/keep.all" > "$tmp/keep"
  find "$dest" -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.inl' -o -name '*.cuh' \) \
    | sort | comm -23 - "$tmp/keep" | xargs -r rm
  find "$dest" -type d -empty -delete
else
  echo "nvcc -M could not read one of the sources: all headers kept" >&2
fi
du -sh "$dest"
