// fused_moe's grouped GEMM (moe_gemm.cuh): its parameters, the tile shapes of each
// instantiation and the shared-memory layout every role of the kernel reads. Kernel core
// without XLA types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "moe_limits.h"
#include "moe_routing.cuh"
#include "xla_kernels/cuda_mma.cuh"

namespace xla_kernels::moe {

constexpr int kBK = 64;  // K elements per pipeline stage (128 bytes of bf16 per row)

struct GemmParams {
  const void* a;                  // GEMM1: hidden [tokens, K]; GEMM2: act [pairs, K]
  const void* w;                  // [experts, weight rows, K]: the dtype, or e4m3
  const float* scale;             // fp8: the weights' scales (see ScaleIndex), else null
  int64_t scale_bn, scale_bk;     // fp8 scale blocks ((1, 0): per output channel)
  const int32_t* sorted_pairs;    // [pairs] the pair of each sorted row
  const int32_t* offsets;         // [experts + 1] first sorted row of each expert
  const int32_t* tiles;           // [2 * max_tiles] (expert, first row)
  const int32_t* tile_count;      // [1]
  const float* topk_weights;      // [pairs] (GEMM2)
  void* out;                      // GEMM1: act [pairs, N]; GEMM2: y [pairs, N]
  int64_t K, N;                   // N: output columns (GEMM1: intermediate)
  int top_k;
  bool a_async, w_async;          // 16-byte cp.async allowed for A rows / weight rows
  int activation;                 // 0 silu, 1 gelu (GEMM1)
};

template <typename T, bool kFp8, bool kGated, int BM, int BN, int kStages>
struct GemmConfig {
  using WT = std::conditional_t<kFp8, uint8_t, T>;  // a weight as stored
  static constexpr bool kDecode = BM == 16;
  static constexpr int kWarpsM = BM >= 64 ? 2 : 1;
  static constexpr int kWarpsN = kDecode ? (BN >= 64 ? 4 : 2) : 2;
  // Warps sharing a stage's K: 8 warps per CTA up to 64 rows, 4 for 128-row tiles (their
  // accumulators take the registers of 8).
  static constexpr int kKGroups = BM == 128 ? 1 : 8 / (kWarpsM * kWarpsN);
  static constexpr int kTileWarps = kWarpsM * kWarpsN;        // warps of one K group
  static constexpr int kThreads = 32 * kTileWarps * kKGroups;
  static constexpr int kWarpRows = BM / kWarpsM;      // rows per warp
  static constexpr int kWarpCols = BN / kWarpsN;      // output columns per warp (per half)
  static constexpr int kMi = kWarpRows / 16;
  static constexpr int kNi = kWarpCols / 8;
  static constexpr int kBRows = kGated ? 2 * BN : BN; // weight rows in a B tile
  static constexpr int kWBytes = kFp8 ? 1 : 2;
  static constexpr int kABytes = BM * kBK * 2;
  static constexpr int kBBytes = kBRows * kBK * kWBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kConvBytes = kFp8 ? kBRows * kBK * 2 : 0;
  static constexpr int kSmemBytes = kStages * kStageBytes + kConvBytes;
  // 16-byte chunks per tile row and loads per thread per stage (the last may be partial).
  static constexpr int kWElems = 16 / kWBytes;
  static constexpr int kBChunksPerRow = kBK / kWElems;
  static constexpr int kAIters = (BM * 8 + kThreads - 1) / kThreads;
  static constexpr int kBIters = (kBRows * kBChunksPerRow + kThreads - 1) / kThreads;
  // The K groups' partial accumulators, lane-major, in the pipeline's shared memory.
  static constexpr int kAccPerLane = kMi * kNi * 4 * (kGated ? 2 : 1);
  static constexpr int kReduceBytes = (kKGroups - 1) * kTileWarps * 32 * kAccPerLane * 4;
  static_assert(kWarpRows % 16 == 0 && kNi % 2 == 0, "warp tiles of m16 x n16 steps");
  static_assert((kBK / 16) % kKGroups == 0, "each K group takes whole m16n8k16 steps");
  static_assert(kThreads % kBChunksPerRow == 0, "a thread's chunks share one column");
};

// Element offset of (row, k) in a swizzled tile of kBK-element rows of a 16-bit type.
__device__ __forceinline__ int Swz(int row, int k) {
  return row * kBK + ((((k >> 3) ^ row) & 7) << 3) + (k & 7);
}

__device__ __forceinline__ float Activate(int activation, float g) {
  if (activation == 0) return g / (1.f + expf(-g));
  return 0.5f * g * (1.f + erff(g * 0.70710678118654752f));
}

__device__ __forceinline__ float E4m3ToF32(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = b;
  return static_cast<float>(v);
}

}  // namespace xla_kernels::moe
