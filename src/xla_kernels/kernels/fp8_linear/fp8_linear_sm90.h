// fp8_linear's Hopper path, called by fp8_linear.cu (defined in fp8_linear_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include "xla_kernels/gemm/sm90_call.h"

namespace xla_kernels::fp8_linear {

// Launches the call (e4m3 weights, bf16 x and y, f32 row_scale: weight-only with one scale per
// output channel) on the Hopper path and returns true (the launch's status in *status), or
// returns false having launched nothing: not a compute capability 9.0 device, a call CUTLASS
// cannot run (in not a multiple of 16, misaligned pointers), or a library built without
// CUTLASS.
bool LaunchSm90(cudaStream_t stream, const gemm::SwapAbCall& call, cudaError_t* status);

// W8A8 on the same path: x already quantized to e4m3 per token (call.x, [tokens, in] row-major,
// its scales in call.token_scale), e4m3 wgmma, both scales applied to the f32 sums, bf16 y.
// Same contract as LaunchSm90.
bool LaunchSm90W8A8(cudaStream_t stream, const gemm::SwapAbCall& call, cudaError_t* status);

// W8A8 with 128 x 128 block-scaled weights: x already quantized per token (call.x), the
// scales in CUTLASS's blockwise layouts (gemm::BlockScales; call.row_scale and
// call.token_scale unused), e4m3 wgmma with the scales applied per K block, bf16 y. Same
// contract as LaunchSm90.
bool LaunchSm90W8A8BlockScaled(cudaStream_t stream, const gemm::SwapAbCall& call,
                               const gemm::BlockScales& scales, cudaError_t* status);

// Whether the Hopper path can run on the current device (library built with CUTLASS, compute
// capability 9.0): a caller that must prepare an operand first (W8A8's quantized x) asks.
bool Sm90PathRuns();

}  // namespace xla_kernels::fp8_linear
