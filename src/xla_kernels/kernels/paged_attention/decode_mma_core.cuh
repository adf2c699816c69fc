// paged_attention's bf16/f16 core: mma.sync m16n8k16 with the q heads on the MMA rows.
#pragma once

#include "decode_softmax.cuh"
#include "decode_tile_loader.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

// bf16/f16: mma.sync m16n8k16; up to 16 q heads per CTA (rows of the MMA).
template <typename T, int D>
struct MmaCore {
  using Cache = T;                             // staging (cache) element type
  static constexpr int GC = 16;                // q heads per CTA
  static constexpr int kMaxCtasPerSm = 0;      // no cap: as many as fit
  static constexpr int NW = mma_tile_tokens(D);  // tokens per warp tile
  static constexpr int kStages = kMmaStages;
  // K/V rows unpadded, 16-byte chunks swizzled (swz_chunk): conflict-free ldmatrix, and
  // every row starts on a 128-byte line of shared memory. (Rows padded to D + 8 elements
  // made the cp.async of a row straddle shared-memory lines, and the hardware then asked
  // L2 for 1.5x the row's sectors; the design notes.)
  static constexpr bool kSwizzle = true;
  static constexpr int RS = D;
  static constexpr int QRS = D + 8;            // Q rows in shared memory (padded)
  static constexpr bool kQRegs = D <= 128;     // Q fragments kept in registers
  static constexpr int KT = D / 16;            // k-steps of S = Q K^T
  static constexpr int NT = NW / 8;            // n-tiles of S (8 tokens each)
  static constexpr int DT = D / 8;             // n-tiles of O (8 dims each)
  static constexpr int kExtraBytes = GC * QRS * static_cast<int>(sizeof(T));  // Q in smem

  // Element offset of 8-element (16-byte) chunk q of row r of a staged K/V tile.
  __device__ __forceinline__ static int tile_off(int r, int q) {
    return r * RS + swz_chunk<D / 8>(q, r) * 8;
  }

  uint32_t qf[kQRegs ? KT : 1][4];
  float o[DT][4];
  float m[2], l[2];
  const T* qsm;
  int lane;

  // Cooperative (whole CTA) copy of the chunk's query rows into shared memory; rows >= nh are 0.
  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    constexpr int kCpr = D / kVec;
    T* q = reinterpret_cast<T*>(extra);
    for (int c = tid; c < GC * kCpr; c += kThreads) {
      const int r = c / kCpr, col = (c % kCpr) * kVec;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < nh) v = *reinterpret_cast<const uint4*>(qg + static_cast<int64_t>(r) * D + col);
      *reinterpret_cast<uint4*>(q + r * QRS + col) = v;
    }
  }

  __device__ __forceinline__ const T* q_addr(int kk) const {
    const int mtx = lane >> 3, r = lane & 7;
    return qsm + ((mtx & 1) * 8 + r) * QRS + kk * 16 + (mtx >> 1) * 8;
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    (void)warp;
    qsm = reinterpret_cast<const T*>(extra);
    lane = lane_;
    if constexpr (kQRegs) {
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) ldsm_x4(qf[kk], q_addr(kk));
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  __device__ __forceinline__ void step(const T* ks, const T* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int mtx = lane >> 3, r8 = lane & 7, tig = lane & 3;
    // S[head][token] = Q K^T; K tile rows are the MMA's n (tokens), d is k.
    float sc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t af[4];
      if constexpr (kQRegs) {
        af[0] = qf[kk][0];
        af[1] = qf[kk][1];
        af[2] = qf[kk][2];
        af[3] = qf[kk][3];
      } else {
        ldsm_x4(af, q_addr(kk));
      }
#pragma unroll
      for (int j = 0; j < NW / 16; ++j) {
        uint32_t b[4];
        ldsm_x4(b, ks + tile_off(j * 16 + (mtx >> 1) * 8 + r8, kk * 2 + (mtx & 1)));
        mma16816<T>(sc[2 * j], af, b[0], b[1]);
        mma16816<T>(sc[2 * j + 1], af, b[2], b[3]);
      }
    }
    online_softmax(sc, mask, m, l, o, tig, a);
    // O += P V: P (A operand) comes from the S accumulators, V via ldmatrix.trans.
#pragma unroll
    for (int j = 0; j < NW / 16; ++j) {
      uint32_t pa[4];
      accumulators_to_a<T>(sc[2 * j], sc[2 * j + 1], pa);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, vs + tile_off(j * 16 + (mtx & 1) * 8 + r8, dp * 2 + (mtx >> 1)));
        mma16816<T>(o[2 * dp], pa, b[0], b[1]);
        mma16816<T>(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
  }

  // This warp's unnormalized O rows, m and l (rows < nh) -> shared memory.
  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
    store_row_stats(m, l, ml, nh, lane);
    const int g0 = lane >> 2, g1 = g0 + 8, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      const int d = i * 8 + tig * 2;
      if (g0 < nh) *reinterpret_cast<float2*>(ow + g0 * D + d) = make_float2(o[i][0], o[i][1]);
      if (g1 < nh) *reinterpret_cast<float2*>(ow + g1 * D + d) = make_float2(o[i][2], o[i][3]);
    }
  }
};

}  // namespace detail
}  // namespace xla_kernels::paged_attention
