// paged_attention's main kernel: a CTA's partition of one sequence and kv head through one
// core (the tile loop, the warps' merge, the output or the partials).
#pragma once

#include "decode_fp8_core.cuh"
#include "decode_mma_core.cuh"
#include "decode_simt_core.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

// Shared-memory layout of the main kernel (bytes).
template <typename T, int D, class Core>
struct Smem {
  static constexpr int kTileElems = Core::NW * Core::RS;  // of Core::Cache
  static constexpr int kStaging =
      kWarps * Core::kStages * 2 * kTileElems * static_cast<int>(sizeof(typename Core::Cache));
  static constexpr int kEpilogue = kWarps * Core::GC * D * 4;  // reuses the staging area
  static constexpr int kMain = kStaging > kEpilogue ? kStaging : kEpilogue;
  static constexpr int kExtraOff = kMain;
  static constexpr int kMlOff = kExtraOff + ((Core::kExtraBytes + 15) / 16) * 16;
  static constexpr int kMaskOff = kMlOff + kWarps * Core::GC * 2 * 4;
  static constexpr int kBytes = kMaskOff + kWarps * Core::kStages * 4;
};

template <typename T, int D, class Core>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm(D))
    paged_attention_main(const KernelArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  using L = Smem<T, D, Core>;
  using C = typename Core::Cache;  // T, or uint8_t (e4m3) for fp8 caches
  constexpr bool kFp8 = !std::is_same_v<C, T>;
  constexpr int NW = Core::NW, RS = Core::RS, kStages = Core::kStages, GC = Core::GC;
  constexpr bool kSwz = Core::kSwizzle;
  constexpr int kAhead = block_ids_ahead(kFp8, D);  // tiles of block ids ahead

  // Launched with PDL: nothing global is touched before the previous kernel has finished.
  // The reduce kernel (PDL too) may then be scheduled; it waits for this grid to finish.
  pdl_wait();
  pdl_launch_dependents();
  const int HC = a.Hkv * a.chunks;
  int idx = blockIdx.x;
  const int hc = idx % HC;
  idx /= HC;
  const int part = idx % a.T;
  const int s = idx / a.T;
  const int kvh = hc / a.chunks, chunk = hc % a.chunks;
  const int h0 = kvh * a.G + chunk * GC;  // first q head of this CTA
  const int nh = min(GC, a.G - chunk * GC);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int32_t* bt_row = a.cache.table(s);
  // Partition 0 of a sequence without a window starts at token 0, so the block ids of its
  // first tiles are known before the length: their loads overlap the length's instead of
  // following it (one dependent memory round trip less before the first copy).
  constexpr int kFirst = kStages - 1;  // the prologue's copies
  const bool early_ids = kAhead > 1 && part == 0 && a.window == 0;
  int first_ids[kFirst];
#pragma unroll
  for (int i = 0; i < kFirst; ++i) {
    const int b = a.cache.block_index((warp + i * kWarps) * NW + lane);
    first_ids[i] = early_ids && lane < NW ? a.cache.entry_or_none(bt_row, b) : -1;
  }
  const SeqPart sp = seq_partition(a, s);
  if (part >= sp.n) return;

  T* out = static_cast<T*>(a.out) + (static_cast<int64_t>(s) * a.Hq + h0) * D;
  if (sp.hi <= sp.lo) {  // empty sequence: zeros
    for (int e = tid; e < nh * D; e += kThreads) out[e] = from_float<T>(0.f);
    return;
  }
  const int p_lo = sp.lo + part * sp.P;
  const int p_hi = min(sp.hi, p_lo + sp.P);

  C* staging = reinterpret_cast<C*>(smem) + warp * kStages * 2 * L::kTileElems;
  uint32_t* masks = reinterpret_cast<uint32_t*>(smem + L::kMaskOff) + warp * kStages;
  const int ntile = (p_hi - p_lo + NW - 1) / NW;
  const int my_n = warp < ntile ? (ntile - warp + kWarps - 1) / kWarps : 0;

  auto tile_pos = [&](int i) { return p_lo + (warp + i * kWarps) * NW; };
  // Block id of this lane's token in the warp's tile i < kFirst (lookup_block's value).
  auto first_id = [&](int i) {
    return early_ids ? (tile_pos(i) + lane < p_hi ? first_ids[i] : -1)
                     : lookup_block<NW>(a, bt_row, tile_pos(i), p_hi, lane);
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < my_n) {
      C* kb = staging + (2 * st) * L::kTileElems;
      const uint32_t mk = load_tile<C, D, NW, RS, kSwz>(kb, kb + L::kTileElems, a, first_id(st),
                                                        tile_pos(st), kvh, lane);
      if (lane == 0) masks[st] = mk;
    }
    cp_async_commit();
  }
  int ahead[kAhead];  // block ids of the warp's tiles nx, nx + 1, ... (nx: the next copy)
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    ahead[i] = lookup_block<NW>(a, bt_row, tile_pos(kStages - 1 + i), p_hi, lane);
  }

  // The query goes to shared memory while the first K/V tiles are in flight.
  const T* qg = static_cast<const T*>(a.q) + (static_cast<int64_t>(s) * a.Hq + h0) * D;
  Core::stage_q(qg, nh, smem + L::kExtraOff, tid);
  __syncthreads();
  Core core;
  core.init(smem + L::kExtraOff, warp, lane);
  for (int it = 0; it < my_n; ++it) {
    const int nx = it + kStages - 1;
    if (nx < my_n) {
      const int st = nx % kStages;
      C* kb = staging + (2 * st) * L::kTileElems;
      const uint32_t mk = load_tile<C, D, NW, RS, kSwz>(kb, kb + L::kTileElems, a, ahead[0],
                                                        tile_pos(nx), kvh, lane);
      if (lane == 0) masks[st] = mk;
#pragma unroll
      for (int i = 0; i + 1 < kAhead; ++i) ahead[i] = ahead[i + 1];
      ahead[kAhead - 1] = lookup_block<NW>(a, bt_row, tile_pos(nx + kAhead), p_hi, lane);
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int st = it % kStages;
    const C* kb = staging + (2 * st) * L::kTileElems;
    core.step(kb, kb + L::kTileElems, masks[st], a);
    __syncwarp();
  }
  cp_async_wait<0>();
  __syncthreads();  // staging area is reused below

  float* ow = reinterpret_cast<float*>(smem);
  float* ml = reinterpret_cast<float*>(smem + L::kMlOff);
  core.store(ow + warp * GC * D, ml + warp * GC * 2, nh);
  __syncthreads();

  // Merge the warps; write the output (one partition) or the partial (several).
  const bool single = sp.n == 1;
  float* ws_acc = a.ws;
  float* ws_ml = a.ws + static_cast<int64_t>(a.S) * a.Hq * a.T * D;
  for (int e = tid; e < nh * (D / 4); e += kThreads) {
    const int g = e / (D / 4), d = (e % (D / 4)) * 4;
    float mw[kWarps];
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      mw[w] = ml[(w * GC + g) * 2];
      mx = fmaxf(mx, mw[w]);
    }
    const float b = safe_max(mx);
    float lsum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float c = exp2f(mw[w] - b);
      lsum = fmaf(c, ml[(w * GC + g) * 2 + 1], lsum);
      const float4 x = *reinterpret_cast<const float4*>(ow + (w * GC + g) * D + d);
      acc.x = fmaf(c, x.x, acc.x);
      acc.y = fmaf(c, x.y, acc.y);
      acc.z = fmaf(c, x.z, acc.z);
      acc.w = fmaf(c, x.w, acc.w);
    }
    if (single) {
      float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      if constexpr (kFp8) inv *= a.out_scale;
      T* o = out + g * D + d;
      o[0] = from_float<T>(acc.x * inv);
      o[1] = from_float<T>(acc.y * inv);
      o[2] = from_float<T>(acc.z * inv);
      o[3] = from_float<T>(acc.w * inv);
    } else {
      const int64_t row = (static_cast<int64_t>(s) * a.Hq + h0 + g) * a.T + part;
      *reinterpret_cast<float4*>(ws_acc + row * D + d) = acc;
      if (d == 0) {
        ws_ml[row * 2] = mx;
        ws_ml[row * 2 + 1] = lsum;
      }
    }
  }
}

}  // namespace detail
}  // namespace xla_kernels::paged_attention
