// The skinny GEMM's mainloop: y[t, n] = sum_k x[t, k] * W[n, k] for few tokens (decode),
// where reading W once is the whole cost. Used by `linear` (W in x's dtype) and `fp8_linear`
// (W e4m3, converted in registers). Design and measurements: docs/design/gemm.md.
//
// A CTA streams its weight rows and x through a kStages-deep ring of shared-memory stages
// (cp.async, 16 bytes per copy), so that a whole split's bytes can be in flight at once
// whatever the registers; a stage is one chunk: kU 64-byte *segments* of each of the CTA's
// weight rows, and the same K columns of x. Lane (g = lane / 4, q = lane % 4) of a warp reads
// the 16 bytes at 16 q of each segment of weight row g of its n8 fragments: the B operands
// of several m16n8k16 steps with the K order permuted inside the segment (a dot product does
// not care); x, the A operand, is staged in the same permuted order, so a lane's A values are
// 8-byte shared loads:
//   16-bit W (32 K per segment): step s in {0, 1} takes K 8q + 4s + {0..3};
//   e4m3 W (64 K per segment):   step s in {0..3} takes K 16q + 4s + {0..3}.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "xla_kernels/cuda_mma.cuh"
#include "xla_kernels/gemm/fp8_convert.cuh"

namespace xla_kernels::gemm {

struct SkinnyParams {
  const void* x;        // [tokens, k] T
  const void* w;        // [n, k] T or e4m3
  const float* scale;   // e4m3 W: [n] per channel (bk == 0) or [ceil(n / bn), scale_cols]
  void* y;              // [tokens, n] T
  int64_t tokens, k, n;
  int64_t bn, bk, scale_cols;
  int chunks_per_split;  // the K split of a cluster rank: this many chunks
  int max_splits = 8;    // the largest cluster the scheduler may choose
};

constexpr int kSegmentBytes = 64;

// A tile of the skinny GEMM: kMf m16 fragments (16 kMf tokens per CTA), kNf n8 fragments
// per warp, kU segments per chunk (a stage), kWarps warps, a kStages-deep ring, and the CTAs
// per SM the registers are budgeted for.
template <int kMf_, int kNf_, int kU_, int kWarps_, int kStages_, int kMinBlocks_>
struct SkinnyTile {
  static constexpr int kMf = kMf_, kNf = kNf_, kU = kU_, kWarps = kWarps_;
  static constexpr int kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * kWarps;
};

// Compile-time shape of one instantiation. T: x's and y's dtype; W: T or uint8_t (e4m3).
template <typename T, typename W, typename Tile>
struct SkinnyShape : Tile {
  using Tile::kMf, Tile::kNf, Tile::kU, Tile::kWarps, Tile::kStages;
  static constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  static constexpr int kSegElems = kSegmentBytes / static_cast<int>(sizeof(W));
  static constexpr int kXSegBytes = kSegElems * 2;     // x bytes per token row per segment
  static constexpr int kXVecs = kXSegBytes / 64;       // x's 16-byte loads per lane per row
  static constexpr int kSteps = kSegElems / 16;        // m16n8k16 steps per segment
  static constexpr int kBM = 16 * kMf;
  static constexpr int kBN = kWarps * 8 * kNf;
  static constexpr int kChunkElems = kU * kSegElems;
  static constexpr int kWRowBytes = kU * kSegmentBytes;  // a weight row's bytes per stage
  static constexpr int kWStageBytes = kBN * kWRowBytes;
  static constexpr int kXStageBytes = kU * kBM * kXSegBytes;
  static constexpr int kStageBytes = kWStageBytes + kXStageBytes;
  static constexpr int kRedStride = kBN + 8;           // floats; the pad spreads banks
  static constexpr int kRedBytes = kBM * kRedStride * 4;
  static constexpr int kSmemBytes =
      kStages * kStageBytes > kRedBytes ? kStages * kStageBytes : kRedBytes;
};

__device__ __forceinline__ void CpAsync16Zfill(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// One warp's part of the mainloop: its 8 kNf weight rows over the chunks of its CTA's split.
template <typename T, typename W, typename Tile>
struct SkinnyMainloop {
  using S = SkinnyShape<T, W, Tile>;
  static constexpr int kMf = Tile::kMf, kNf = Tile::kNf, kU = Tile::kU;
  // e4m3 weights into bf16 MMAs: NaN bytes are tracked (f16's conversion keeps NaN itself).
  static constexpr bool kTrackNan = S::kFp8 && std::is_same_v<T, __nv_bfloat16>;
  const SkinnyParams& p;
  uint8_t* smem;
  int warp, lane, rows;  // rows: the CTA's tokens (<= kBM)
  int64_t t0, n0;        // first token and first weight row of the CTA
  int64_t row0;          // first weight row of the warp
  int k_bytes;           // bytes of a weight row (the host checks it fits an int)
  // This thread's weight copies: 16-byte column unit kJ of rows kR0 + i kRowStep.
  static constexpr int kUnitsPerRow = S::kWRowBytes / 16;
  static constexpr int kRowStep = S::kThreads / kUnitsPerRow;
  static_assert(S::kThreads % kUnitsPerRow == 0 && kRowStep % 2 == 0 && S::kBN % kRowStep == 0,
                "each thread copies one column unit of every kRowStep-th row");
  const uint8_t* w_src;  // row kR0's unit kJ of chunk 0
  int64_t w_stride;      // kRowStep rows
  int w_rows;            // rows kR0 + i kRowStep exist while i kRowStep < w_rows
  const uint8_t* x_src;  // x's first token of the CTA

  __device__ __forceinline__ SkinnyMainloop(const SkinnyParams& params, uint8_t* shared,
                                            int64_t first_token, int64_t first_row)
      : p(params), smem(shared), warp(threadIdx.x / 32), lane(threadIdx.x % 32),
        t0(first_token), n0(first_row), row0(first_row + (threadIdx.x / 32) * 8 * kNf) {
    const int64_t left = p.tokens - t0;
    rows = left < S::kBM ? static_cast<int>(left) : S::kBM;
    k_bytes = static_cast<int>(p.k * static_cast<int64_t>(sizeof(W)));
    const int r0 = threadIdx.x / kUnitsPerRow, j = threadIdx.x % kUnitsPerRow;
    w_src = static_cast<const uint8_t*>(p.w) + (n0 + r0) * k_bytes + 16 * j;
    w_stride = static_cast<int64_t>(kRowStep) * k_bytes;
    const int64_t rows_left = p.n - n0 - r0;
    w_rows = rows_left < S::kBN ? static_cast<int>(rows_left) : S::kBN;
    x_src = static_cast<const uint8_t*>(p.x) + t0 * p.k * 2;
  }

  // Where 16-byte unit j of stage row r lies. The 8 lanes of an LDS.128 phase read units
  // q = 0..3 of rows g and g + 1: 64-byte rows lie in 128 contiguous bytes already; longer
  // rows swap the two 64-byte halves of each 128 bytes in odd rows, so that the 8 lanes hit
  // 8 distinct bank groups.
  __device__ __forceinline__ static int WOffset(int r, int j) {
    constexpr int kSwap = S::kWRowBytes >= 128 ? 4 : 0;
    return r * S::kWRowBytes + ((j ^ (kSwap * (r & 1))) << 4);
  }

  // The CTA's copies of chunk c into a stage: the weight rows (zeros past the last row or
  // column), then x's columns as [u][token][kXSegBytes], 16-byte unit j of a row's segment
  // (K 8j..8j+7) at (j % kXVecs) * 64 + (j / kXVecs) * 16, so that lane q's units sit at
  // q * 16 in each 64-byte half. Offsets within a row or x are 32-bit; every index is a
  // compile-time shift of the thread's.
  __device__ __forceinline__ void IssueStage(int c, uint8_t* stage) const {
    const int r0 = threadIdx.x / kUnitsPerRow, j = threadIdx.x % kUnitsPerRow;
    const int byte = c * S::kWRowBytes;
    const bool col_ok = byte + 16 * j < k_bytes;
    const uint8_t* src = w_src + byte;
    uint8_t* dst = stage + WOffset(r0, j);  // rows r0 + i kRowStep share r0's parity
#pragma unroll
    for (int i = 0; i < S::kBN / kRowStep; ++i) {
      const bool valid = col_ok && i * kRowStep < w_rows;
      CpAsync16Zfill(dst + i * kRowStep * S::kWRowBytes, valid ? src : p.w, valid);
      src += w_stride;
    }
    constexpr int kXUnitsPerRow = S::kXSegBytes / 16;
    constexpr int kXUnits = kU * S::kBM * kXUnitsPerRow;
    const int k = static_cast<int>(p.k);
    uint8_t* xs = stage + S::kWStageBytes;
#pragma unroll
    for (int i = 0; i < (kXUnits + S::kThreads - 1) / S::kThreads; ++i) {
      const int e = threadIdx.x + i * S::kThreads;
      const int jx = e % kXUnitsPerRow, r = (e / kXUnitsPerRow) % S::kBM;
      const int u = e / (kXUnitsPerRow * S::kBM);
      const int col = (c * kU + u) * S::kSegElems + 8 * jx;
      if ((kXUnits % S::kThreads == 0 || e < kXUnits) && r < rows) {
        const bool valid = col < k;
        CpAsync16Zfill(xs + (u * S::kBM + r) * S::kXSegBytes + (jx % S::kXVecs) * 64 +
                           (jx / S::kXVecs) * 16,
                       x_src + (valid ? (r * k + col) * 2 : 0), valid);
      }
    }
  }

  // acc[m][f] += x(stage) * W(w) over the chunk's segments. kBlock: each segment's partial
  // sums times the segment's block scale (e4m3 W with bk a multiple of the segment).
  // nan_probe[f]: the NanProbe of every e4m3 word of fragment f this lane converted, ORed
  // (bf16 x only: the bit-move conversion turns NaN into 480; see PoisonNanRows).
  template <bool kBlock>
  __device__ __forceinline__ void Mma(const uint8_t* stage, int64_t c, float (&acc)[kMf][kNf][4],
                                      uint32_t (&nan_probe)[kNf]) const {
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint8_t* xs = stage + S::kWStageBytes + u * S::kBM * S::kXSegBytes;
      uint4 wu[kNf];
#pragma unroll
      for (int f = 0; f < kNf; ++f)
        wu[f] = *reinterpret_cast<const uint4*>(
            stage + WOffset(warp * 8 * kNf + 8 * f + g, (kSegmentBytes / 16) * u + q));
      if constexpr (kBlock) {
        float part[kMf][kNf][4];
#pragma unroll
        for (int m = 0; m < kMf; ++m)
#pragma unroll
          for (int f = 0; f < kNf; ++f)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[m][f][i] = 0.f;
        SegmentMma(xs, wu, part, nan_probe);
        const int64_t kb = (int64_t{c} * kU + u) * S::kSegElems / p.bk;
#pragma unroll
        for (int f = 0; f < kNf; ++f) {
          // The accumulator's columns 2q, 2q + 1 are weight rows of one block (bn % 8 == 0).
          const int64_t row = row0 + 8 * f + 2 * q;
          const float scale = row < p.n && kb < p.scale_cols
                                  ? __ldg(p.scale + (row / p.bn) * p.scale_cols + kb)
                                  : 0.f;
#pragma unroll
          for (int m = 0; m < kMf; ++m)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][f][i] = fmaf(part[m][f][i], scale, acc[m][f][i]);
        }
      } else {
        SegmentMma(xs, wu, acc, nan_probe);
      }
    }
  }

  // d[m][f] += one segment's MMAs: the staged x rows (xs: [token][kXSegBytes]) times the
  // warp's weight registers (w). Step s's A values of token row r are the 8 bytes at
  // 16 q + 8 s of the row's segment (e4m3 W: 64-byte half s / 2, 8 (s % 2)).
  __device__ __forceinline__ void SegmentMma(const uint8_t* xs, const uint4 (&w)[kNf],
                                             float (&d)[kMf][kNf][4],
                                             uint32_t (&nan_probe)[kNf]) const {
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int s = 0; s < S::kSteps; ++s) {
      uint32_t b[kNf][2];
#pragma unroll
      for (int f = 0; f < kNf; ++f) {
        const uint32_t ww[4] = {w[f].x, w[f].y, w[f].z, w[f].w};
        if constexpr (S::kFp8) {
          E4m3ToB16NanAs480<T>(ww[s], &b[f][0], &b[f][1]);
          if constexpr (kTrackNan) nan_probe[f] |= NanProbe(ww[s]);
        } else {
          b[f][0] = ww[2 * s];
          b[f][1] = ww[2 * s + 1];
        }
      }
      const int offset = (s / 2) * 64 + q * 16 + (s % 2) * 8;
#pragma unroll
      for (int m = 0; m < kMf; ++m) {
        if (16 * m < rows) {  // uniform across the CTA
          uint2 lo = make_uint2(0u, 0u), hi = make_uint2(0u, 0u);
          const int r = 16 * m + g;
          if (r < rows) lo = *reinterpret_cast<const uint2*>(xs + r * S::kXSegBytes + offset);
          if (r + 8 < rows)
            hi = *reinterpret_cast<const uint2*>(xs + (r + 8) * S::kXSegBytes + offset);
          const uint32_t a[4] = {lo.x, hi.x, lo.y, hi.y};
#pragma unroll
          for (int f = 0; f < kNf; ++f) cuda_mma::mma16816<T>(d[m][f], a, b[f][0], b[f][1]);
        }
      }
    }
  }

  // After the mainloop: the accumulator columns whose weight row held an e4m3 NaN become NaN
  // (as the dequantized product is). Lane (g, q) converted B words of row g of each fragment
  // and holds the sums of rows 2q and 2q + 1, so a ballot hands each row's flag over.
  __device__ __forceinline__ void PoisonNanRows(const uint32_t (&nan_probe)[kNf],
                                                float (&acc)[kMf][kNf][4]) const {
    if constexpr (kTrackNan) {
      const int q = lane % 4;
#pragma unroll
      for (int f = 0; f < kNf; ++f) {
        const unsigned nan_rows =
            __ballot_sync(0xffffffffu, (nan_probe[f] & kNanProbeBits) != 0u);
        if (nan_rows == 0u) continue;  // uniform across the warp
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if ((nan_rows >> (4 * (2 * q + h))) & 0xfu)
#pragma unroll
            for (int m = 0; m < kMf; ++m) acc[m][f][h] = acc[m][f][2 + h] = nanf("");
      }
    }
  }
};

}  // namespace xla_kernels::gemm
