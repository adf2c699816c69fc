// fused_moe's grouped GEMMs on NVIDIA GPUs (sm_80+: mma.sync m16n8k16, bf16/f16 operands,
// f32 accumulation), kernel core without XLA types.
//
// A CTA (4 warps) computes one tile of rows (at most BM token pairs routed to one expert,
// from the sort's tile table) times BN output columns of that expert:
//   GEMM1 (kGated): A = the pairs' hidden rows (gathered by token), B = the expert's w13
//     rows n0.. (gate) and intermediate + n0.. (up), both in one shared tile, so every
//     thread holds a gate and the matching up accumulator: the epilogue writes
//     act(gate) * up, rounded to the dtype, as the row's activation [pairs, intermediate].
//   GEMM2: A = the activation rows (contiguous: rows are in sorted order), B = the expert's
//     w2 rows; the epilogue multiplies by the pair's routing weight and writes the row's
//     output [pairs, hidden] in the dtype (the combine kernel sums a token's rows).
// Tiles of BK = 64 along K go through a cp.async pipeline of kStages stages. Shared tiles of
// the dtype are stored with 16-byte chunks XOR-swizzled by row (chunk c of row r at
// c ^ (r % 8)) so that ldmatrix reads 8 rows of one column without bank conflicts. fp8 (e4m3)
// weights arrive raw in shared memory and are dequantized (times their scale, rounded to the
// dtype) into one swizzled tile before the MMAs read it. Rows past the tile's end, columns
// past N and K past the end are zero-filled; K not a multiple of 16 bytes is loaded element by
// element (odd hidden sizes), and every other load is a 16-byte cp.async.
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

constexpr int kBK = 64;        // K elements per pipeline stage (128 bytes of bf16 per row)
constexpr int kThreads = 128;  // 4 warps per CTA

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
  static constexpr int kWarpsM = BM >= 64 ? 2 : 1;
  static constexpr int kWarpsN = 4 / kWarpsM;
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
  static_assert(kWarpRows % 16 == 0 && kNi % 2 == 0, "warp tiles of m16 x n16 steps");
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
__global__ void __launch_bounds__(kThreads)
    GroupedGemmKernel(const GemmParams p) {
  using C = GemmConfig<T, kFp8, kGated, BM, BN, kStages>;
  using WT = std::conditional_t<kFp8, uint8_t, T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tile = blockIdx.x;
  if (tile >= *p.tile_count) return;
  const int expert = p.tiles[2 * tile], row0 = p.tiles[2 * tile + 1];
  const int rows = min(BM, p.offsets[expert + 1] - row0);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int64_t K = p.K, N = p.N;
  const int64_t w_rows = kGated ? 2 * N : N;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;

  // The global row each A chunk this thread loads comes from (null: past the tile).
  constexpr int kAChunks = BM * 8 / kThreads;  // 16-byte chunks of A per thread per stage
  static_assert(kAChunks * kThreads == BM * 8, "A tiles split evenly over the threads");
  const T* a_row[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int idx = tid + i * kThreads, r = idx / 8;
    a_row[i] = nullptr;
    if (r < rows) {
      const int64_t src = kGated ? p.sorted_pairs[row0 + r] / p.top_k : row0 + r;
      a_row[i] = static_cast<const T*>(p.a) + src * K;
    }
  }
  // The weight row each B row of the tile holds (-1: past N).
  auto weight_row = [&](int j) -> int64_t {
    const int64_t col = n0 + (kGated ? j % BN : j);
    if (col >= N) return -1;
    return (kGated && j >= BN) ? N + col : col;
  };
  const WT* w_expert = static_cast<const WT*>(p.w) + static_cast<int64_t>(expert) * w_rows * K;

  auto stage_a = [&](int s) { return reinterpret_cast<T*>(smem + s * C::kStageBytes); };
  auto stage_b = [&](int s) {
    return reinterpret_cast<WT*>(smem + s * C::kStageBytes + C::kABytes);
  };
  T* conv = reinterpret_cast<T*>(smem + kStages * C::kStageBytes);

  auto load = [&](int s, int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    T* as = stage_a(s);
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const int idx = tid + i * kThreads, r = idx / 8, c = idx % 8;
      T* dst = as + Swz(r, c * 8);
      const int64_t k = k0 + c * 8;
      if (a_row[i] != nullptr && p.a_async && k + 8 <= K) {
        cuda_mma::cp_async16(dst, a_row[i] + k);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          dst[e] = (a_row[i] != nullptr && k + e < K) ? a_row[i][k + e] : FromF32<T>(0.f);
      }
    }
    WT* bs = stage_b(s);
    constexpr int kElems = 16 / sizeof(WT);         // elements per 16-byte chunk
    constexpr int kChunksPerRow = kBK / kElems;
    constexpr int kBChunks = C::kBRows * kChunksPerRow / kThreads;
#pragma unroll 4
    for (int i = 0; i < kBChunks; ++i) {
      const int idx = tid + i * kThreads, j = idx / kChunksPerRow, c = idx % kChunksPerRow;
      // fp8 tiles are raw (dequantized later, linearly); 16-bit tiles are swizzled.
      WT* dst = kFp8 ? bs + j * kBK + c * kElems : bs + Swz(j, c * kElems);
      const int64_t wr = weight_row(j), k = k0 + c * kElems;
      const WT* src = wr >= 0 ? w_expert + wr * K + k : w_expert;
      if (wr >= 0 && p.w_async && k + kElems <= K) {
        cuda_mma::cp_async16(dst, src);
      } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          if constexpr (kFp8) {
            dst[e] = (wr >= 0 && k + e < K) ? src[e] : uint8_t{0};
          } else {
            dst[e] = (wr >= 0 && k + e < K) ? src[e] : FromF32<T>(0.f);
          }
        }
      }
    }
  };

  // fp8: the raw stage's weights times their scales, rounded to T, into the swizzled tile.
  auto dequantize = [&](int s, int kt) {
    const uint8_t* raw = reinterpret_cast<const uint8_t*>(stage_b(s));
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    const int64_t per_expert = p.scale_bk == 0
                                   ? w_rows
                                   : CeilDiv(w_rows, p.scale_bn) * CeilDiv(K, p.scale_bk);
    const float* sc = p.scale + expert * per_expert;
    constexpr int kGroups = C::kBRows * (kBK / 8) / kThreads;  // 8 weights per group
#pragma unroll 4
    for (int i = 0; i < kGroups; ++i) {
      const int idx = tid + i * kThreads, j = idx / (kBK / 8), c = idx % (kBK / 8);
      const int64_t wr = weight_row(j);
      alignas(16) T v[8];
      if (wr < 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = FromF32<T>(0.f);
      } else if (p.scale_bk == 0) {
        const float f = sc[wr];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = FromF32<T>(E4m3ToF32(raw[j * kBK + c * 8 + e]) * f);
      } else if (p.scale_bk % 8 == 0 && k0 + c * 8 + 8 <= K &&
                 w_rows * K < (int64_t{1} << 31)) {
        // The group's 8 weights share one block scale: one lookup in 32-bit arithmetic (a
        // lookup per weight through ScaleIndex's 64-bit divisions made fp8 decode ~20x slower
        // than bf16).
        const int k = static_cast<int>(k0) + c * 8;
        const int scale_cols = (static_cast<int>(K) + static_cast<int>(p.scale_bk) - 1) /
                               static_cast<int>(p.scale_bk);
        const float f = sc[(static_cast<int>(wr) / static_cast<int>(p.scale_bn)) * scale_cols +
                           k / static_cast<int>(p.scale_bk)];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = FromF32<T>(E4m3ToF32(raw[j * kBK + c * 8 + e]) * f);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t k = k0 + c * 8 + e;
          const float f = k < K ? sc[ScaleIndex(wr, k, K, p.scale_bn, p.scale_bk)] : 0.f;
          v[e] = FromF32<T>(E4m3ToF32(raw[j * kBK + c * 8 + e]) * f);
        }
      }
      *reinterpret_cast<uint4*>(conv + Swz(j, c * 8)) = *reinterpret_cast<const uint4*>(v);
    }
  };

  float acc[C::kMi][C::kNi][4] = {};
  float acc_up[kGated ? C::kMi : 1][kGated ? C::kNi : 1][4] = {};

  auto compute = [&](const T* as, const T* bs) {
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
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
