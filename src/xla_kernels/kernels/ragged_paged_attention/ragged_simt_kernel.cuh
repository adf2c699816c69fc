// ragged_paged_attention's f32 kernel: exact f32 FMAs on CUDA cores.
#pragma once

#include "ragged_common.cuh"

namespace xla_kernels::ragged_paged_attention {
namespace detail {

template <int D>
struct SimtConfig {
  static constexpr int RW = static_cast<int>(kRowsPerWarpSimt);  // packed rows per warp (8)
  static constexpr int BM = kW * RW;
  static constexpr int RS = D + 4;  // 16-byte aligned rows; lanes' float4 reads hit distinct banks
  static constexpr int kStages = D <= 128 ? 2 : 1;  // d 256 single-buffers (sm_80: 163 KB)
  static constexpr int DPL = D / 32;                // output dims per lane
  static constexpr int kQElems = BM * RS;
  static constexpr int kTileElems = NK * RS;
  static constexpr int kPElems = kW * RW * NK;      // per warp: [RW][NK] probabilities
  static constexpr int kBytes = (kQElems + kStages * 2 * kTileElems + kPElems) * 4;
};

template <int D>
__global__ void __launch_bounds__(kThreads) ragged_simt_kernel(const Args a) {
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  using C = SimtConfig<D>;
  constexpr int RW = C::RW, BM = C::BM, RS = C::RS, DPL = C::DPL, kStages = C::kStages;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Work work;
  __shared__ int tok_ok[kStages][NK];
  float* qs = reinterpret_cast<float*>(smem);
  float* kv_base = qs + C::kQElems;
  float* ps = kv_base + kStages * 2 * C::kTileElems;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y;
  if (warp == 0) find_work(a, blockIdx.x, BM, &work, lane);
  __syncthreads();
  const Work w = work;
  if (w.s < 0) return;

  const TileRows tr = tile_rows(a, w, BM);
  int lo, hi;
  token_range(a, tr, tr.r0, tr.r_end, &lo, &hi);
  const int ntiles = hi > lo ? (hi - lo + NK - 1) / NK : 0;

  if constexpr (kStages == 2) {
    if (ntiles > 0)
      load_kv_tile<float, D, RS>(kv_base, kv_base + C::kTileElems, tok_ok[0], a, w.s, kvh, lo,
                                 lo, hi, tid);
  }
  cp_async_commit();
  stage_q<float, float, D, RS, BM>(qs, a, w, tr, kvh, tid);

  const int wr0 = tr.r0 + warp * RW;
  const bool live = wr0 < tr.r_end;
  int wlo = 0, whi = 0;
  if (live) token_range(a, tr, wr0, min(tr.r_end, wr0 + RW), &wlo, &whi);
  int pos[RW], rlo[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) row_range(a, tr, wr0 + r, &pos[r], &rlo[r]);
  float* pw = ps + warp * RW * NK;

  float o[RW][DPL], m[RW], lp[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    m[r] = -INFINITY;
    lp[r] = 0.f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) o[r][e] = 0.f;
  }

  for (int it = 0; it < ntiles; ++it) {
    const int st = kStages == 2 ? (it & 1) : 0;
    if constexpr (kStages == 2) {
      if (it + 1 < ntiles) {
        float* kn = kv_base + 2 * ((it + 1) & 1) * C::kTileElems;
        load_kv_tile<float, D, RS>(kn, kn + C::kTileElems, tok_ok[(it + 1) % kStages], a, w.s, kvh,
                                   lo + (it + 1) * NK, lo, hi, tid);
      }
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      load_kv_tile<float, D, RS>(kv_base, kv_base + C::kTileElems, tok_ok[0], a, w.s, kvh,
                                 lo + it * NK, lo, hi, tid);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();
    const int t0 = lo + it * NK;
    if (live && t0 < whi && t0 + NK > wlo) {
      const float* ks = kv_base + 2 * st * C::kTileElems;
      const float* vs = ks + C::kTileElems;
      // Lane j: logits of token t0 + j for the warp's RW rows.
      float s[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) s[r] = 0.f;
#pragma unroll 4
      for (int d = 0; d < D; d += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(ks + lane * RS + d);
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const float4 q4 = *reinterpret_cast<const float4*>(qs + (warp * RW + r) * RS + d);
          s[r] = fmaf(q4.x, k4.x, s[r]);
          s[r] = fmaf(q4.y, k4.y, s[r]);
          s[r] = fmaf(q4.z, k4.z, s[r]);
          s[r] = fmaf(q4.w, k4.w, s[r]);
        }
      }
      const int t = t0 + lane;
      const bool ok = tok_ok[st][lane] != 0;
      float al[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        const float x = (ok && t <= pos[r] && t >= rlo[r]) ? logit(s[r], a) : -INFINITY;
        float mx = x;
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
        const float mn = fmaxf(m[r], mx);
        const float b = safe_max(mn);
        al[r] = exp2f(m[r] - b);
        m[r] = mn;
        const float p = exp2f(x - b);
        lp[r] = lp[r] * al[r] + p;
        pw[r * NK + lane] = p;
      }
      __syncwarp();
#pragma unroll
      for (int r = 0; r < RW; ++r) {
#pragma unroll
        for (int e = 0; e < DPL; ++e) o[r][e] *= al[r];
      }
#pragma unroll 4
      for (int j = 0; j < NK; ++j) {
        float vf[DPL];
#pragma unroll
        for (int e = 0; e < DPL; e += 2) {
          const float2 v2 = *reinterpret_cast<const float2*>(vs + j * RS + lane * DPL + e);
          vf[e] = v2.x;
          vf[e + 1] = v2.y;
        }
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const float p = pw[r * NK + j];
#pragma unroll
          for (int e = 0; e < DPL; ++e) o[r][e] = fmaf(p, vf[e], o[r][e]);
        }
      }
      __syncwarp();  // pw is rewritten by the next tile
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  if (!live) return;
  float* out = static_cast<float*>(a.out);
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    float l = lp[r];
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) l += __shfl_xor_sync(kFull, l, off);
    const int pr = wr0 + r;
    if (pr >= tr.r_end) continue;  // uniform over the warp
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float* orow = out + out_offset(a, w, kvh, pr, D) + lane * DPL;
#pragma unroll
    for (int e = 0; e < DPL; ++e) orow[e] = o[r][e] * inv;
  }
}

}  // namespace detail
}  // namespace xla_kernels::ragged_paged_attention
