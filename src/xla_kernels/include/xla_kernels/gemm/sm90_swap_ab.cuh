// A Hopper GEMM for linear layers, built from CUTLASS 3.x's sm90 collectives (TMA loads, wgmma,
// warp-specialized ping-pong consumers, persistent tile scheduler), in the swap-AB form decode
// needs: D[out, tokens] = W[out, in] · x[tokens, in]^T, so the weight's rows fill wgmma's M
// (64 or 128) and the few tokens are its N tile (16, 64, ...). Both operands are K-major (the
// weight as torch stores it, x row-major); D column-major is y [tokens, out] row-major, so
// nothing is transposed. f32 accumulation, the result rounded once to the output type.
//
// Weights narrower than x (e4m3 under bf16 x) take CUTLASS's mixed-input mainloop: the weight
// tile goes TMA -> shared memory -> registers, is converted there to x's type by CUTLASS's
// converter (exact: every e4m3 value is a bf16 value; a faster-looking bit move measured
// slower, docs/design/gemm.md) and feeds wgmma's register operand; x stays in shared memory.
// A per-output-channel scale is the epilogue's per-row alpha, applied to the f32 sums.
//
// Two schedules. PingPong: two consumer warp groups take turns on whole tiles of a persistent
// grid, no workspace. StreamK: both warp groups share one 128-row tile (cooperative) and
// CUTLASS's stream-K scheduler splits the K loop of the tiles over all SMs, so that a
// projection with fewer output tiles than SMs (Llama-3-8B's down at 64 tokens: 32 tiles of
// 128 rows for 132 SMs) still streams its weights from every SM; the partial sums meet in the
// call's workspace, in a fixed order (deterministic reduction). The caller picks where it
// pays (fp8_linear_sm90.cu: long K loops only).
// Needs -DNDEBUG (CUTLASS's device asserts otherwise serialize every wgmma) and sm_90a.
// docs/design/gemm.md: why CUTLASS here, the tiles, and what they measured.
#pragma once

#ifndef NDEBUG
#error "sm90_swap_ab.cuh needs -DNDEBUG (CUTLASS's device asserts serialize the wgmma pipeline)"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "xla_kernels/gemm/sm90_call.h"
#include "xla_kernels/gemm/sm90_device.cuh"

namespace xla_kernels::gemm {

// A swap-AB call's problem for a CUTLASS kernel: m = out, n = tokens, k = in; the packed
// strides of W [out, in], x [tokens, in] and y^T [out, tokens]; the device for the persistent
// scheduler.
template <class Kernel>
struct SwapAbShape {
  int m, n, k;
  typename Kernel::StrideA a;
  typename Kernel::StrideB b;
  typename Kernel::StrideD d;
  cutlass::KernelHardwareInfo hw;

  SwapAbShape(const SwapAbCall& c, int device, int sm_count)
      : m(static_cast<int>(c.out)), n(static_cast<int>(c.tokens)), k(static_cast<int>(c.in)),
        a(cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(m, k, 1))),
        b(cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(n, k, 1))),
        d(cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(m, n, 1))) {
    hw.device_id = device;
    hw.sm_count = sm_count;
  }
};

// The tile (kTM weight rows x kTN tokens x kTK of in) of one ping-pong consumer warp group.
// ElementW: the weight's type (ElementX, or narrower: the mixed-input mainloop); kRowScale: y
// scaled per output channel (SwapAbCall::row_scale), else y is the plain product; Schedule:
// PingPong, StreamK or Cooperative (those two: kTM 128, one 64-row half per consumer warp
// group).
// ElementY: y's type (ElementX, or bf16 for e4m3 x); kTokenScale (W8A8): y also scaled per
// token (SwapAbCall::token_scale), both scales applied to the f32 sums before the rounding.
template <class ElementW, class ElementX, int kTM, int kTN, int kTK, bool kRowScale,
          class Schedule = PingPong, class ElementY = ElementX, bool kTokenScale = false>
struct Sm90SwapAbGemm {
  static_assert(!kTokenScale || kRowScale, "W8A8 has both scales");
  static constexpr bool kStreamK = std::is_same_v<Schedule, StreamK>;
  static constexpr bool kCooperative = kStreamK || std::is_same_v<Schedule, Cooperative>;
  static constexpr int kTileRows = kTM, kTileTokens = kTN;
  static_assert(!kCooperative || kTM % 128 == 0, "a cooperative tile splits 128 rows in two");
  using EpilogueSchedule = std::conditional_t<kCooperative,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative,
                                              cutlass::epilogue::TmaWarpSpecialized>;
  using KernelSchedule = std::conditional_t<kCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using TileScheduler = std::conditional_t<kStreamK, cutlass::gemm::StreamKScheduler,
                                           cutlass::gemm::PersistentScheduler>;
  using TileShape = cute::Shape<cute::Int<kTM>, cute::Int<kTN>, cute::Int<kTK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static constexpr int kAlignW = 16 / sizeof(ElementW);
  static constexpr int kAlignX = 16 / sizeof(ElementX);
  static constexpr int kAlignY = 16 / sizeof(ElementY);

  // No C operand: y is written, never read (beta = 0). The row scale is the per-row alpha (no
  // bias: its pointer stays null, which CUTLASS reads as zeros without loading).
  // W8A8: y = round(row_scale[o] * (token_scale[t] * acc)), an epilogue visitor tree of two
  // broadcasts (a column vector over the weight rows, a row vector over the tokens, each
  // loaded with alignment 1: any token count).
  using RowScaleLoad = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, TileShape, float, float, cute::Stride<cute::_1, cute::_0, cute::_0>, 1>;
  using TokenScaleLoad = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, TileShape, float, float, cute::Stride<cute::_0, cute::_1, cute::_0>, 1>;
  using TokenScaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      TokenScaleLoad, cutlass::epilogue::fusion::Sm90AccFetch>;
  using BothScaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementY, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      RowScaleLoad, TokenScaled>;
  using Fusion = std::conditional_t<
      kTokenScale, BothScaled,
      std::conditional_t<
          kRowScale,
          cutlass::epilogue::fusion::PerRowLinCombPerRowBiasEltAct<
              cutlass::epilogue::thread::Identity, ElementY, float, ElementY, ElementY, float>,
          cutlass::epilogue::fusion::LinearCombination<ElementY, float, void, float>>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::ColumnMajor, kAlignY, ElementY, cutlass::layout::ColumnMajor, kAlignY,
      EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementW, cutlass::layout::RowMajor,
      kAlignW, ElementX, cutlass::layout::ColumnMajor, kAlignX, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments Arguments(const SwapAbCall& c, int device, int sm_count) {
    const SwapAbShape<Kernel> s(c, device, sm_count);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {s.m, s.n, s.k, 1},
        {static_cast<const ElementW*>(c.w), s.a, static_cast<const ElementX*>(c.x), s.b},
        {{}, nullptr, s.d, static_cast<ElementY*>(c.y), s.d},
        s.hw};
    if constexpr (kTokenScale) {
      // {row scale, {token scale, acc, multiply}, multiply}: the tree's children, then its node.
      args.epilogue.thread = {{c.row_scale}, {{c.token_scale}, {}, {}}, {}};
    } else {
      args.epilogue.thread.alpha = 1.f;
      args.epilogue.thread.beta = 0.f;
      if constexpr (kRowScale) args.epilogue.thread.alpha_ptr = c.row_scale;
    }
    if constexpr (kStreamK) {
      // CUTLASS's heuristic: whole tiles where they fill the SMs, stream-K units for the rest;
      // the partial sums added in a fixed order, so a call's result does not vary by run.
      using Scheduler = typename Kernel::TileScheduler;
      args.scheduler.decomposition_mode = Scheduler::DecompositionMode::Heuristic;
      args.scheduler.reduction_mode = Scheduler::ReductionMode::Deterministic;
    }
    return args;
  }

  // Launches the GEMM; false (nothing launched) when CUTLASS cannot run this call (a pointer
  // not 16-byte aligned, which TMA needs and can_implement does not check; row lengths; sizes)
  // or it needs more workspace than the call brings (PingPong and Cooperative need none), or
  // a StreamK tile would not split the K loop at all.
  static bool Launch(const SwapAbCall& c, int device, int sm_count, cudaStream_t stream,
                     cudaError_t* status) {
    if (kRowScale != (c.row_scale != nullptr)) return false;
    if (kTokenScale != (c.token_scale != nullptr)) return false;
    if (!Aligned16(c.w) || !Aligned16(c.x) || !Aligned16(c.y) || !Aligned16(c.row_scale))
      return false;
    const auto args = Arguments(c, device, sm_count);
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return false;
    const size_t workspace_bytes = Gemm::get_workspace_size(args);
    // A stream-K call that CUTLASS's heuristic runs as whole tiles (few K steps, or a last
    // wave at least half full) needs no workspace: then the caller's ping-pong tile, which
    // was measured for that case, runs instead of the cooperative one.
    if (kStreamK && workspace_bytes == 0) return false;
    if (workspace_bytes > 0 && (c.workspace == nullptr || workspace_bytes > c.workspace_bytes ||
                                !Aligned16(c.workspace)))
      return false;
    Gemm gemm;
    // run() first zeroes the barriers in the workspace (a memset on the stream), then launches.
    const cutlass::Status s =
        gemm.run(args, workspace_bytes > 0 ? c.workspace : nullptr, stream);
    *status = s == cutlass::Status::kSuccess ? cudaGetLastError() : cudaErrorLaunchFailure;
    return true;
  }
};

// Launches the call on the current device with the tile for its token count: Small up to
// kSmallMaxTokens, Medium up to kMediumMaxTokens, Large beyond; false (nothing launched) where
// the device cannot run sm_90a code, a size passes CUTLASS's int, or the tile's Launch
// declines. Past its token width a tile reads each weight tile once per token tile. `extra`
// (e.g. block scales) goes last to the tile's Launch.
template <class Small, class Medium, class Large, int64_t kSmallMaxTokens = 32,
          int64_t kMediumMaxTokens = 128, class... Extra>
bool LaunchByTokens(const SwapAbCall& c, cudaStream_t stream, cudaError_t* status,
                    const Extra&... extra) {
  int device = 0, sms = 0;
  if (!CurrentSm90Device(&device, &sms)) return false;
  constexpr int64_t kIntMax = 2147483647;
  if (c.tokens > kIntMax || c.in > kIntMax || c.out > kIntMax) return false;
  if (c.tokens <= kSmallMaxTokens)
    return Small::Launch(c, device, sms, stream, status, extra...);
  if (c.tokens <= kMediumMaxTokens)
    return Medium::Launch(c, device, sms, stream, status, extra...);
  return Large::Launch(c, device, sms, stream, status, extra...);
}

// Beyond kNarrowTokens, Wide (a tile over more tokens, or over more rows and tokens, than
// Narrow) where its tiles still cover at least half the SMs; else Narrow, whose more numerous
// tiles keep more SMs streaming the weight. Up to kNarrowTokens, Narrow. Used at 65-128 tokens
// (a 64-token tile, which then reads each weight tile twice, against one 128-token tile) and,
// for W8A8, beyond 128 (the 64-row tile against the 128-row cooperative one). On an H200 (132
// SMs), at 96 and 128 tokens Wide won on gate_up 14336 x 4096 (W8A16, 112 tiles of 128 rows:
// 33 against 58 us; W8A8, 224 of 64: 30 against 36) and on qkv for W8A8 (96 tiles), and lost
// on o and down, where it left most SMs idle (W8A16: 32 tiles; W8A8: 64); at 256 tokens the
// same split for the cooperative tile (docs/design/gemm.md).
// `extra` (block scales) goes last to the tiles' Launch, as in LaunchByTokens.
template <class Narrow, class Wide, int64_t kNarrowTokens = 64>
struct WideWhereItFillsTheSms {
  template <class... Extra>
  static bool Launch(const SwapAbCall& c, int device, int sm_count, cudaStream_t stream,
                     cudaError_t* status, const Extra&... extra) {
    const int64_t wide_tiles = (c.out + Wide::kTileRows - 1) / Wide::kTileRows *
                               ((c.tokens + Wide::kTileTokens - 1) / Wide::kTileTokens);
    return (c.tokens > kNarrowTokens && 2 * wide_tiles >= sm_count &&
            Wide::Launch(c, device, sm_count, stream, status, extra...)) ||
           Narrow::Launch(c, device, sm_count, stream, status, extra...);
  }
};

}  // namespace xla_kernels::gemm
