// Programmatic dependent launch (PDL, Hopper and newer): a kernel launched with
// launch_kernel(..., pdl = true) may be scheduled while the kernel before it on the stream
// is still running. It must call pdl_wait() before it reads or writes any global memory
// that an earlier kernel touches: griddepcontrol.wait returns once every earlier grid has
// completed and its writes are visible, so results are those of plain stream order; only
// the launch latency and the previous kernel's tail overlap. pdl_launch_dependents() lets
// the next PDL-launched kernel be scheduled before this one ends (it then waits in its own
// pdl_wait()). Both are no-ops below sm_90 and when the launch did not ask for PDL.
//
//   __global__ void k(Args a) { pdl_wait(); pdl_launch_dependents(); ... }
//   launch_kernel(k, grid, block, smem, stream, pdl_enabled(device), args);
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace xla_kernels::cuda_pdl {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kernels on `device` (compute capability >= 9.0) should be launched with PDL.
inline bool pdl_enabled(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return false;
  return major >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL launch attribute when `pdl`.
template <typename... Params, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace xla_kernels::cuda_pdl
