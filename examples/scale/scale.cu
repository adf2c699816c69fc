// y = x * factor, on an NVIDIA GPU, on the stream XLA (or PyTorch) hands us.
#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

__global__ void ScaleKernel(const float* x, float* y, float factor, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = x[i] * factor;
}

static ffi::Error ScaleCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::F32> x,
                                ffi::ResultBuffer<ffi::F32> y, float factor) {
  const size_t n = x.element_count();
  if (n == 0) return ffi::Error::Success();
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535);
  ScaleKernel<<<blocks, 256, 0, stream>>>(x.typed_data(), y->typed_data(), factor, n);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(status));
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaleCuda, ScaleCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("factor"));
