// fp8_linear's Hopper path (per-channel scales, bf16 x, compute capability 9.0): CUTLASS's
// sm90 GEMM in the swap-AB form (xla_kernels/gemm/sm90_swap_ab.cuh), the sums in f32 and the
// scales applied in the epilogue before the one rounding. Weight-only: the mixed-input
// mainloop converts the e4m3 weight tile to bf16 in registers, x stays bf16; up to 128 tokens,
// on long K loops, the stream-K schedule spreads the weights over every SM (its partial sums
// in the op's workspace), elsewhere the ping-pong tile of the same size runs. W8A8: x already
// quantized to e4m3 per token, e4m3 wgmma, the channel and token scales in the epilogue.
// Built only where CUTLASS's headers are on the include path, as linear's (linear_sm90.cu).
#include <cuda_runtime.h>

#include "fp8_linear_sm90.h"

#if __has_include("cute/tensor.hpp") && __has_include("cutlass/util/packed_stride.hpp")
#define XK_FP8_LINEAR_CUTLASS 1
#include "xla_kernels/gemm/sm90_swap_ab.cuh"
#include "xla_kernels/gemm/sm90_swap_ab_blockwise.cuh"
#else
#define XK_FP8_LINEAR_CUTLASS 0
#endif

namespace xla_kernels::fp8_linear {

#if XK_FP8_LINEAR_CUTLASS
namespace {

using E4m3 = cutlass::float_e4m3_t;
using Bf16 = cutlass::bfloat16_t;
// The tiles by token count: linear's shapes (docs/design/gemm.md), with K steps of 128 (a
// 128-byte e4m3 row per weight row) at 16 and 64 tokens; the stream-K tiles are 128 rows (a
// cooperative tile's two halves), their ping-pong fallbacks 64. Not swept for e4m3 yet.
using SmallStreamK = gemm::Sm90SwapAbGemm<E4m3, Bf16, 128, 16, 128, true, gemm::StreamK>;
using SmallPingPong = gemm::Sm90SwapAbGemm<E4m3, Bf16, 64, 16, 128, true>;
using MediumStreamK = gemm::Sm90SwapAbGemm<E4m3, Bf16, 128, 64, 128, true, gemm::StreamK>;
using MediumPingPong = gemm::Sm90SwapAbGemm<E4m3, Bf16, 64, 64, 128, true>;
using LargeTile = gemm::Sm90SwapAbGemm<E4m3, Bf16, 128, 128, 64, true>;
// W8A8: e4m3 x e4m3 wgmma (CUTLASS's default accumulation: the f32 sums promoted every few K
// steps, no fast-accumulation shortcut), ping-pong tiles of 64 weight rows x kTN tokens with K
// steps of 128. Not a 128 x 128 ping-pong tile: the promoted sums double a consumer's
// accumulator registers (that tile took 103.9 us on gate_up 14336 x 4096 at 256 tokens, 14 %
// of its weight floor, in its one run).
template <int kTN>
using W8A8Tile = gemm::Sm90SwapAbGemm<E4m3, E4m3, 64, kTN, 128, true, gemm::PingPong, Bf16,
                                      /*kTokenScale=*/true>;
// Beyond 128 tokens, 128 rows x 128 tokens shared by both consumer warp groups (cooperative:
// 64 rows each, so each holds what a 64 x 128 ping-pong consumer holds): half as many tiles,
// each consumer issuing wgmma on every K step instead of every other. Only where those tiles
// fill the SMs: at 256 tokens on an H200 it ran qkv (96 tiles) in 24.1 us and gate_up (224)
// in 38.6 where the 64-row tile had taken 31.2 and 54.0 in an earlier call, but o and down
// (64 tiles) in 22.1 and 57.4 against 22.4 and 52.1 (docs/design/gemm.md).
using W8A8Large = gemm::Sm90SwapAbGemm<E4m3, E4m3, 128, 128, 128, true, gemm::Cooperative,
                                       Bf16, /*kTokenScale=*/true>;

// Stream-K where the K loop is long (in >= kStreamKMinIn, Llama-3-8B's down: 112 K steps),
// else, or where StreamK declines the call (no K split chosen), the ping-pong tile. On an
// H200 stream-K ran down in 31.8 / 34.6 us at 16 / 64 tokens against the ping-pong tile's
// 44.7 / 50.5, but o at 16 tokens in 24.4 against 16.3 (docs/design/gemm.md).
constexpr int64_t kStreamKMinIn = 8192;
template <class StreamKTile, class PingPongTile>
struct StreamKWhereKIsLong {
  static bool Launch(const gemm::SwapAbCall& c, int device, int sm_count, cudaStream_t stream,
                     cudaError_t* status) {
    return (c.in >= kStreamKMinIn && StreamKTile::Launch(c, device, sm_count, stream, status)) ||
           PingPongTile::Launch(c, device, sm_count, stream, status);
  }
};

}  // namespace

bool LaunchSm90(cudaStream_t stream, const gemm::SwapAbCall& call, cudaError_t* status) {
  if (call.row_scale == nullptr) return false;
  // The 16-token tile up to 16 tokens only: at 32 it read every weight tile twice (gate_up:
  // 83.9 us against 58.8 with the 64-token tile at 64 tokens, one H200 run).
  return gemm::LaunchByTokens<
      StreamKWhereKIsLong<SmallStreamK, SmallPingPong>,
      gemm::WideWhereItFillsTheSms<StreamKWhereKIsLong<MediumStreamK, MediumPingPong>,
                                   LargeTile>,
      LargeTile, /*kSmallMaxTokens=*/16>(call, stream, status);
}

bool Sm90PathRuns() {
  int device = 0, sms = 0;
  return gemm::CurrentSm90Device(&device, &sms);
}

// No stream-K for W8A8: it gained nothing measurable on down (16 and 64 tokens: 33.8 and 37.5
// us against the ping-pong tile's 29.9 and 35.7 in one H200 call, within that call's drift
// between runs; docs/design/gemm.md), so the simpler schedule runs.
bool LaunchSm90W8A8(cudaStream_t stream, const gemm::SwapAbCall& call, cudaError_t* status) {
  if (call.row_scale == nullptr || call.token_scale == nullptr) return false;
  return gemm::LaunchByTokens<
      W8A8Tile<16>, gemm::WideWhereItFillsTheSms<W8A8Tile<64>, W8A8Tile<128>>,
      gemm::WideWhereItFillsTheSms<W8A8Tile<128>, W8A8Large, /*kNarrowTokens=*/128>,
      /*kSmallMaxTokens=*/16>(call, stream, status);
}

// The token tiles of the W8A8 path; 128 tokens a tile beyond 64 (64 rows x 128 tokens: the
// promoted sums of fp8 wgmma fit a consumer's registers).
bool LaunchSm90W8A8BlockScaled(cudaStream_t stream, const gemm::SwapAbCall& call,
                               const gemm::BlockScales& scales, cudaError_t* status) {
  // Beyond 128 tokens the cooperative 128 x 128 tile where it fills the SMs, as for
  // per-channel W8A8.
  using Tile128 = gemm::Sm90SwapAbBlockwiseGemm<128>;
  using Cooperative128 = gemm::Sm90SwapAbBlockwiseGemm<128, 128, gemm::Cooperative>;
  return gemm::LaunchByTokens<
      gemm::Sm90SwapAbBlockwiseGemm<16>, gemm::Sm90SwapAbBlockwiseGemm<64>,
      gemm::WideWhereItFillsTheSms<Tile128, Cooperative128, /*kNarrowTokens=*/128>,
      /*kSmallMaxTokens=*/16, /*kMediumMaxTokens=*/64>(call, stream, status, scales);
}

#else

bool LaunchSm90(cudaStream_t, const gemm::SwapAbCall&, cudaError_t*) { return false; }
bool LaunchSm90W8A8BlockScaled(cudaStream_t, const gemm::SwapAbCall&, const gemm::BlockScales&,
                               cudaError_t*) {
  return false;
}
bool LaunchSm90W8A8(cudaStream_t, const gemm::SwapAbCall&, cudaError_t*) { return false; }
bool Sm90PathRuns() { return false; }

#endif

}  // namespace xla_kernels::fp8_linear

// Whether this library has the Hopper path (xla_kernels.kernels.fp8_linear.hopper_path_built).
extern "C" __attribute__((visibility("default"))) int XkFp8LinearHasSm90() {
  return XK_FP8_LINEAR_CUTLASS;
}
