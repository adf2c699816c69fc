// linear's Hopper path, called by linear.cu (defined in linear_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include "xla_kernels/gemm/sm90_call.h"

namespace xla_kernels::linear {

// Launches the call (no row scale) on the Hopper path and returns true (the launch's status in
// *status), or returns false having launched nothing: not bf16, not a compute capability 9.0
// device, a call CUTLASS cannot run (rows not 16-byte multiples, misaligned pointers), or a
// library built without CUTLASS.
bool LaunchSm90(cudaStream_t stream, const gemm::SwapAbCall& call, bool bf16,
                cudaError_t* status);

}  // namespace xla_kernels::linear
