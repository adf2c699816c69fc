// The grouped GEMM's loads and mainloop: a tile's A rows and B (weight) rows from global
// memory through a cp.async pipeline of kStages stages of BK = 64 along K, fp8 weights
// dequantized per stage, and each stage's MMAs (MmaStage) while the next stages load.
//
// Each thread works out the global and shared addresses of its chunks once per CTA: a chunk's
// row is the same at every K. Rows past the tile's end and columns past N are never loaded:
// their chunks are zeroed once in every stage; K past the end is zero-filled per stage, and K
// not a multiple of 16 bytes is loaded element by element (odd hidden sizes); every other
// load is a 16-byte cp.async. fp8 (e4m3) weights arrive raw in shared memory and are
// dequantized (times their scale, rounded to the dtype) into one swizzled tile before the
// MMAs read it.
#pragma once

#include "moe_gemm_mma.cuh"
#include "moe_gemm_scheduler.cuh"

namespace xla_kernels::moe {

// This thread's accumulators over the whole of K for tile t (w: its warp, tid: its thread),
// its stages in the kernel's dynamic shared memory.
template <typename T, bool kFp8, bool kGated, int BM, int BN, int kStages>
__device__ __forceinline__ GemmAccumulators<GemmConfig<T, kFp8, kGated, BM, BN, kStages>, kGated>
GemmMainloop(const GemmParams& p, const GemmTile& t, int64_t K, int64_t N, const GemmWarp& w,
             int tid) {
  // The kernel's dynamic shared memory, named here rather than passed in as a pointer: with a
  // pointer, nvcc allocates the kernel's registers differently (fp8 decode tiles spill
  // differently).
  extern __shared__ __align__(128) unsigned char smem[];
  using C = GemmConfig<T, kFp8, kGated, BM, BN, kStages>;
  using WT = typename C::WT;
  constexpr int kThreads = C::kThreads;
  const int expert = t.expert, row0 = t.row0, rows = t.rows;
  const int64_t n0 = t.n0;
  const int64_t w_rows = kGated ? 2 * N : N;

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

  GemmAccumulators<C, kGated> f;

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
      MmaStage<T, kGated, BN>(f, stage_a(s), conv, w);
    } else {
      MmaStage<T, kGated, BN>(f, stage_a(s), stage_b(s), w);
    }
  }
  cuda_mma::cp_async_wait<0>();

  return f;
}

}  // namespace xla_kernels::moe
