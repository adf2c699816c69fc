// The Hopper prefill kernel's shape (Sm90Config: tiles, stages, registers, ping-pong from
// ragged_paged_attention_tuning.h), its stage barriers and its shared-memory helpers.
#pragma once

#include "ragged_common.cuh"
#include "ragged_paged_attention_tuning.h"
#include "xla_kernels/cuda_async_pipeline.cuh"
#include "xla_kernels/cuda_wgmma.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

namespace wg = ::xla_kernels::cuda_wgmma;
namespace ap = ::xla_kernels::cuda_async_pipeline;

constexpr int kSm90Consumers = 2;                        // consumer warpgroups
constexpr int kSm90Threads = 128 * (1 + kSm90Consumers);  // + the producer warpgroup
constexpr int kSm90Rows = 64 * kSm90Consumers;           // packed rows per CTA
// Registers per thread at launch (__launch_bounds__(kSm90Threads, 1)); setmaxnreg then moves
// them from the producer to the consumers (Sm90Config::kConsumerRegs).
constexpr int kSm90LaunchRegs = 65536 / kSm90Threads / 8 * 8;
constexpr uint32_t kSm90TurnBarrier = 3;  // + consumer index (1 + consumer index stages Q)

template <int D, int N, bool kFp8 = false>
struct Sm90Config {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  static_assert(N == 64 || N == 128, "K/V tiles of 64 or 128 tokens");
  static_assert(D < 256 || N == 64, "head_dim 256 takes 64-token tiles (O alone is 128 "
                                    "registers per thread)");
  static constexpr int kKvPanel = N * 128;  // bytes of one 64-column panel of a K or V tile
  static constexpr int kTileBytes = N * D * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  // Q of both consumer warpgroups in shared memory (SW128 panels of 64 rows) where the
  // registers do not allow Q in registers (head_dim 128 with 128-token tiles: S and P take
  // 32 registers more; head_dim 256: O takes 128); the other shapes keep Q in registers.
  static constexpr bool kQSmem = D == 256 || (D == 128 && N == 128);
  // O of a consumer thread: kOH halves of kOW f32 accumulators (m64n128 each at head_dim
  // 256, whose P V is two wgmmas per k-step; one m64nD otherwise).
  static constexpr int kOH = D == 256 ? 2 : 1;
  static constexpr int kOW = D / 2 / kOH;
  static constexpr int kQWgBytes = 64 * D * 2;  // one consumer warpgroup's rows
  static constexpr int kQBytes = kQSmem ? kSm90Consumers * kQWgBytes : 0;
  // Shared memory per CTA on sm_90 (227 KB), less the static part (barriers, Work: under
  // 2 KB) and the 1024-byte alignment of the dynamic part.
  static constexpr int kSmemLimit = 232448, kStaticReserve = 2048;
  // fp8 caches: a ring of raw e4m3 units (one K or one V tile, N x D bytes each) that the
  // producer copies with cp.async and converts into the stages: 32 KB, i.e. 4 units (2 tiles)
  // at head_dim 64 and 128, 2 (one tile) at 256.
  static constexpr int kRawUnitBytes = N * D;
  static constexpr int kRawUnits = kFp8 ? tuning::kFp8RawRingBytes / kRawUnitBytes : 0;
  static constexpr int kRawBytes = kRawUnits * kRawUnitBytes;
  static constexpr int kFit =
      (kSmemLimit - kStaticReserve - 1024 - kQBytes - kRawBytes) / kStageBytes;
  static constexpr int kStages = kFit < tuning::kWgmmaMaxStages ? kFit : tuning::kWgmmaMaxStages;
  static_assert(kStages >= 2, "two stages must fit");
  static_assert(!kFp8 || kRawUnits >= 2, "fp8: the raw ring needs two units");
  static constexpr int kBytes = kQBytes + kStages * kStageBytes + kRawBytes + 1024;
  // K and V of a stage behind barriers of their own where two stages are all that fit.
  static constexpr bool kSplitKV = kStages == 2;
  // Ping-pong of the consumers (FlashAttention-3's warp-scheduler barriers): a consumer
  // issues a tile's wgmmas (S_j and the pending P V) only in its turn, then hands the turn
  // to the other; both take one turn per tile of the CTA, the tiles they pass included.
  static constexpr bool kPingPong = tuning::wgmma_ping_pong(D, N);
  // Registers per thread after setmaxnreg. setmaxnreg.inc takes registers only from those
  // the producer gave back from its launch allocation, so the budgets must balance there,
  // not only fit the register file.
  static constexpr int kConsumerRegs = tuning::wgmma_consumer_regs(D, N, kFp8);
  static constexpr int kProducerRegs =
      (kSm90LaunchRegs - kSm90Consumers * (kConsumerRegs - kSm90LaunchRegs)) / 8 * 8;
  static_assert(kConsumerRegs % 8 == 0 && kConsumerRegs <= 240 && kProducerRegs >= 24,
                "consumer registers: a multiple of 8 up to 240");
  static_assert((kSm90LaunchRegs - kProducerRegs) * 128 >=
                    (kConsumerRegs - kSm90LaunchRegs) * 128 * kSm90Consumers,
                "the consumers would wait for registers the producer never gives back");
};

// Shared memory by its 32-bit shared-window address (the addresses the stages, Q panels and
// raw ring are kept as): 4-byte stores, 8- and 16-byte loads, 16-byte stores.
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t x) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ void lds64(uint32_t addr, uint32_t& x0, uint32_t& x1) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(x0), "=r"(x1) : "r"(addr) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, uint32_t x0, uint32_t x1, uint32_t x2,
                                       uint32_t x3) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x0), "r"(x1),
               "r"(x2), "r"(x3)
               : "memory");
}

// Byte address of 16-byte chunk ch (8 columns) of row r < 64 in a warpgroup's Q panels at
// q_s (SW128, 64 columns per panel): where Q is staged and O is gathered for its stores.
__device__ __forceinline__ uint32_t q_panel_chunk(uint32_t q_s, int r, int ch) {
  return q_s + (ch / 8) * 64 * 128 + wg::sw128_offset(r, ch % 8);
}

// 2^x with ex2.approx.ftz: exp2f without its subnormal fix-up (a result below 2^-126 becomes
// 0; softmax weights are taken relative to the row maximum, so nothing of weight is lost).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Shared-memory addresses of the stages' mbarriers (stage st's at + 8 st). full / empty
// guard the whole stage, or only its K where the config splits K and V (full_v / empty_v
// then guard V).
struct StageBarriers {
  uint32_t full, empty, full_v, empty_v;
};

}  // namespace xla_kernels::ragged_paged_attention::detail
