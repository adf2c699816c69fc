// linear's Hopper path, called by linear.cu (defined in linear_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace xla_kernels::linear {

struct Sm90Linear {
  const void* x;
  const void* w;
  void* y;
  int64_t tokens, in, out;
  bool bf16;
};

// Launches y = x · w^T on the Hopper path and returns true (the launch's status in *status),
// or returns false having launched nothing: not bf16, not a compute capability 9.0 device, a
// call CUTLASS cannot run (rows not 16-byte multiples, misaligned pointers), or a library
// built without CUTLASS.
bool LaunchSm90(cudaStream_t stream, const Sm90Linear& call, cudaError_t* status);

}  // namespace xla_kernels::linear
