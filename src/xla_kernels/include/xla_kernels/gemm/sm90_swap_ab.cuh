// A Hopper GEMM for linear layers, built from CUTLASS 3.x's sm90 collectives (TMA loads, wgmma,
// warp-specialized ping-pong consumers, persistent tile scheduler), in the swap-AB form decode
// needs: D[out, tokens] = W[out, in] · x[tokens, in]^T, so the weight's rows fill wgmma's M
// (64 or 128) and the few tokens are its N tile (16, 64, ...). Both operands are K-major (the
// weight as torch stores it, x row-major); D column-major is y [tokens, out] row-major, so
// nothing is transposed. f32 accumulation, the result rounded once to the output type.
// Needs -DNDEBUG (CUTLASS's device asserts otherwise serialize every wgmma) and sm_90a.
// docs/design/gemm.md: why CUTLASS here, the tiles, and what they measured.
#pragma once

#ifndef NDEBUG
#error "sm90_swap_ab.cuh needs -DNDEBUG (CUTLASS's device asserts serialize the wgmma pipeline)"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace xla_kernels::gemm {

// One call: y [tokens, out] = x [tokens, in] · w [out, in]^T, all row-major.
struct SwapAbCall {
  const void* w;
  const void* x;
  void* y;
  int64_t tokens, in, out;
  int device, sm_count;
};

// The tile (kTM weight rows x kTN tokens x kTK of in) of one ping-pong consumer warp group.
template <class Element, int kTM, int kTN, int kTK>
struct Sm90SwapAbGemm {
  using TileShape = cute::Shape<cute::Int<kTM>, cute::Int<kTN>, cute::Int<kTK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static constexpr int kAlign = 16 / sizeof(Element);

  // No C operand: y is written, never read (beta = 0).
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::ColumnMajor, kAlign, Element, cutlass::layout::ColumnMajor, kAlign,
      cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor,
      kAlign, Element, cutlass::layout::ColumnMajor, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments Arguments(const SwapAbCall& c) {
    using Stride = typename Gemm::GemmKernel;
    const int m = static_cast<int>(c.out), n = static_cast<int>(c.tokens),
              k = static_cast<int>(c.in);
    const auto sa = cutlass::make_cute_packed_stride(typename Stride::StrideA{},
                                                     cute::make_shape(m, k, 1));
    const auto sb = cutlass::make_cute_packed_stride(typename Stride::StrideB{},
                                                     cute::make_shape(n, k, 1));
    const auto sd = cutlass::make_cute_packed_stride(typename Stride::StrideD{},
                                                     cute::make_shape(m, n, 1));
    cutlass::KernelHardwareInfo hw;
    hw.device_id = c.device;
    hw.sm_count = c.sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const Element*>(c.w), sa, static_cast<const Element*>(c.x), sb},
        {{}, nullptr, sd, static_cast<Element*>(c.y), sd},
        hw};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    return args;
  }

  // Launches the GEMM; false (nothing launched) when CUTLASS cannot run this call (alignment,
  // sizes) or it would need a workspace, which this caller does not have.
  static bool Launch(const SwapAbCall& c, cudaStream_t stream, cudaError_t* status) {
    const auto args = Arguments(c);
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return false;
    if (Gemm::get_workspace_size(args) != 0) return false;
    Gemm gemm;
    const cutlass::Status s = gemm.run(args, nullptr, stream);
    *status = s == cutlass::Status::kSuccess ? cudaGetLastError() : cudaErrorLaunchFailure;
    return true;
  }
};

}  // namespace xla_kernels::gemm
