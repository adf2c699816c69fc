// paged_attention's f32 core: exact f32 FMAs on CUDA cores.
#pragma once

#include "decode_tile_loader.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

// Any T (used for f32): exact f32 FMAs. GC q heads per CTA.
template <typename T, int D, int GC_>
struct SimtCore {
  using Cache = T;
  static constexpr int GC = GC_;
  static constexpr int kMaxCtasPerSm = 0;  // no cap: as many as fit
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(T));
  static constexpr int NW = simt_tile_tokens(kRowBytes);
  static constexpr int TG = 32 / NW;        // lanes per token in S = Q K^T
  static constexpr int kCpr = D / kVec;     // 16-byte chunks per row
  static constexpr int kCpl = kCpr / TG;    // chunks per lane
  static constexpr int kStages = kSimtStages;
  static constexpr bool kSwizzle = false;
  // Row padding keeps the 8 lanes of a 16-byte shared-load phase on distinct banks.
  static constexpr int RS = D + 16 * (TG < 4 ? TG : 4) / static_cast<int>(sizeof(T));
  static constexpr int DPL = D / 32;        // output dims per lane in O += P V
  static constexpr int kQBytes = GC * D * 4;
  static constexpr int kPBytes = kWarps * NW * GC * 4;
  static constexpr int kExtraBytes = kQBytes + kPBytes;
  static_assert(kCpr % TG == 0 && NW * TG == 32, "bad SIMT tiling");
  static_assert(GC % 4 == 0 || GC == 1 || GC == 2, "GC");

  float o[GC][DPL];
  float m[GC], lp[GC];
  const float* qsm;
  float* psm;  // this warp's [NW][GC] probabilities
  int lane;

  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    float* q = reinterpret_cast<float*>(extra);
    for (int e = tid; e < GC * D; e += kThreads) {
      const int r = e / D;
      float x = 0.f;
      if (r < nh) {
        if constexpr (std::is_same_v<T, float>) {
          x = qg[e];
        } else {
          x = static_cast<float>(qg[e]);
        }
      }
      q[e] = x;
    }
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    qsm = reinterpret_cast<const float*>(extra);
    psm = reinterpret_cast<float*>(extra + kQBytes) + warp * NW * GC;
    lane = lane_;
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      m[g] = -INFINITY;
      lp[g] = 0.f;
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[g][e] = 0.f;
    }
  }

  __device__ __forceinline__ void step(const T* ks, const T* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int t = lane / TG, sub = lane % TG;
    float s[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) s[g] = 0.f;
#pragma unroll
    for (int j = 0; j < kCpl; ++j) {
      const int c = (sub + TG * j) * kVec;
      float kf[kVec];
      lds_cvt<T, kVec>(ks + t * RS + c, kf);
#pragma unroll
      for (int g = 0; g < GC; ++g) {
#pragma unroll
        for (int e = 0; e < kVec; e += 4) {
          const float4 q4 = *reinterpret_cast<const float4*>(qsm + g * D + c + e);
          s[g] = fmaf(q4.x, kf[e], s[g]);
          s[g] = fmaf(q4.y, kf[e + 1], s[g]);
          s[g] = fmaf(q4.z, kf[e + 2], s[g]);
          s[g] = fmaf(q4.w, kf[e + 3], s[g]);
        }
      }
    }
#pragma unroll
    for (int off = TG / 2; off >= 1; off >>= 1) {
#pragma unroll
      for (int g = 0; g < GC; ++g) s[g] += __shfl_xor_sync(kFull, s[g], off);
    }
    const bool valid = (mask >> t) & 1u;
    logits<GC>(s, a);
    float al[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      const float x = valid ? s[g] : -INFINITY;
      float mx = x;
#pragma unroll
      for (int off = TG; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
      const float mn = fmaxf(m[g], mx);
      const float b = safe_max(mn);
      al[g] = exp2f(m[g] - b);
      m[g] = mn;
      const float p = exp2f(x - b);
      lp[g] = lp[g] * al[g] + (sub == 0 ? p : 0.f);
      s[g] = p;
    }
    if (sub == 0) {
#pragma unroll
      for (int g = 0; g < GC; ++g) psm[t * GC + g] = s[g];
    }
    __syncwarp();
#pragma unroll
    for (int g = 0; g < GC; ++g) {
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[g][e] *= al[g];
    }
#pragma unroll 4
    for (int tt = 0; tt < NW; ++tt) {
      float vf[DPL];
      lds_cvt<T, DPL>(vs + tt * RS + lane * DPL, vf);
      float pv[GC];
      if constexpr (GC % 4 == 0) {
#pragma unroll
        for (int g = 0; g < GC; g += 4) {
          const float4 p4 = *reinterpret_cast<const float4*>(psm + tt * GC + g);
          pv[g] = p4.x;
          pv[g + 1] = p4.y;
          pv[g + 2] = p4.z;
          pv[g + 3] = p4.w;
        }
      } else {
#pragma unroll
        for (int g = 0; g < GC; ++g) pv[g] = psm[tt * GC + g];
      }
#pragma unroll
      for (int g = 0; g < GC; ++g) {
#pragma unroll
        for (int e = 0; e < DPL; ++e) o[g][e] = fmaf(pv[g], vf[e], o[g][e]);
      }
    }
  }

  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float l = lp[g];
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) l += __shfl_xor_sync(kFull, l, off);
      if (g < nh) {
        if (lane == 0) {
          ml[g * 2] = m[g];
          ml[g * 2 + 1] = l;
        }
#pragma unroll
        for (int e = 0; e < DPL; ++e) ow[g * D + lane * DPL + e] = o[g][e];
      }
    }
  }
};

}  // namespace detail
}  // namespace xla_kernels::paged_attention
