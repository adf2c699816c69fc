// W8A8 with block-scaled weights (DeepSeek-style 128 x 128 blocks) on Hopper: CUTLASS's sm90
// fp8 GEMM with blockwise scaling in the mainloop, in the swap-AB form of sm90_swap_ab.cuh
// (D[out, tokens] = W[out, in] · x[tokens, in]^T, both operands e4m3 and K-major). The f32
// sums of each 128-wide K block are multiplied by the weight block's scale and the token's
// scale as the mainloop promotes them, so the epilogue only rounds to bf16.
//
// The scales in the layouts CUTLASS's sm90 blockwise mainloop reads (both MN-major, f32):
// - the weight's: one per 64 weight rows x 128 columns, [ceil(in / 128)][ceil(out / 64)]
//   (a 128-row block's scale written for each of its two 64-row halves, so that the 64-row
//   ping-pong tiles of the W8A8 path serve it; the 128-row cooperative tile reads two);
// - x's: one per token x 128 columns, [ceil(in / 128)][tokens rounded up to 4] (the token's
//   one scale repeated per block; the row padded to 16 bytes, which TMA needs).
// The caller writes both (fp8_linear.cu) into the op's workspace.
// Needs -DNDEBUG and sm_90a, as sm90_swap_ab.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "xla_kernels/gemm/sm90_call.h"
#include "xla_kernels/gemm/sm90_device.cuh"
#include "xla_kernels/gemm/sm90_swap_ab.cuh"

namespace xla_kernels::gemm {

// A kTM-row x kTN-token tile, K steps of 128 (one scale block per step): 64 rows ping-pong,
// or 128 rows cooperative (Cooperative: 64 rows per consumer warp group, each with the 64-row
// scale group of its half).
template <int kTN, int kTM = kBlockScaleRows, class Schedule = PingPong>
struct Sm90SwapAbBlockwiseGemm {
  static constexpr bool kCooperative = std::is_same_v<Schedule, Cooperative>;
  static_assert(kCooperative ? kTM == 2 * kBlockScaleRows : kTM == kBlockScaleRows,
                "64 rows ping-pong or 128 cooperative");
  static constexpr int kTileRows = kTM, kTileTokens = kTN;
  using E4m3 = cutlass::float_e4m3_t;
  using Bf16 = cutlass::bfloat16_t;
  using TileShape = cute::Shape<cute::Int<kTM>, cute::Int<kTN>, cute::Int<kBlockScaleCols>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<kBlockScaleRows, 1, kBlockScaleCols>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  static constexpr int kAlignY = 16 / sizeof(Bf16);

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::ColumnMajor, kAlignY, Bf16, cutlass::layout::ColumnMajor, kAlignY,
      std::conditional_t<kCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                         cutlass::epilogue::TmaWarpSpecialized>,
      cutlass::epilogue::fusion::LinearCombination<Bf16, float, void, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4m3,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16, E4m3,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      std::conditional_t<kCooperative,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum,
                         cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8BlockScaledAccum>>::
      CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments Arguments(const SwapAbCall& c, const BlockScales& scales,
                                            int device, int sm_count) {
    const SwapAbShape<Kernel> s(c, device, sm_count);
    const int m = s.m, n = s.n, k = s.k;
    const auto layout_sfa = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    // x's scales: the padded token count is both the K-block stride and the extent (TMA
    // loads the scales of the 64- and 128-token tiles and wants 16-byte rows; CUTLASS
    // declines an extent of n that is not a multiple of 4). The padding holds zeros; the
    // tokens past n are never stored.
    const int k_blocks = (k + kBlockScaleCols - 1) / kBlockScaleCols;
    const int stride = static_cast<int>(scales.token_stride);
    const LayoutSFB layout_sfb = cute::make_layout(
        cute::make_shape(cute::make_shape(cute::_1{}, stride),
                         cute::make_shape(cute::Int<kBlockScaleCols>{}, k_blocks), 1),
        cute::make_stride(cute::make_stride(cute::_0{}, cute::_1{}),
                          cute::make_stride(cute::_0{}, stride), stride * k_blocks));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const E4m3*>(c.w), s.a, static_cast<const E4m3*>(c.x), s.b, scales.weight,
         layout_sfa, scales.tokens, layout_sfb},
        {{}, nullptr, s.d, static_cast<Bf16*>(c.y), s.d},
        s.hw};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    return args;
  }

  // As Sm90SwapAbGemm::Launch, the block scales last: false (nothing launched) where CUTLASS
  // cannot run the call.
  static bool Launch(const SwapAbCall& c, int device, int sm_count, cudaStream_t stream,
                     cudaError_t* status, const BlockScales& scales) {
    if (!Aligned16(c.w) || !Aligned16(c.x) || !Aligned16(c.y) || !Aligned16(scales.weight) ||
        !Aligned16(scales.tokens) || scales.token_stride % 4 != 0)
      return false;
    const auto args = Arguments(c, scales, device, sm_count);
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return false;
    if (Gemm::get_workspace_size(args) > 0) return false;  // ping-pong and cooperative need none
    Gemm gemm;
    const cutlass::Status s = gemm.run(args, nullptr, stream);
    *status = s == cutlass::Status::kSuccess ? cudaGetLastError() : cudaErrorLaunchFailure;
    return true;
  }
};

}  // namespace xla_kernels::gemm
