// fused_moe's tuning decisions, one table: each value with the reason it was chosen. None is
// measured yet (the predictions: docs/design/moe.md); a new value is tried by editing it here
// and running benchmarks/moe.py. Host code; the GEMM configurations come from moe_gemm.cuh.
#pragma once

#include <cstdint>

#include "moe_gemm.cuh"
#include "moe_limits.h"

namespace xla_kernels::moe::tuning {

// Tile sizes, one decision per call from what the host knows (tokens * top_k pairs over the
// experts; the real split is only known on the device).
struct Tiles {
  int bm, bn1, bn2;  // rows per tile (both GEMMs: one tile table), columns per CTA
};

// bm: the expected rows per routed expert (pairs / min(experts, pairs)) rounded up to 16, 64
//     or 128: decode (a few rows per expert) then reads each weight tile once; prefill gets
//     the largest tile the registers allow.
// bn: 128, or 64 when 128 would give fewer CTAs than SMs (decode with few experts hit, e.g.
//     Mixtral's down projection at one token: 2 x 32 CTAs); bm 128 with the gated GEMM takes
//     64 (two accumulators per output: 128 f32 registers per thread).
inline Tiles ChooseTiles(int64_t pairs, int64_t experts, int64_t inter, int64_t hidden,
                         int sms) {
  const int64_t active = experts < pairs ? experts : pairs;
  const int64_t avg = CeilDiv(pairs, active);
  Tiles t{};
  t.bm = avg <= 16 ? 16 : avg <= 64 ? 64 : 128;
  const int64_t m_tiles = active * CeilDiv(avg, t.bm);
  auto bn = [&](int64_t n) { return t.bm == 16 && m_tiles * CeilDiv(n, 128) < sms ? 64 : 128; };
  t.bn1 = t.bm == 128 ? 64 : bn(inter);
  t.bn2 = bn(hidden);
  return t;
}

// Pipeline stages: bm 16 streams weights, and the bytes in flight per SM bound its bandwidth
// (about one CTA per SM at decode sizes): as many stages as fit in 140 KB of shared memory,
// 3 to 8 (A100 allows 163 KB per CTA); 3 for bm 64 and 128 (compute bound, large tiles).
template <typename T, bool kFp8, bool kGated, int BM, int BN>
constexpr int Stages() {
  if constexpr (BM != 16) {
    return 3;
  } else {
    using C = GemmConfig<T, kFp8, kGated, BM, BN, 1>;
    constexpr int fit = (140 * 1024 - C::kConvBytes) / C::kStageBytes;
    return fit < 3 ? 3 : fit > 8 ? 8 : fit;
  }
}

}  // namespace xla_kernels::moe::tuning
