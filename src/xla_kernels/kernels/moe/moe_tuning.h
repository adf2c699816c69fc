// fused_moe's tuning decisions, one table: each value with the reason it was chosen (the
// measurements and profiles behind them: docs/design/moe.md); a new value is tried by editing
// it here and running benchmarks/moe.py. Host code; the GEMM configurations come from
// moe_gemm.cuh.
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
// bn: prefill 128 (bm 128 with the gated GEMM: 64, two accumulators per output are 128 f32
//     registers per thread). Decode: the widest of 128, 64 and 32 that still gives a CTA to
//     every SM: the weights stream at the rate the resident warps can issue their copies, and
//     with few experts hit a wide tile leaves SMs idle (Mixtral's down projection at one
//     token: 2 tiles x 32 column blocks of 128; Qwen3-30B-A3B's gate/up: 8 x 6).
inline Tiles ChooseTiles(int64_t pairs, int64_t experts, int64_t inter, int64_t hidden,
                         int sms) {
  const int64_t active = experts < pairs ? experts : pairs;
  const int64_t avg = CeilDiv(pairs, active);
  Tiles t{};
  t.bm = avg <= 16 ? 16 : avg <= 64 ? 64 : 128;
  const int64_t m_tiles = active * CeilDiv(avg, t.bm);
  auto bn = [&](int64_t n) {
    if (t.bm != 16) return 128;
    if (m_tiles * CeilDiv(n, 128) >= sms) return 128;
    return m_tiles * CeilDiv(n, 64) >= sms ? 64 : 32;
  };
  t.bn1 = t.bm == 128 ? 64 : bn(inter);
  t.bn2 = bn(hidden);
  return t;
}

// Pipeline stages: bm 16 streams weights, and the bytes in flight per SM bound its bandwidth:
// as many stages as fit in 110 KB of shared memory, 3 to 8, so that two CTAs share an SM of
// Hopper (228 KB; an A100's 164 KB holds one); 3 for bm 64 and 128 (compute bound, large
// tiles).
template <typename T, bool kFp8, bool kGated, int BM, int BN>
constexpr int Stages() {
  if constexpr (BM != 16) {
    return 3;
  } else {
    using C = GemmConfig<T, kFp8, kGated, BM, BN, 1>;
    constexpr int fit = (110 * 1024 - C::kConvBytes) / C::kStageBytes;
    return fit < 3 ? 3 : fit > 8 ? 8 : fit;
  }
}

}  // namespace xla_kernels::moe::tuning
