// ragged_paged_attention's tuning decisions, one table: each value with the reason it was
// chosen (the measurements: docs/design/ragged_paged_attention.md). The kernels read these and
// nothing else; a new value is tried by editing it here and running benchmarks/gate.py.
#pragma once

namespace xla_kernels::ragged_paged_attention::tuning {

// Hopper (wgmma) prefill kernel ------------------------------------------------------------

// K/V tile tokens. bf16/f16: 128 at head_dim 64 and 128 (prefill 4 x 4096 on the H200:
// 310 vs 282 TFLOP/s at d 64, 415-426 vs 401-410 at d 128), 64 at 256 (O alone takes 128
// registers per thread). fp8 caches: 128 at d 64, else 64 (at d 128 both fit; 64 measured
// faster).
constexpr int wgmma_tile_tokens(int head_dim, bool fp8_cache) {
  return fp8_cache ? (head_dim == 64 ? 128 : 64) : (head_dim == 256 ? 64 : 128);
}

// Ping-pong of the two consumer warpgroups (one's softmax under the other's wgmmas):
// +8 % at head_dim 64, +3 % at 128 with 128-token tiles (240 registers), +5 % at 256;
// 1 % slower at 128 with 64-token tiles (fp8 caches there), which keep it off.
constexpr bool wgmma_ping_pong(int head_dim, int tile_tokens) {
  return !(head_dim == 128 && tile_tokens == 64);
}

// Consumer registers after setmaxnreg: 240 at head_dim 128 with 128-token bf16/f16 tiles
// (FlashAttention-3's split: the consumers spill with 232), else 232; the producer gets
// what they leave (24 or 40; the fp8 producer converts and needs its 40).
constexpr int wgmma_consumer_regs(int head_dim, int tile_tokens, bool fp8_cache) {
  return head_dim == 128 && tile_tokens == 128 && !fp8_cache ? 240 : 232;
}

// Stages of the K/V pipeline: as many as fit in shared memory, at most 6.
constexpr int kWgmmaMaxStages = 6;

// fp8 caches: bytes of the producer's ring of raw e4m3 tiles (2 K/V tiles at head_dim 64
// and 128, one at 256).
constexpr int kFp8RawRingBytes = 32768;

}  // namespace xla_kernels::ragged_paged_attention::tuning
