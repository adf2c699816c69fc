// paged_attention's fp8-cache cores: e4m3 K/V converted in registers for mma.sync, q heads
// on the MMA rows (Fp8MmaCore) or, at up to 8 q heads per kv head, tokens (Fp8MmaCoreT).
#pragma once

#include "decode_softmax.cuh"
#include "decode_tile_loader.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

// The power of two 2^e that brings the largest finite |q| of a row (`amax`) into [2^14,
// 2^15): f16's largest finite value is 65504, so no scaled element overflows, and e is kept
// in [-126, 126] so that 2^e and 2^-e are normal floats (an all-zero row gets 2^126).
__device__ __forceinline__ float q_row_scale(float amax) {
  const int biased = (__float_as_int(amax) >> 23) & 0xff;  // amax in [2^(b-127), 2^(b-126))
  int e = 15 - (biased - 126);
  e = e < -126 ? -126 : (e > 126 ? 126 : e);
  return __int_as_float((127 + e) << 23);
}

// Two e4m3 values (low byte first) -> the MMA operand register of T (f16x2 or bf16x2). Exact:
// every e4m3fn value is a normal f16 (or zero, or NaN) and fits bf16's 8 significant bits.
template <typename T>
__device__ __forceinline__ uint32_t e4m3x2_to(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  } else {
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// Both e4m3 pairs of a 32-bit word -> two f16x2 registers (the low pair in lo). On sm_89+
// one cvt reads each 16-bit half of the word in place, so the high pair needs no shift.
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
#else
  lo = e4m3x2_to<__half>(word);
  hi = e4m3x2_to<__half>(word >> 16);
#endif
}

// The query rows of an fp8 core (GC rows from qg, rows >= nh zero) -> f16 in shared memory,
// head-dim permuted and fragment-ordered ([kk][row][tig][4]: lane tig's 4 values of k-step
// kk, see Fp8MmaCore), then with bf16 queries each row's scale (q_row_scale) after the GC
// rows. Called by every thread of the CTA; with bf16 queries it synchronizes them.
template <typename T, int D, int GC>
__device__ __forceinline__ void stage_q_fp8(const T* qg, int nh, unsigned char* extra, int tid) {
  using M = __half;
  constexpr bool kQScaled = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kSeg = D / 4;
  constexpr int kQBytes = GC * D * static_cast<int>(sizeof(M));
  M* q = reinterpret_cast<M*>(extra);
  float* row_scale = reinterpret_cast<float*>(extra + kQBytes);
  if constexpr (kQScaled) {
    // One warp per row: the largest finite |q| -> the row's scale.
    for (int r = tid >> 5; r < GC; r += kWarps) {
      float amax = 0.f;
      if (r < nh) {
        for (int d = tid & 31; d < D; d += 32) {
          const float x = fabsf(static_cast<float>(qg[static_cast<int64_t>(r) * D + d]));
          if (x <= FLT_MAX) amax = fmaxf(amax, x);  // skips inf and NaN
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
      }
      if ((tid & 31) == 0) row_scale[r] = q_row_scale(amax);
    }
    __syncthreads();
  }
  for (int c = tid; c < GC * D / 4; c += kThreads) {
    const int r = c / (D / 4), col = (c % (D / 4)) * 4;
    const int tig = col / kSeg, kk = (col % kSeg) / 4;
    uint2 v = make_uint2(0, 0);
    if (r < nh) v = *reinterpret_cast<const uint2*>(qg + static_cast<int64_t>(r) * D + col);
    if constexpr (kQScaled) {
      // 4 bf16 -> f32 (exact), times 2^e (exact), -> f16 (exact unless subnormal).
      const float sc = row_scale[r];
      const __half2 lo = __floats2half2_rn(__uint_as_float(v.x << 16) * sc,
                                           __uint_as_float(v.x & 0xffff0000u) * sc);
      const __half2 hi = __floats2half2_rn(__uint_as_float(v.y << 16) * sc,
                                           __uint_as_float(v.y & 0xffff0000u) * sc);
      v = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                     *reinterpret_cast<const uint32_t*>(&hi));
    }
    *reinterpret_cast<uint2*>(q + ((kk * GC + r) * 4 + tig) * 4) = v;
  }
}

// f8e4m3fn caches, bf16/f16 queries: mma.sync m16n8k16 on K/V converted in registers. Tiles
// of fp8_tile_tokens(D) tokens; rows of D bytes, chunks swizzled (swz_chunk), no padding.
//
// Every MMA runs in f16, for bf16 queries too: e4m3 -> f16 is exact and one cvt per pair of
// values (e4m3x4_to_f16x2 converts both pairs of a 32-bit word in place), where e4m3 -> bf16
// costs three more instructions per pair (f16 -> 2 x f32 -> bf16x2: 512 of the 1631 loop
// instructions of a d 128 tile in the SASS; fp8 decode 1.46x -> 1.81x the bf16 kernel at
// d 256, the design notes). bf16 query rows are staged as f16 times a power of two per row
// (q_row_scale), exact for every element at least 2^-28 times the row's largest |q|
// (smaller ones fall into f16's subnormals), and S is scaled back (exactly) before the
// softmax; P in [0, 1] is rounded to f16 rather than bf16 (3 more bits).
//  * S = Q K^T: the k index (head dim) is permuted so that lane (r8 = lane/4, tig = lane%4)
//    finds the 4 values of its B fragment (k = 2tig, 2tig+1, 2tig+8, 2tig+9) of k-step kk at
//    bytes tig*D/4 + 4kk .. +3 of its K row: 16-byte loads, one cvt per register. Q is
//    staged in the same permutation, fragment-ordered ([kk][head][tig][4]).
//  * O += P V: output column n of n-tile i is head dim (i/4)*32 + 4n + i%4, so a lane's
//    B fragments of 4 n-tiles are 4 adjacent bytes of each of its 4 token rows; a byte
//    permute pairs tokens (2tig, 2tig+1) and (2tig+8, 2tig+9). The epilogue un-permutes.
template <typename T, int D>
struct Fp8MmaCore {
  using Cache = uint8_t;
  using M = __half;                            // MMA operand type
  static constexpr bool kQScaled = std::is_same_v<T, __nv_bfloat16>;  // bf16 q as scaled f16
  static_assert(kQScaled || std::is_same_v<T, __half>, "bf16 or f16 queries");
  static constexpr bool kSwizzle = true;
  static constexpr int GC = 16;
  static constexpr int kMaxCtasPerSm = 0;  // no cap: as many as fit
  static constexpr int NW = fp8_tile_tokens(D);
  static_assert(NW == 16 || NW == 32, "fp8 warp tiles of 16 or 32 tokens");
  static constexpr int kStages = kFp8Stages;
  static_assert(kStages >= 2, "the tile loop needs at least 2 stages");
  static constexpr int RS = D;                 // bytes per staged row
  static constexpr int kCpr = D / 16;          // 16-byte chunks per row
  static constexpr bool kQRegs = D <= 128;
  static constexpr int KT = D / 16;
  static constexpr int NT = NW / 8;
  static constexpr int DT = D / 8;
  static constexpr int kSeg = D / 4;           // bytes of a K row one lane reads
  static constexpr int kQBytes = GC * D * static_cast<int>(sizeof(M));
  // The staged (permuted) query, then with kQScaled each row's scale (q_row_scale).
  static constexpr int kExtraBytes = kQBytes + (kQScaled ? GC * 4 : 0);

  uint32_t qf[kQRegs ? KT : 1][4];
  float o[DT][4];
  float m[2], l[2];
  float qinv[2];  // kQScaled: 1 / the scales of rows g0 and g0 + 8
  const M* qsm;
  int lane;

  // Called by every thread of the CTA (with kQScaled it synchronizes them).
  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    stage_q_fp8<T, D, GC>(qg, nh, extra, tid);
  }

  __device__ __forceinline__ void q_frag(uint32_t (&af)[4], int kk) const {
    const int g0 = lane >> 2, tig = lane & 3;
    const uint2 lo = *reinterpret_cast<const uint2*>(qsm + ((kk * GC + g0) * 4 + tig) * 4);
    const uint2 hi = *reinterpret_cast<const uint2*>(qsm + ((kk * GC + g0 + 8) * 4 + tig) * 4);
    af[0] = lo.x;
    af[1] = hi.x;
    af[2] = lo.y;
    af[3] = hi.y;
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    (void)warp;
    qsm = reinterpret_cast<const M*>(extra);
    lane = lane_;
    if constexpr (kQScaled) {
      const float* row_scale = reinterpret_cast<const float*>(extra + kQBytes);
      qinv[0] = 1.f / row_scale[lane >> 2];  // exact: powers of two
      qinv[1] = 1.f / row_scale[(lane >> 2) + 8];
    }
    if constexpr (kQRegs) {
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) q_frag(qf[kk], kk);
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  __device__ __forceinline__ void step(const uint8_t* ks, const uint8_t* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int r8 = lane >> 2, tig = lane & 3;
    float sc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
    // S = Q K^T, one 16-byte chunk (4 k-steps) of every n-tile's K row at a time.
#pragma unroll
    for (int c = 0; c < kSeg / 16; ++c) {
      uint4 kw[NT];
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const int row = i * 8 + r8;
        kw[i] = *reinterpret_cast<const uint4*>(
            ks + row * RS + swz_chunk<kCpr>(tig * (kSeg / 16) + c, row) * 16);
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int kk = c * 4 + w;
        uint32_t af[4];
        if constexpr (kQRegs) {
          af[0] = qf[kk][0];
          af[1] = qf[kk][1];
          af[2] = qf[kk][2];
          af[3] = qf[kk][3];
        } else {
          q_frag(af, kk);
        }
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          const uint32_t word = w == 0 ? kw[i].x : w == 1 ? kw[i].y : w == 2 ? kw[i].z : kw[i].w;
          uint32_t b0, b1;
          e4m3x4_to_f16x2(word, b0, b1);
          mma16816<M>(sc[i], af, b0, b1);
        }
      }
    }
    if constexpr (kQScaled) {  // back to Q K^T (exact: powers of two)
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        sc[i][0] *= qinv[0];
        sc[i][1] *= qinv[0];
        sc[i][2] *= qinv[1];
        sc[i][3] *= qinv[1];
      }
    }
    online_softmax(sc, mask, m, l, o, tig, a);
    // O += P V.
#pragma unroll
    for (int j = 0; j < NW / 16; ++j) {
      uint32_t pa[4];
      accumulators_to_a<M>(sc[2 * j], sc[2 * j + 1], pa);
      const int row0 = j * 16 + 2 * tig;
      const int rows[4] = {row0, row0 + 1, row0 + 8, row0 + 9};
#pragma unroll
      for (int i4 = 0; i4 < DT / 4; ++i4) {
        const int q = 2 * i4 + (r8 >> 2), within = (r8 & 3) * 4;
        uint32_t w[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          w[x] = *reinterpret_cast<const uint32_t*>(
              vs + rows[x] * RS + swz_chunk<kCpr>(q, rows[x]) * 16 + within);
        }
        const uint32_t lo0 = __byte_perm(w[0], w[1], 0x5140), hi0 = __byte_perm(w[0], w[1], 0x7362);
        const uint32_t lo8 = __byte_perm(w[2], w[3], 0x5140), hi8 = __byte_perm(w[2], w[3], 0x7362);
        uint32_t b[4][2];  // B operands: tokens (row0, row0 + 1) in [x][0], (+8, +9) in [x][1]
        e4m3x4_to_f16x2(lo0, b[0][0], b[1][0]);
        e4m3x4_to_f16x2(lo8, b[0][1], b[1][1]);
        e4m3x4_to_f16x2(hi0, b[2][0], b[3][0]);
        e4m3x4_to_f16x2(hi8, b[2][1], b[3][1]);
#pragma unroll
        for (int x = 0; x < 4; ++x) mma16816<M>(o[4 * i4 + x], pa, b[x][0], b[x][1]);
      }
    }
  }

  // As MmaCore::store, undoing the output-column permutation.
  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
    store_row_stats(m, l, ml, nh, lane);
    const int g0 = lane >> 2, g1 = g0 + 8, tig = lane & 3;
#pragma unroll
    for (int i4 = 0; i4 < DT / 4; ++i4) {
      const int d = i4 * 32 + 8 * tig;  // columns 2tig (d .. d+3) and 2tig+1 (d+4 .. d+7)
      const float(&x)[4] = o[4 * i4];
      const float(&y)[4] = o[4 * i4 + 1];
      const float(&z)[4] = o[4 * i4 + 2];
      const float(&u)[4] = o[4 * i4 + 3];
      if (g0 < nh) {
        *reinterpret_cast<float4*>(ow + g0 * D + d) = make_float4(x[0], y[0], z[0], u[0]);
        *reinterpret_cast<float4*>(ow + g0 * D + d + 4) = make_float4(x[1], y[1], z[1], u[1]);
      }
      if (g1 < nh) {
        *reinterpret_cast<float4*>(ow + g1 * D + d) = make_float4(x[2], y[2], z[2], u[2]);
        *reinterpret_cast<float4*>(ow + g1 * D + d + 4) = make_float4(x[3], y[3], z[3], u[3]);
      }
    }
  }
};

// f8e4m3fn caches at up to 8 q heads per kv head (GQA up to 8, and MHA): Fp8MmaCore's math
// with the MMA operands swapped, S^T = K Q^T and O^T = V^T P^T, so that a warp tile's tokens
// (and the head dims) fill the MMA's 16 rows and the CTA's 8 q heads its 8 columns. With
// the heads on the rows (Fp8MmaCore) at least half of every MMA computes rows that are not
// there (12 of 16 at GQA 4); here half as many MMAs do the same work, the softmax handles 8
// values per lane instead of 16, and O takes half the registers. The conversions (one cvt
// per two e4m3 values) and the shared-memory reads are the same as Fp8MmaCore's.
//  * S^T = K Q^T: the head dim is permuted as in Fp8MmaCore (Q staged by stage_q_fp8 with 8
//    rows); lane (g = lane/4, tig = lane%4) reads its A fragments of k-step kk from bytes
//    tig*D/4 + 4kk .. +3 of token rows g and g + 8 of each 16-token m-tile, and its B
//    fragment (Q) from registers.
//  * The softmax runs per column (head): a lane holds heads 2tig and 2tig + 1 of its tokens,
//    reduced over the 8 lanes of a column (shuffles over lane bits 2-4).
//  * P^T as B: the two f16-packed accumulator halves of an m-tile, transposed by movmatrix,
//    are the B fragments of one P V k-step.
//  * O^T += V^T P^T: A row r of head-dim m-tile 4i + x is head dim 4 (16i + r) + x (r < 8 for
//    lane rows g, r >= 8 for g + 8), so a lane's A fragments of 4 m-tiles are 4 adjacent
//    bytes of each of its 4 token rows (2tig, 2tig + 1, 2tig + 8, 2tig + 9), paired by a byte
//    permute as in Fp8MmaCore. The epilogue un-permutes.
template <typename T, int D>
struct Fp8MmaCoreT {
  using Cache = uint8_t;
  using M = __half;  // MMA operand type
  static constexpr bool kQScaled = std::is_same_v<T, __nv_bfloat16>;  // bf16 q as scaled f16
  static_assert(kQScaled || std::is_same_v<T, __half>, "bf16 or f16 queries");
  static constexpr bool kSwizzle = true;
  static constexpr int GC = kFp8TokensOnRowsMaxHeads;
  static constexpr int kMaxCtasPerSm = fp8_tokens_on_rows_max_ctas(D);
  static constexpr int NW = Fp8MmaCore<T, D>::NW;
  static constexpr int kStages = Fp8MmaCore<T, D>::kStages;
  static constexpr int RS = D;         // bytes per staged row
  static constexpr int kCpr = D / 16;  // 16-byte chunks per row
  static constexpr int KT = D / 16;    // k-steps of S^T (head dim)
  static constexpr int MT = NW / 16;   // token m-tiles of S^T (k-steps of O^T)
  static constexpr int DT = D / 16;    // head-dim m-tiles of O^T
  static constexpr int kSeg = D / 4;   // bytes of a K row one lane reads
  static constexpr int kQBytes = GC * D * static_cast<int>(sizeof(M));
  static constexpr int kExtraBytes = kQBytes + (kQScaled ? GC * 4 : 0);
  static_assert(DT % 4 == 0, "head-dim m-tiles in groups of 4");

  uint32_t qf[KT][2];  // B fragments of Q (head g) per k-step
  float o[DT][4];      // O^T: rows g / g + 8 of each m-tile, columns (heads) 2tig, 2tig + 1
  float m[2], l[2];    // heads 2tig and 2tig + 1 (l: this lane's tokens only)
  float qinv[2];       // kQScaled: 1 / the scales of heads 2tig and 2tig + 1
  int lane;

  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    stage_q_fp8<T, D, GC>(qg, nh, extra, tid);
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    (void)warp;
    lane = lane_;
    const int g = lane >> 2, tig = lane & 3;
    if constexpr (kQScaled) {
      const float* row_scale = reinterpret_cast<const float*>(extra + kQBytes);
      qinv[0] = 1.f / row_scale[2 * tig];  // exact: powers of two
      qinv[1] = 1.f / row_scale[2 * tig + 1];
    }
    const M* qsm = reinterpret_cast<const M*>(extra);
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      const uint2 q = *reinterpret_cast<const uint2*>(qsm + ((kk * GC + g) * 4 + tig) * 4);
      qf[kk][0] = q.x;  // k = 2tig, 2tig + 1
      qf[kk][1] = q.y;  // k = 2tig + 8, 2tig + 9
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  __device__ __forceinline__ void step(const uint8_t* ks, const uint8_t* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int g = lane >> 2, tig = lane & 3;
    float sc[MT][4];  // S^T: tokens 16 i + g (0, 1) and + 8 (2, 3); heads 2tig (0, 2), + 1
#pragma unroll
    for (int i = 0; i < MT; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
    // S^T = K Q^T, one 16-byte chunk (4 k-steps) of the lane's two K rows per m-tile at a time.
#pragma unroll
    for (int c = 0; c < kSeg / 16; ++c) {
      uint4 kw[MT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = i * 16 + h * 8 + g;
          kw[i][h] = *reinterpret_cast<const uint4*>(
              ks + row * RS + swz_chunk<kCpr>(tig * (kSeg / 16) + c, row) * 16);
        }
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int kk = c * 4 + w;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          auto word = [&](const uint4& x) {
            return w == 0 ? x.x : w == 1 ? x.y : w == 2 ? x.z : x.w;
          };
          uint32_t af[4];
          e4m3x4_to_f16x2(word(kw[i][0]), af[0], af[2]);
          e4m3x4_to_f16x2(word(kw[i][1]), af[1], af[3]);
          mma16816<M>(sc[i], af, qf[kk][0], qf[kk][1]);
        }
      }
    }
    if constexpr (kQScaled) {  // back to K Q^T (exact: powers of two)
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        sc[i][0] *= qinv[0];
        sc[i][1] *= qinv[1];
        sc[i][2] *= qinv[0];
        sc[i][3] *= qinv[1];
      }
    }
    softmax(sc, mask, a);
    // O^T += V^T P^T, one token k-step (m-tile i of S^T) at a time.
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const uint32_t pb0 = movmatrix_trans(pack2<M>(sc[i][0], sc[i][1]));  // tokens 2tig, +1
      const uint32_t pb1 = movmatrix_trans(pack2<M>(sc[i][2], sc[i][3]));  // tokens 2tig + 8, +9
      const int row0 = i * 16 + 2 * tig;
      const int rows[4] = {row0, row0 + 1, row0 + 8, row0 + 9};
#pragma unroll
      for (int i4 = 0; i4 < DT / 4; ++i4) {
        uint32_t af[4][4];  // A fragments of m-tiles 4 i4 + x
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // A row g (head dims of quad 16 i4 + g), then g + 8
          const int quad = i4 * 16 + h * 8 + g;
          uint32_t w[4];
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            w[x] = *reinterpret_cast<const uint32_t*>(
                vs + rows[x] * RS + swz_chunk<kCpr>(quad >> 2, rows[x]) * 16 + (quad & 3) * 4);
          }
          const uint32_t lo0 = __byte_perm(w[0], w[1], 0x5140), hi0 = __byte_perm(w[0], w[1], 0x7362);
          const uint32_t lo8 = __byte_perm(w[2], w[3], 0x5140), hi8 = __byte_perm(w[2], w[3], 0x7362);
          // Head dim 4 quad + x: tokens (2tig, 2tig + 1) to register h, (+8, +9) to h + 2.
          e4m3x4_to_f16x2(lo0, af[0][h], af[1][h]);
          e4m3x4_to_f16x2(lo8, af[0][h + 2], af[1][h + 2]);
          e4m3x4_to_f16x2(hi0, af[2][h], af[3][h]);
          e4m3x4_to_f16x2(hi8, af[2][h + 2], af[3][h + 2]);
        }
#pragma unroll
        for (int x = 0; x < 4; ++x) mma16816<M>(o[4 * i4 + x], af[x], pb0, pb1);
      }
    }
  }

  // Scale / softcap / mask per token (row) of S^T, then the online softmax per head
  // (column): S becomes P, (m, l) are updated and O rescaled (online_softmax_update).
  __device__ __forceinline__ void softmax(float (&sc)[MT][4], uint32_t mask,
                                          const KernelArgs& a) {
    const int g = lane >> 2;
    logits<MT * 4>(&sc[0][0], a);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int t = i * 16 + g;
      if (!((mask >> t) & 1u)) sc[i][0] = sc[i][1] = -INFINITY;
      if (!((mask >> (t + 8)) & 1u)) sc[i][2] = sc[i][3] = -INFINITY;
      mx0 = fmaxf(mx0, fmaxf(sc[i][0], sc[i][2]));
      mx1 = fmaxf(mx1, fmaxf(sc[i][1], sc[i][3]));
    }
    online_softmax_update<true>(sc, mx0, mx1, m, l, o);
  }

  // (m, l) of heads < nh to ml (l summed over the column's 8 lanes) and O to ow ([head][D]),
  // undoing the head-dim permutation.
  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
    const int g = lane >> 2, tig = lane & 3;
    float ls[2] = {l[0], l[1]};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) ls[e] += __shfl_xor_sync(kFull, ls[e], off);
      const int h = 2 * tig + e;
      if (g == 0 && h < nh) {
        ml[h * 2] = m[e];
        ml[h * 2 + 1] = ls[e];
      }
    }
#pragma unroll
    for (int i4 = 0; i4 < DT / 4; ++i4) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // A row g (registers 0, 1), g + 8 (registers 2, 3)
        const int quad = i4 * 16 + h * 8 + g;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int head = 2 * tig + e;
          if (head < nh) {
            *reinterpret_cast<float4*>(ow + head * D + quad * 4) =
                make_float4(o[4 * i4][2 * h + e], o[4 * i4 + 1][2 * h + e],
                            o[4 * i4 + 2][2 * h + e], o[4 * i4 + 3][2 * h + e]);
          }
        }
      }
    }
  }
};

}  // namespace detail
}  // namespace xla_kernels::paged_attention
