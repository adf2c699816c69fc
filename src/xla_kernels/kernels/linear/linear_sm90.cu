// linear's Hopper path (bf16 on compute capability 9.0): CUTLASS's sm90 ping-pong GEMM in the
// swap-AB form (xla_kernels/gemm/sm90_swap_ab.cuh), one tile per token range, chosen from the
// measured sweep in docs/design/gemm.md. Built only where CUTLASS's headers are on the include
// path (xla_kernels/builder/cutlass.py); elsewhere LaunchSm90 launches nothing and linear.cu
// runs its other kernels. Decided by the headers' presence rather than a define, so that a
// prebuilt library (built with them) matches a machine without them.
#include <cuda_runtime.h>

#include "linear_sm90.h"

#if __has_include("cute/tensor.hpp") && __has_include("cutlass/util/packed_stride.hpp")
#define XK_LINEAR_CUTLASS 1
#include "xla_kernels/gemm/sm90_swap_ab.cuh"
#else
#define XK_LINEAR_CUTLASS 0
#endif

namespace xla_kernels::linear {

#if XK_LINEAR_CUTLASS
namespace {

using Bf16 = cutlass::bfloat16_t;
// Tokens <= 32: 64 weight rows x 16 tokens a tile, K in steps of 128; <= 128: 64 x 64 x 64;
// more: 128 x 128 x 64 (docs/design/gemm.md, the sweep).
using SmallTile = gemm::Sm90SwapAbGemm<Bf16, Bf16, 64, 16, 128, false>;
using MediumTile = gemm::Sm90SwapAbGemm<Bf16, Bf16, 64, 64, 64, false>;
using LargeTile = gemm::Sm90SwapAbGemm<Bf16, Bf16, 128, 128, 64, false>;

}  // namespace

bool LaunchSm90(cudaStream_t stream, const gemm::SwapAbCall& call, bool bf16,
                cudaError_t* status) {
  if (!bf16 || call.row_scale != nullptr) return false;
  return gemm::LaunchByTokens<SmallTile, MediumTile, LargeTile>(call, stream, status);
}

#else

bool LaunchSm90(cudaStream_t, const gemm::SwapAbCall&, bool, cudaError_t*) { return false; }

#endif

}  // namespace xla_kernels::linear

// Whether this library has the Hopper path (xla_kernels.kernels.linear.hopper_path_built).
extern "C" __attribute__((visibility("default"))) int XkLinearHasSm90() {
  return XK_LINEAR_CUTLASS;
}
