// ragged_paged_attention's bf16/f16 kernel for any CUDA card (mma.sync m16n8k16), fp8
// caches through converted staging tiles; the Hopper prefill kernel replaces it where it
// can run (ragged_paged_attention_sm90.cuh).
#pragma once

#include "ragged_common.cuh"

namespace xla_kernels::ragged_paged_attention {
namespace detail {

// Shared memory: Q, then kStages (K, V) tile pairs of T (bf16/f16 caches); with fp8 caches
// (kFp8) Q, one converted (K, V) pair of T, then kStages raw (K, V) pairs of e4m3 bytes.
template <typename T, int D, bool kFp8 = false>
struct MmaConfig {
  static constexpr int RW = static_cast<int>(kRowsPerWarpMma);  // packed rows per warp (16)
  static constexpr int BM = kW * RW;                            // packed rows per CTA
  static constexpr int RS = D + 8;                              // +16 bytes: conflict-free ldmatrix
  static constexpr int kStages = 2;
  static constexpr int kQElems = BM * RS;
  static constexpr int kTileElems = NK * RS;
  static constexpr int kRawTileBytes = NK * D;  // fp8: a raw e4m3 tile, rows of D bytes
  static constexpr int kBytes =
      kFp8 ? (kQElems + 2 * kTileElems) * static_cast<int>(sizeof(T)) +
                 kStages * 2 * kRawTileBytes
           : (kQElems + kStages * 2 * kTileElems) * static_cast<int>(sizeof(T));
};

// fp8: 16 e4m3 values (16 bytes of shared memory) -> 16 T values at dst (32 bytes). Exact.
template <typename T>
__device__ __forceinline__ void e4m3x16_to(T* dst, const uint8_t* src) {
  using ::xla_kernels::paged_attention::detail::e4m3x2_to;
  const uint4 x = *reinterpret_cast<const uint4*>(src);
  const uint4 lo = make_uint4(e4m3x2_to<T>(x.x), e4m3x2_to<T>(x.x >> 16), e4m3x2_to<T>(x.y),
                              e4m3x2_to<T>(x.y >> 16));
  const uint4 hi = make_uint4(e4m3x2_to<T>(x.z), e4m3x2_to<T>(x.z >> 16), e4m3x2_to<T>(x.w),
                              e4m3x2_to<T>(x.w >> 16));
  *reinterpret_cast<uint4*>(dst) = lo;
  *reinterpret_cast<uint4*>(dst + 8) = hi;
}

// fp8: a staged raw (K, V) tile pair (NK rows of D bytes each) -> the padded T pair (rows RS
// elements apart) that the MMA loop reads. All threads of the CTA take part; zero-filled
// (masked) rows convert to zeros.
template <typename T, int D, int RS>
__device__ __forceinline__ void convert_kv_tile(T* ks, T* vs, const uint8_t* kr,
                                                const uint8_t* vr, int tid) {
  constexpr int kCpr = D / 16;  // 16-byte e4m3 chunks per row
  constexpr int kChunks = NK * kCpr;
  static_assert(kChunks % kThreads == 0, "a tile's chunks do not split over the CTA");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kCpr, col = (c % kCpr) * 16;
    e4m3x16_to<T>(ks + r * RS + col, kr + r * D + col);
    e4m3x16_to<T>(vs + r * RS + col, vr + r * D + col);
  }
}

template <typename T, int D, bool kFp8 = false>
__global__ void __launch_bounds__(kThreads) ragged_mma_kernel(const Args a) {
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  using C = MmaConfig<T, D, kFp8>;
  constexpr int RW = C::RW, BM = C::BM, RS = C::RS, KT = D / 16, DT = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Work work;
  __shared__ int tok_ok[C::kStages][NK];
  T* qs = reinterpret_cast<T*>(smem);
  // bf16/f16: stage st has K at tile 2*st, V at 2*st + 1. fp8: K at tile 0, V at tile 1
  // (converted), raw stage st at raw + 2*st*kRawTileBytes (K), + kRawTileBytes (V).
  T* kv_base = qs + C::kQElems;
  uint8_t* raw = reinterpret_cast<uint8_t*>(kv_base + 2 * C::kTileElems);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y;
  if (warp == 0) find_work(a, blockIdx.x, BM, &work, lane);
  __syncthreads();
  const Work w = work;
  if (w.s < 0) return;  // uniform over the CTA

  const TileRows tr = tile_rows(a, w, BM);
  int lo, hi;
  token_range(a, tr, tr.r0, tr.r_end, &lo, &hi);
  const int ntiles = hi > lo ? (hi - lo + NK - 1) / NK : 0;

  if (ntiles > 0) {
    if constexpr (kFp8) {
      load_kv_tile<uint8_t, D, D>(raw, raw + C::kRawTileBytes, tok_ok[0], a, w.s, kvh, lo, lo,
                                  hi, tid);
    } else {
      load_kv_tile<T, D, RS>(kv_base, kv_base + C::kTileElems, tok_ok[0], a, w.s, kvh, lo, lo,
                             hi, tid);
    }
  }
  cp_async_commit();
  stage_q<T, T, D, RS, BM>(qs, a, w, tr, kvh, tid);

  // This warp's rows and token range.
  const int wr0 = tr.r0 + warp * RW;
  const bool live = wr0 < tr.r_end;
  int wlo = 0, whi = 0;
  if (live) token_range(a, tr, wr0, min(tr.r_end, wr0 + RW), &wlo, &whi);
  const int g0 = lane >> 2, tig = lane & 3, mtx = lane >> 3, r8 = lane & 7;
  int pos0, lo0, pos1, lo1;
  row_range(a, tr, wr0 + g0, &pos0, &lo0);
  row_range(a, tr, wr0 + g0 + 8, &pos1, &lo1);

  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    // Prefetch the next tile into the other stage (last read in iteration it - 1, which
    // ended with a barrier).
    if (it + 1 < ntiles) {
      if constexpr (kFp8) {
        uint8_t* kn = raw + 2 * ((it + 1) & 1) * C::kRawTileBytes;
        load_kv_tile<uint8_t, D, D>(kn, kn + C::kRawTileBytes, tok_ok[(it + 1) & 1], a, w.s,
                                    kvh, lo + (it + 1) * NK, lo, hi, tid);
      } else {
        T* kn = kv_base + 2 * ((it + 1) & 1) * C::kTileElems;
        load_kv_tile<T, D, RS>(kn, kn + C::kTileElems, tok_ok[(it + 1) & 1], a, w.s, kvh,
                               lo + (it + 1) * NK, lo, hi, tid);
      }
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int st = it & 1;
    const int t0 = lo + it * NK;
    if constexpr (kFp8) {
      // The converted pair was last read in iteration it - 1 (which ended with a barrier);
      // this raw stage is overwritten by the prefetch of iteration it + 1, after the barrier
      // that ends this one.
      const uint8_t* kr = raw + 2 * st * C::kRawTileBytes;
      convert_kv_tile<T, D, RS>(kv_base, kv_base + C::kTileElems, kr, kr + C::kRawTileBytes,
                                tid);
      __syncthreads();
    }
    if (live && t0 < whi && t0 + NK > wlo) {
      const T* ks = kv_base + (kFp8 ? 0 : 2 * st * C::kTileElems);
      const T* vs = ks + C::kTileElems;
      // S = Q K^T: rows = this warp's 16 packed rows, columns = the tile's 32 tokens.
      float sc[NK / 8][4];
#pragma unroll
      for (int i = 0; i < NK / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        uint32_t af[4];
        ldsm_x4(af, qs + (warp * RW + (mtx & 1) * 8 + r8) * RS + kk * 16 + (mtx >> 1) * 8);
#pragma unroll
        for (int j = 0; j < NK / 16; ++j) {
          uint32_t b[4];
          ldsm_x4(b, ks + (j * 16 + (mtx >> 1) * 8 + r8) * RS + kk * 16 + (mtx & 1) * 8);
          mma16816<T>(sc[2 * j], af, b[0], b[1]);
          mma16816<T>(sc[2 * j + 1], af, b[2], b[3]);
        }
      }
      // Logits and mask: accumulator (i, e) is row g0 (e < 2) or g0 + 8 (e >= 2), token
      // column i * 8 + tig * 2 + (e & 1).
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int i = 0; i < NK / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = i * 8 + tig * 2 + e;
          const int t = t0 + col;
          const bool ok = tok_ok[st][col] != 0;
          sc[i][e] = (ok && t <= pos0 && t >= lo0) ? logit(sc[i][e], a) : -INFINITY;
          sc[i][e + 2] = (ok && t <= pos1 && t >= lo1) ? logit(sc[i][e + 2], a) : -INFINITY;
          mx0 = fmaxf(mx0, sc[i][e]);
          mx1 = fmaxf(mx1, sc[i][e + 2]);
        }
      }
      // A row's 32 columns live in the 4 lanes of its quad.
      mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float b0 = safe_max(mn0), b1 = safe_max(mn1);
      const float al0 = exp2f(m0 - b0), al1 = exp2f(m1 - b1);
      m0 = mn0;
      m1 = mn1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int i = 0; i < NK / 8; ++i) {
        sc[i][0] = exp2f(sc[i][0] - b0);
        sc[i][1] = exp2f(sc[i][1] - b0);
        sc[i][2] = exp2f(sc[i][2] - b1);
        sc[i][3] = exp2f(sc[i][3] - b1);
        rs0 += sc[i][0] + sc[i][1];
        rs1 += sc[i][2] + sc[i][3];
      }
      l0 = l0 * al0 + rs0;  // per-lane partial sums; the quad is summed at the end
      l1 = l1 * al1 + rs1;
#pragma unroll
      for (int i = 0; i < DT; ++i) {
        o[i][0] *= al0;
        o[i][1] *= al0;
        o[i][2] *= al1;
        o[i][3] *= al1;
      }
      // O += P V: P (A operand, 16 rows x 16 tokens per k-step) from the S accumulators.
#pragma unroll
      for (int j = 0; j < NK / 16; ++j) {
        uint32_t pa[4];
        accumulators_to_a<T>(sc[2 * j], sc[2 * j + 1], pa);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldsm_x4_trans(b, vs + (j * 16 + (mtx & 1) * 8 + r8) * RS + dp * 16 + (mtx >> 1) * 8);
          mma16816<T>(o[2 * dp], pa, b[0], b[1]);
          mma16816<T>(o[2 * dp + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the stage is overwritten by the prefetch of iteration it + 1
  }
  cp_async_wait<0>();

  if (!live) return;
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  if constexpr (kFp8) {  // v_scale
    inv0 *= a.out_scale;
    inv1 *= a.out_scale;
  }
  const int pr0 = wr0 + g0, pr1 = wr0 + g0 + 8;
  T* out = static_cast<T*>(a.out);
  if (pr0 < tr.r_end) {
    uint32_t* o32 = reinterpret_cast<uint32_t*>(out + out_offset(a, w, kvh, pr0, D));
#pragma unroll
    for (int i = 0; i < DT; ++i) o32[(i * 8 + tig * 2) / 2] = pack2<T>(o[i][0] * inv0, o[i][1] * inv0);
  }
  if (pr1 < tr.r_end) {
    uint32_t* o32 = reinterpret_cast<uint32_t*>(out + out_offset(a, w, kvh, pr1, D));
#pragma unroll
    for (int i = 0; i < DT; ++i) o32[(i * 8 + tig * 2) / 2] = pack2<T>(o[i][2] * inv1, o[i][3] * inv1);
  }
}

}  // namespace detail
}  // namespace xla_kernels::ragged_paged_attention
