// fp8_linear's Hopper path (weight-only, per-channel scales, bf16 x, compute capability 9.0):
// CUTLASS's sm90 mixed-input ping-pong GEMM in the swap-AB form (xla_kernels/gemm/
// sm90_swap_ab.cuh): the e4m3 weight tile is converted to bf16 in registers, x stays bf16, the
// sums are f32 and the channel scale multiplies them in the epilogue before the one rounding.
// Built only where CUTLASS's headers are on the include path, as linear's (linear_sm90.cu).
#include <cuda_runtime.h>

#include "fp8_linear_sm90.h"

#if __has_include("cute/tensor.hpp") && __has_include("cutlass/util/packed_stride.hpp")
#define XK_FP8_LINEAR_CUTLASS 1
#include "xla_kernels/gemm/sm90_swap_ab.cuh"
#else
#define XK_FP8_LINEAR_CUTLASS 0
#endif

namespace xla_kernels::fp8_linear {

#if XK_FP8_LINEAR_CUTLASS
namespace {

using E4m3 = cutlass::float_e4m3_t;
using Bf16 = cutlass::bfloat16_t;
// The tiles by token count: linear's shapes (docs/design/gemm.md), with K steps of 128 (a
// 128-byte e4m3 row per weight row) at 16 and 64 tokens; not swept for e4m3 yet.
using SmallTile = gemm::Sm90SwapAbGemm<E4m3, Bf16, 64, 16, 128, true>;
using MediumTile = gemm::Sm90SwapAbGemm<E4m3, Bf16, 64, 64, 128, true>;
using LargeTile = gemm::Sm90SwapAbGemm<E4m3, Bf16, 128, 128, 64, true>;

}  // namespace

bool LaunchSm90(cudaStream_t stream, const gemm::SwapAbCall& call, cudaError_t* status) {
  if (call.row_scale == nullptr) return false;
  return gemm::LaunchByTokens<SmallTile, MediumTile, LargeTile>(call, stream, status);
}

#else

bool LaunchSm90(cudaStream_t, const gemm::SwapAbCall&, cudaError_t*) { return false; }

#endif

}  // namespace xla_kernels::fp8_linear

// Whether this library has the Hopper path (xla_kernels.kernels.fp8_linear.hopper_path_built).
extern "C" __attribute__((visibility("default"))) int XkFp8LinearHasSm90() {
  return XK_FP8_LINEAR_CUTLASS;
}
