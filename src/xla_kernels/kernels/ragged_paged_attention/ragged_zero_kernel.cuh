// ragged_paged_attention's padding rows: zeros for the output rows no sequence owns.
#pragma once

#include "ragged_common.cuh"

namespace xla_kernels::ragged_paged_attention {
namespace detail {

constexpr int kZeroRows = 16;  // output rows per CTA of the zero kernel

// Zeros every row no sequence owns: rows < c_0 and rows >= c_n.
__global__ void __launch_bounds__(kThreads) ragged_zero_kernel(const Args a, int row_bytes) {
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  __shared__ int red[kW];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n = clampi(__ldg(a.num_seqs), 0, a.max_seqs);
  int mx = INT_MIN;
  for (int j = tid; j <= n; j += kThreads) mx = max(mx, __ldg(a.cu + j));  // j <= n <= max_seqs
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) mx = max(mx, __shfl_xor_sync(kFull, mx, off));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
#pragma unroll
  for (int i = 1; i < kW; ++i) mx = max(mx, red[i]);
  const int c0 = clampi(__ldg(a.cu), 0, a.T);
  const int cn = clampi(mx, 0, a.T);  // the running maximum at j = n
  const int row0 = blockIdx.x * kZeroRows;
  const int chunks = row_bytes / 16;
  unsigned char* out = static_cast<unsigned char*>(a.out);
  for (int r = row0; r < min(row0 + kZeroRows, a.T); ++r) {
    if (r >= c0 && r < cn) continue;
    uint4* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(r) * row_bytes);
    for (int c = tid; c < chunks; c += kThreads) dst[c] = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace detail
}  // namespace xla_kernels::ragged_paged_attention
