// The grouped GEMM's tensor-core work: mma.sync m16n8k16 (bf16/f16 operands, f32
// accumulators) over a stage's swizzled tiles, read with ldmatrix, and the meeting of the K
// groups' partial sums before the epilogue.
//
// Warps: 128-row tiles take 4 warps, 2 x 2 over rows and columns. 16- and 64-row tiles take
// 8: they stream weights (a few rows per expert), and Nsight Compute showed 4 warps per SM
// leaving 67-75 % of the issue slots empty while the weight reads waited. The 8 warps split
// the rows (64: 2 ways), the columns (2 or 4 ways) and each stage's K (2 or 4 ways,
// `kKGroups`); the K groups' partial sums meet in shared memory (ReduceKGroups).
#pragma once

#include "moe_gemm_config.cuh"

namespace xla_kernels::moe {

// A thread's place among the CTA's warps: its K group and, within the group's tile, its
// warp's rows (wm) and columns (wn).
struct GemmWarp {
  int lane, kgroup, tile_warp, wm, wn;
};

template <typename C>
__device__ __forceinline__ GemmWarp WarpOf(int tid) {
  const int lane = tid % 32, warp = tid / 32;
  const int kgroup = warp / C::kTileWarps, tile_warp = warp % C::kTileWarps;
  return {lane, kgroup, tile_warp, tile_warp / C::kWarpsN, tile_warp % C::kWarpsN};
}

// A thread's accumulators: kMi x kNi m16n8 fragments, and as many for the up rows (GEMM1).
template <typename C, bool kGated>
struct GemmAccumulators {
  float acc[C::kMi][C::kNi][4] = {};
  float acc_up[kGated ? C::kMi : 1][kGated ? C::kNi : 1][4] = {};
};

// This warp's share of a stage (A tile `as`, B tile `bs`): its K group's m16n8k16 steps.
template <typename T, bool kGated, int BN, typename C>
__device__ void MmaStage(GemmAccumulators<C, kGated>& f, const T* as, const T* bs,
                         const GemmWarp& w) {
  const int lane = w.lane;
#pragma unroll
  for (int q = 0; q < kBK / 16 / C::kKGroups; ++q) {
    const int kk = q * C::kKGroups + w.kgroup;
    uint32_t a[C::kMi][4];
#pragma unroll
    for (int mi = 0; mi < C::kMi; ++mi) {
      const int r = w.wm * C::kWarpRows + mi * 16 + lane % 16;
      cuda_mma::ldsm_x4(a[mi], as + Swz(r, kk * 16 + (lane / 16) * 8));
    }
#pragma unroll
    for (int half = 0; half < (kGated ? 2 : 1); ++half) {
#pragma unroll
      for (int nj = 0; nj < C::kNi / 2; ++nj) {
        const int m = lane / 8;
        const int j = half * BN + w.wn * C::kWarpCols + nj * 16 + (m / 2) * 8 + lane % 8;
        uint32_t b[4];
        cuda_mma::ldsm_x4(b, bs + Swz(j, kk * 16 + (m % 2) * 8));
#pragma unroll
        for (int mi = 0; mi < C::kMi; ++mi) {
          if (half == 0) {
            cuda_mma::mma16816<T>(f.acc[mi][2 * nj], a[mi], b[0], b[1]);
            cuda_mma::mma16816<T>(f.acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
          } else if constexpr (kGated) {
            cuda_mma::mma16816<T>(f.acc_up[mi][2 * nj], a[mi], b[0], b[1]);
            cuda_mma::mma16816<T>(f.acc_up[mi][2 * nj + 1], a[mi], b[2], b[3]);
          }
        }
      }
    }
  }
}

// K groups 1.. hand their partial sums to group 0 through the pipeline's shared memory
// (every warp has left the last stage at the barrier), lane-major: conflict-free. Returns
// whether this thread holds its tile's sums (K group 0), which then runs the epilogue.
template <bool kGated, typename C>
__device__ __forceinline__ bool ReduceKGroups(GemmAccumulators<C, kGated>& f,
                                              unsigned char* smem, const GemmWarp& w) {
  if constexpr (C::kKGroups > 1) {
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);
    auto slot = [&](int g, int e) {
      return red + ((g - 1) * C::kTileWarps + w.tile_warp) * 32 * C::kAccPerLane + e * 32 +
             w.lane;
    };
    auto visit = [&](auto&& fn) {  // every accumulator of this thread, numbered 0..
      int e = 0;
#pragma unroll
      for (int mi = 0; mi < C::kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < C::kNi; ++ni)
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            fn(f.acc[mi][ni][x], e++);
            if constexpr (kGated) fn(f.acc_up[mi][ni][x], e++);
          }
    };
    if (w.kgroup > 0) visit([&](float& v, int e) { *slot(w.kgroup, e) = v; });
    __syncthreads();
    if (w.kgroup > 0) return false;
#pragma unroll
    for (int g = 1; g < C::kKGroups; ++g) visit([&](float& v, int e) { v += *slot(g, e); });
  }
  return true;
}

}  // namespace xla_kernels::moe
