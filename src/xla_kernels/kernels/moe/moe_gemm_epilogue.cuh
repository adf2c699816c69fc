// The grouped GEMM's epilogue: a thread's accumulators to its rows of the output, in the
// dtype. GEMM1 (kGated) writes act(gate) * up as the row's activation [pairs, intermediate];
// GEMM2 multiplies by the pair's routing weight and writes the row's output [pairs, hidden]
// (the combine kernel sums a token's rows).
#pragma once

#include "moe_gemm_mma.cuh"
#include "moe_gemm_scheduler.cuh"

namespace xla_kernels::moe {

template <typename T, bool kGated, typename C>
__device__ __forceinline__ void GemmEpilogue(const GemmParams& p, const GemmTile& t,
                                             const GemmAccumulators<C, kGated>& f,
                                             const GemmWarp& w, int64_t N) {
  const int lane = w.lane;
  T* out = static_cast<T*>(p.out);
  // Two adjacent columns go out in one 4-byte store when every pair is 4-byte aligned: N
  // even (row * N + col is even) and `out` itself aligned (the per-pair outputs start
  // pairs * intermediate elements into the workspace, which may be odd).
  const bool paired = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
#pragma unroll
  for (int mi = 0; mi < C::kMi; ++mi) {
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
      const int r = w.wm * C::kWarpRows + mi * 16 + lane / 4 + half_row * 8;
      if (r >= t.rows) continue;
      const int64_t row = t.row0 + r;
      const float weight = kGated ? 1.f : p.topk_weights[p.sorted_pairs[row]];
#pragma unroll
      for (int ni = 0; ni < C::kNi; ++ni) {
        const int64_t col = t.n0 + w.wn * C::kWarpCols + ni * 8 + 2 * (lane % 4);
        float v[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float g = f.acc[mi][ni][half_row * 2 + c];
          if constexpr (kGated) {
            v[c] = Activate(p.activation, g) * f.acc_up[mi][ni][half_row * 2 + c];
          } else {
            v[c] = g * weight;
          }
        }
        if (paired && col + 1 < N) {
          *reinterpret_cast<uint32_t*>(out + row * N + col) = cuda_mma::pack2<T>(v[0], v[1]);
        } else {
          if (col < N) out[row * N + col] = FromF32<T>(v[0]);
          if (col + 1 < N) out[row * N + col + 1] = FromF32<T>(v[1]);
        }
      }
    }
  }
}

}  // namespace xla_kernels::moe
