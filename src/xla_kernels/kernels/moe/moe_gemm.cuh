// fused_moe's grouped GEMMs on NVIDIA GPUs (sm_80+: mma.sync m16n8k16, bf16/f16 operands,
// f32 accumulation), kernel core without XLA types.
//
// A CTA computes one tile of rows (at most BM token pairs routed to one expert, from the
// sort's tile table) times BN output columns of that expert:
//   GEMM1 (kGated): A = the pairs' hidden rows (gathered by token), B = the expert's w13
//     rows n0.. (gate) and intermediate + n0.. (up), both in one shared tile, so every
//     thread holds a gate and the matching up accumulator: the epilogue writes
//     act(gate) * up, rounded to the dtype, as the row's activation [pairs, intermediate].
//   GEMM2: A = the activation rows (contiguous: rows are in sorted order), B = the expert's
//     w2 rows; the epilogue multiplies by the pair's routing weight and writes the row's
//     output [pairs, hidden] in the dtype (the combine kernel sums a token's rows).
// Warps: 128-row tiles take 4 warps, 2 x 2 over rows and columns. 16- and 64-row tiles take
// 8: they stream weights (a few rows per expert), and Nsight Compute showed 4 warps per SM
// leaving 67-75 % of the issue slots empty while the weight reads waited. The 8 warps split
// the rows (64: 2 ways), the columns (2 or 4 ways) and each stage's K (2 or 4 ways,
// `kKGroups`); the K groups' partial sums meet in shared memory before the epilogue.
// Tiles of BK = 64 along K go through a cp.async pipeline of kStages stages. Shared tiles of
// the dtype are stored with 16-byte chunks XOR-swizzled by row (chunk c of row r at
// c ^ (r % 8)) so that ldmatrix reads 8 rows of one column without bank conflicts. fp8 (e4m3)
// weights arrive raw in shared memory and are dequantized (times their scale, rounded to the
// dtype) into one swizzled tile before the MMAs read it. Rows past the tile's end, columns
// past N and K past the end are zero-filled; K not a multiple of 16 bytes is loaded element by
// element (odd hidden sizes), and every other load is a 16-byte cp.async from an address
// each thread works out once per CTA (its chunks' rows stay the same along K).
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

template <typename T, bool kFp8, bool kGated, int BM, int BN, int kStages>
__global__ void __launch_bounds__(GemmConfig<T, kFp8, kGated, BM, BN, kStages>::kThreads)
    GroupedGemmKernel(const GemmParams p) {
  using C = GemmConfig<T, kFp8, kGated, BM, BN, kStages>;
  using WT = std::conditional_t<kFp8, uint8_t, T>;
  constexpr int kThreads = C::kThreads;
  static_assert(C::kReduceBytes <= kStages * C::kStageBytes, "the reduction fits the pipeline");
  extern __shared__ __align__(128) unsigned char smem[];
  const int tile = blockIdx.x;
  if (tile >= *p.tile_count) return;  // the whole CTA: before any barrier
  const int expert = p.tiles[2 * tile], row0 = p.tiles[2 * tile + 1];
  const int rows = min(BM, p.offsets[expert + 1] - row0);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int64_t K = p.K, N = p.N;
  const int64_t w_rows = kGated ? 2 * N : N;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int kgroup = warp / C::kTileWarps, tile_warp = warp % C::kTileWarps;
  const int wm = tile_warp / C::kWarpsN, wn = tile_warp % C::kWarpsN;

  auto stage_a = [&](int s) { return reinterpret_cast<T*>(smem + s * C::kStageBytes); };
  auto stage_b = [&](int s) {
    return reinterpret_cast<WT*>(smem + s * C::kStageBytes + C::kABytes);
  };
  T* conv = reinterpret_cast<T*>(smem + kStages * C::kStageBytes);

  // A chunks: this thread's i-th chunk is row (tid + i * kThreads) / 8 of the tile, column
  // chunk tid % 8 (the same for every i: kThreads is a multiple of 8).
  const int a_col = (tid % 8) * 8;
  const T* a_src[C::kAIters];  // the chunk's first element at k = 0; null: no such row
#pragma unroll
  for (int i = 0; i < C::kAIters; ++i) {
    const int idx = tid + i * kThreads, r = idx / 8;
    a_src[i] = nullptr;
    if (idx < BM * 8 && r < rows) {
      const int64_t src = kGated ? p.sorted_pairs[row0 + r] / p.top_k : row0 + r;
      a_src[i] = static_cast<const T*>(p.a) + src * K + a_col;
    }
  }
  auto a_dst = [&](int i) { return Swz((tid + i * kThreads) / 8, a_col); };

  // B chunks: the i-th is tile row j = j0 + i * kRowStep, column chunk tid % kBChunksPerRow.
  // A tile row j holds weight row n0 + j (gated: gate rows n0 + j for j < BN, then up rows
  // N + n0 + j - BN); rows past N and chunks past the tile are never loaded (zero-filled
  // once below).
  constexpr int kRowStep = kThreads / C::kBChunksPerRow;
  const int j0 = tid / C::kBChunksPerRow;
  const int b_col = (tid % C::kBChunksPerRow) * C::kWElems;
  auto weight_row = [&](int j) -> int64_t {
    const int64_t col = n0 + (kGated ? j % BN : j);
    if (col >= N) return -1;
    return (kGated && j >= BN) ? N + col : col;
  };
  const WT* w_expert = static_cast<const WT*>(p.w) + static_cast<int64_t>(expert) * w_rows * K;
  const WT* b_base = w_expert + (n0 + j0) * K + b_col;  // tile row j0 of the gate half
  const int64_t row_step = kRowStep * K;
  const int64_t up_shift = (N - BN) * K;  // tile row j >= BN: N - BN weight rows further
  uint32_t b_valid = 0;                   // bit i: chunk i exists and its weight row < N
  static_assert(C::kBIters <= 32, "one bit per chunk");
#pragma unroll
  for (int i = 0; i < C::kBIters; ++i) {
    const int j = j0 + i * kRowStep;
    if (j < C::kBRows && weight_row(j) >= 0) b_valid |= 1u << i;
  }
  auto b_src = [&](int i) {  // i is a compile-time constant: the half is known statically
    const bool up = kGated && (BN % kRowStep == 0 ? i * kRowStep >= BN : j0 + i * kRowStep >= BN);
    return b_base + i * row_step + (up ? up_shift : 0);
  };
  auto b_dst = [&](int i) {
    const int j = j0 + i * kRowStep;
    return kFp8 ? j * kBK + b_col : Swz(j, b_col);
  };

  // Chunks that are never loaded hold zeros in every stage.
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
#pragma unroll
    for (int i = 0; i < C::kAIters; ++i) {
      if (tid + i * kThreads < BM * 8 && a_src[i] == nullptr)
        *reinterpret_cast<uint4*>(stage_a(s) + a_dst(i)) = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < C::kBIters; ++i) {
      if (j0 + i * kRowStep < C::kBRows && !(b_valid >> i & 1))
        *reinterpret_cast<uint4*>(stage_b(s) + b_dst(i)) = make_uint4(0, 0, 0, 0);
    }
  }

  auto load = [&](int s, int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    T* as = stage_a(s);
#pragma unroll
    for (int i = 0; i < C::kAIters; ++i) {
      if (a_src[i] == nullptr) continue;
      T* dst = as + a_dst(i);
      const T* src = a_src[i] + k0;
      const int64_t k = k0 + a_col;
      if (p.a_async && k + 8 <= K) {
        cuda_mma::cp_async16(dst, src);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = k + e < K ? src[e] : FromF32<T>(0.f);
      }
    }
    WT* bs = stage_b(s);
    if (p.w_async && k0 + kBK <= K) {  // the whole stage: 16-byte copies
      // Unrolled fully for decode; prefill tiles keep their registers for 64-128
      // accumulators (unrolled, the 16 chunks' addresses made them spill).
      constexpr int kUnroll = C::kDecode ? C::kBIters : 4;
#pragma unroll kUnroll
      for (int i = 0; i < C::kBIters; ++i) {
        if (b_valid >> i & 1) cuda_mma::cp_async16_l2<256>(bs + b_dst(i), b_src(i) + k0);
      }
    } else {  // K's tail, or rows not 16-byte aligned: element by element
      const int64_t k = k0 + b_col;
#pragma unroll
      for (int i = 0; i < C::kBIters; ++i) {
        if (!(b_valid >> i & 1)) continue;
        WT* dst = bs + b_dst(i);
        const WT* src = b_src(i) + k0;
#pragma unroll
        for (int e = 0; e < C::kWElems; ++e) {
          if constexpr (kFp8) {
            dst[e] = k + e < K ? src[e] : uint8_t{0};
          } else {
            dst[e] = k + e < K ? src[e] : FromF32<T>(0.f);
          }
        }
      }
    }
  };

  // fp8: the raw stage's weights times their scales, rounded to T, into the swizzled tile.
  // Thread groups of 8 weights: group i is tile row (tid + i * kThreads) / 8, the same along
  // K, so each group's scale row (per-channel: its scale) is looked up once per CTA; a block
  // scale's column is one per stage when the block spans whole stages (bk % 64 == 0). Other
  // block shapes and huge experts look each scale up per weight (ScaleIndex).
  constexpr int kGroups = kFp8 ? C::kBRows * (kBK / 8) / kThreads : 1;
  static_assert(!kFp8 || kGroups * kThreads == C::kBRows * (kBK / 8), "groups split evenly");
  const int64_t scales_per_expert =
      !kFp8 ? 0 : p.scale_bk == 0 ? w_rows : CeilDiv(w_rows, p.scale_bn) * CeilDiv(K, p.scale_bk);
  const float* sc = kFp8 ? p.scale + expert * scales_per_expert : nullptr;
  const bool stage_scales = kFp8 && (p.scale_bk == 0 || (p.scale_bk % kBK == 0 &&
                                                         w_rows * K < (int64_t{1} << 31)));
  // 128-row tiles have no registers to spare (their accumulators take 128): they look the
  // scale row up per stage instead, and convert two groups at a time.
  constexpr bool kCacheScales = BM <= 64;
  constexpr int kCached = kCacheScales ? kGroups : 1;
  const int scale_cols = kFp8 && p.scale_bk != 0 ? static_cast<int>(CeilDiv(K, p.scale_bk)) : 0;
  float group_scale[kCached];    // per-channel: the group's scale
  int group_scale_row[kCached];  // block scales: the first scale of the group's row
#pragma unroll
  for (int i = 0; i < kCached; ++i) {
    group_scale[i] = 0.f;
    group_scale_row[i] = 0;
    const int64_t wr = kFp8 && kCacheScales && stage_scales ? weight_row((tid + i * kThreads) / 8)
                                                            : -1;
    if (wr >= 0 && p.scale_bk == 0) group_scale[i] = sc[wr];
    if (wr >= 0 && p.scale_bk != 0)
      group_scale_row[i] = static_cast<int>(wr / p.scale_bn) * scale_cols;
  }
  // The scale of group i's weights in the stage whose block-scale column is scale_col (rows
  // past N: 0, or any finite scale, as their raw weights are zeros).
  auto scale_of = [&](int i, int scale_col) -> float {
    if constexpr (kCacheScales) {
      return p.scale_bk == 0 ? group_scale[i] : sc[group_scale_row[i] + scale_col];
    } else {
      const int64_t wr = weight_row((tid + i * kThreads) / 8);
      if (wr < 0) return 0.f;
      return p.scale_bk == 0 ? sc[wr]
                             : sc[static_cast<int>(wr / p.scale_bn) * scale_cols + scale_col];
    }
  };
  // 8 e4m3 values times f, rounded to T: e4m3 -> f16 is exact, so the products are the
  // same as E4m3ToF32(b) * f.
  auto convert8 = [&](const uint8_t* src, float f) {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    uint32_t packed[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const auto pair =
          static_cast<__nv_fp8x2_storage_t>(((q < 2 ? raw.x : raw.y) >> (16 * (q % 2))) & 0xffff);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 v = __half22float2(__half2(h));
      packed[q] = cuda_mma::pack2<T>(v.x * f, v.y * f);
    }
    return make_uint4(packed[0], packed[1], packed[2], packed[3]);
  };
  auto dequantize = [&](int s, int kt) {
    const uint8_t* raw = reinterpret_cast<const uint8_t*>(stage_b(s));
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    if (!stage_scales) {  // a scale per weight (raw zeros past K and for rows past N)
#pragma unroll 1
      for (int i = 0; i < kGroups; ++i) {
        const int idx = tid + i * kThreads, j = idx / (kBK / 8), c = idx % (kBK / 8);
        const int64_t wr = weight_row(j);
        alignas(16) T e8[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t k = k0 + c * 8 + e;
          const float f =
              wr >= 0 && k < K ? sc[ScaleIndex(wr, k, K, p.scale_bn, p.scale_bk)] : 0.f;
          e8[e] = FromF32<T>(E4m3ToF32(raw[j * kBK + c * 8 + e]) * f);
        }
        *reinterpret_cast<uint4*>(conv + Swz(j, c * 8)) = *reinterpret_cast<const uint4*>(e8);
      }
      return;
    }
    const int scale_col = p.scale_bk != 0 ? static_cast<int>(k0 / p.scale_bk) : 0;
    constexpr int kUnrollGroups = kCacheScales ? kGroups : 2;
#pragma unroll kUnrollGroups
    for (int i = 0; i < kGroups; ++i) {
      const int idx = tid + i * kThreads, j = idx / (kBK / 8), c = idx % (kBK / 8);
      *reinterpret_cast<uint4*>(conv + Swz(j, c * 8)) =
          convert8(raw + j * kBK + c * 8, scale_of(i, scale_col));
    }
  };

  float acc[C::kMi][C::kNi][4] = {};
  float acc_up[kGated ? C::kMi : 1][kGated ? C::kNi : 1][4] = {};

  // This warp's share of a stage: its K group's m16n8k16 steps.
  auto compute = [&](const T* as, const T* bs) {
#pragma unroll
    for (int q = 0; q < kBK / 16 / C::kKGroups; ++q) {
      const int kk = q * C::kKGroups + kgroup;
      uint32_t a[C::kMi][4];
#pragma unroll
      for (int mi = 0; mi < C::kMi; ++mi) {
        const int r = wm * C::kWarpRows + mi * 16 + lane % 16;
        cuda_mma::ldsm_x4(a[mi], as + Swz(r, kk * 16 + (lane / 16) * 8));
      }
#pragma unroll
      for (int half = 0; half < (kGated ? 2 : 1); ++half) {
#pragma unroll
        for (int nj = 0; nj < C::kNi / 2; ++nj) {
          const int m = lane / 8;
          const int j = half * BN + wn * C::kWarpCols + nj * 16 + (m / 2) * 8 + lane % 8;
          uint32_t b[4];
          cuda_mma::ldsm_x4(b, bs + Swz(j, kk * 16 + (m % 2) * 8));
#pragma unroll
          for (int mi = 0; mi < C::kMi; ++mi) {
            if (half == 0) {
              cuda_mma::mma16816<T>(acc[mi][2 * nj], a[mi], b[0], b[1]);
              cuda_mma::mma16816<T>(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
            } else if constexpr (kGated) {
              cuda_mma::mma16816<T>(acc_up[mi][2 * nj], a[mi], b[0], b[1]);
              cuda_mma::mma16816<T>(acc_up[mi][2 * nj + 1], a[mi], b[2], b[3]);
            }
          }
        }
      }
    }
  };

  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load(s, s);
    cuda_mma::cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cuda_mma::cp_async_wait<kStages - 2>();
    __syncthreads();
    const int s = kt % kStages;
    if constexpr (kFp8) {
      dequantize(s, kt);
      __syncthreads();
    }
    // The stage loaded now was last read in iteration kt - 1, which every thread has left.
    const int next = kt + kStages - 1;
    if (next < k_tiles) load(next % kStages, next);
    cuda_mma::cp_async_commit();
    if constexpr (kFp8) {
      compute(stage_a(s), conv);
    } else {
      compute(stage_a(s), stage_b(s));
    }
  }
  cuda_mma::cp_async_wait<0>();

  if constexpr (C::kKGroups > 1) {
    // K groups 1.. hand their partial sums to group 0 through the pipeline's shared memory
    // (every warp has left the last stage at the barrier), lane-major: conflict-free.
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);
    auto slot = [&](int g, int e) {
      return red + ((g - 1) * C::kTileWarps + tile_warp) * 32 * C::kAccPerLane + e * 32 + lane;
    };
    auto visit = [&](auto&& f) {  // every accumulator of this thread, numbered 0..
      int e = 0;
#pragma unroll
      for (int mi = 0; mi < C::kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < C::kNi; ++ni)
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            f(acc[mi][ni][x], e++);
            if constexpr (kGated) f(acc_up[mi][ni][x], e++);
          }
    };
    if (kgroup > 0) visit([&](float& v, int e) { *slot(kgroup, e) = v; });
    __syncthreads();
    if (kgroup > 0) return;
#pragma unroll
    for (int g = 1; g < C::kKGroups; ++g) visit([&](float& v, int e) { v += *slot(g, e); });
  }

  T* out = static_cast<T*>(p.out);
  // Two adjacent columns go out in one 4-byte store when every pair is 4-byte aligned: N
  // even (row * N + col is even) and `out` itself aligned (the per-pair outputs start
  // pairs * intermediate elements into the workspace, which may be odd).
  const bool paired = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
#pragma unroll
  for (int mi = 0; mi < C::kMi; ++mi) {
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
      const int r = wm * C::kWarpRows + mi * 16 + lane / 4 + half_row * 8;
      if (r >= rows) continue;
      const int64_t row = row0 + r;
      const float weight = kGated ? 1.f : p.topk_weights[p.sorted_pairs[row]];
#pragma unroll
      for (int ni = 0; ni < C::kNi; ++ni) {
        const int64_t col = n0 + wn * C::kWarpCols + ni * 8 + 2 * (lane % 4);
        float v[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float g = acc[mi][ni][half_row * 2 + c];
          if constexpr (kGated) {
            v[c] = Activate(p.activation, g) * acc_up[mi][ni][half_row * 2 + c];
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

// f32 (for float32 checks on a GPU): CUDA cores. A CTA of kSimtThreads threads computes
// kSimtThreads output columns (one per thread) of a tile of at most kSimtRows rows, K in
// chunks of kSimtK: the chunk's weight rows (gate and up for GEMM1) and A rows are loaded
// into shared memory with coalesced reads, then each thread accumulates its column over the
// chunk in K order. The tiles come from the same sort, with tile_rows = kSimtRows.
constexpr int kSimtRows = 16;
constexpr int kSimtThreads = 128;
constexpr int kSimtK = 32;

template <bool kFp8, bool kGated>
__global__ void __launch_bounds__(kSimtThreads) SimtGemmKernel(const GemmParams p) {
  __shared__ float w_s[kGated ? 2 : 1][kSimtThreads][kSimtK + 1];  // +1: no bank conflicts
  __shared__ float a_s[kSimtRows][kSimtK];
  __shared__ const float* a_row[kSimtRows];
  const int tile = blockIdx.x;
  if (tile >= *p.tile_count) return;  // the whole CTA: before any barrier
  const int tid = threadIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kSimtThreads;
  const int64_t K = p.K, N = p.N;
  const int expert = p.tiles[2 * tile], row0 = p.tiles[2 * tile + 1];
  const int rows = min(kSimtRows, p.offsets[expert + 1] - row0);
  const int64_t w_rows = kGated ? 2 * N : N;
  if (tid < kSimtRows) {
    const int64_t src = kGated ? p.sorted_pairs[row0 + min(tid, rows - 1)] / p.top_k
                               : row0 + min(tid, rows - 1);
    a_row[tid] = tid < rows ? static_cast<const float*>(p.a) + src * K : nullptr;
  }
  const int64_t per_expert =
      !kFp8 ? 0 : p.scale_bk == 0 ? w_rows : CeilDiv(w_rows, p.scale_bn) * CeilDiv(K, p.scale_bk);
  // Weight (wr, k) of this expert, dequantized for fp8; 0 past the matrix.
  auto weight = [&](int64_t wr, int64_t k) -> float {
    if (wr >= w_rows || k >= K) return 0.f;
    const int64_t at = (static_cast<int64_t>(expert) * w_rows + wr) * K + k;
    if constexpr (kFp8) {
      const float* sc = p.scale + expert * per_expert;
      return E4m3ToF32(static_cast<const uint8_t*>(p.w)[at]) *
             sc[ScaleIndex(wr, k, K, p.scale_bn, p.scale_bk)];
    } else {
      return static_cast<const float*>(p.w)[at];
    }
  };
  float acc[kSimtRows] = {}, acc_up[kSimtRows] = {};
  __syncthreads();
  for (int64_t k0 = 0; k0 < K; k0 += kSimtK) {
    for (int idx = tid; idx < kSimtThreads * kSimtK; idx += kSimtThreads) {
      const int j = idx / kSimtK, kk = idx % kSimtK;
      const int64_t col = n0 + j;
      w_s[0][j][kk] = col < N ? weight(col, k0 + kk) : 0.f;
      if constexpr (kGated) w_s[kGated ? 1 : 0][j][kk] = col < N ? weight(N + col, k0 + kk) : 0.f;
    }
    for (int idx = tid; idx < kSimtRows * kSimtK; idx += kSimtThreads) {
      const int r = idx / kSimtK, kk = idx % kSimtK;
      a_s[r][kk] = a_row[r] != nullptr && k0 + kk < K ? a_row[r][k0 + kk] : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kSimtK; ++kk) {
      const float g = w_s[0][tid][kk];
      const float u = kGated ? w_s[kGated ? 1 : 0][tid][kk] : 0.f;
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        acc[r] += a_s[r][kk] * g;
        if constexpr (kGated) acc_up[r] += a_s[r][kk] * u;
      }
    }
    __syncthreads();
  }
  const int64_t col = n0 + tid;
  if (col >= N) return;
  float* out = static_cast<float*>(p.out);
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) {
    if (r >= rows) break;
    const int64_t row = row0 + r;
    out[row * N + col] = kGated ? Activate(p.activation, acc[r]) * acc_up[r]
                                : acc[r] * p.topk_weights[p.sorted_pairs[row]];
  }
}

}  // namespace xla_kernels::moe
