// linear on NVIDIA GPUs (design and measurements in docs/design/gemm.md). Handler
// XkLinearCuda, command-buffer compatible, one launch:
// * bf16 on compute capability 9.0, where the library was built with CUTLASS: the Hopper
//   GEMM (linear_sm90.cu);
// * bf16 / f16 with 16-byte rows: the skinny GEMM (xla_kernels/gemm/skinny_kernel.cuh);
// * f32, or rows that are not whole 16 bytes: CUDA cores, one warp per output element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "linear_ffi.h"
#include "linear_sm90.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/gemm/skinny_kernel.cuh"

namespace ffi = xla::ffi;

namespace xla_kernels::linear {
namespace {

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__half v) { return __half2float(v); }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ inline T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return gemm::FromFloat<T>(v);
  }
}

constexpr int kWarpsPerCta = 8;

// y[t, o] for o = one warp's output: lanes stride over in, then a shuffle sum.
template <typename T>
__global__ void __launch_bounds__(32 * kWarpsPerCta)
    LinearWarpKernel(const T* x, const T* w, T* y, int64_t tokens, int64_t in, int64_t out) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= out) return;
  const T* wr = w + o * in;
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const T* xr = x + t * in;
    float acc = 0.f;
    for (int64_t i = lane; i < in; i += 32) acc += ToFloat(xr[i]) * ToFloat(wr[i]);
    for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (lane == 0) y[t * out + o] = FromFloat<T>(acc);
  }
}

template <typename T>
cudaError_t LaunchWarps(cudaStream_t stream, const Shape& s, const void* x, const void* w,
                        void* y) {
  const dim3 grid(static_cast<unsigned>((s.out + kWarpsPerCta - 1) / kWarpsPerCta),
                  static_cast<unsigned>(s.tokens < 65535 ? s.tokens : 65535));
  LinearWarpKernel<T><<<grid, 32 * kWarpsPerCta, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), s.tokens, s.in,
      s.out);
  return cudaGetLastError();
}

// The fastest kernel that takes the call: the Hopper GEMM, else the skinny GEMM (bf16 / f16,
// rows it supports), else one warp per output.
cudaError_t Launch(cudaStream_t stream, const Shape& s, const gemm::SkinnyParams& p) {
  cudaError_t status = cudaSuccess;
  const gemm::SwapAbCall hopper{p.w, p.x, p.y, nullptr, s.tokens, s.in, s.out};
  if (LaunchSm90(stream, hopper, s.dtype == ffi::DataType::BF16, &status)) return status;
  if (s.dtype != ffi::DataType::F32 && gemm::SkinnySupports(p, /*fp8=*/false)) {
    return s.dtype == ffi::DataType::BF16
               ? gemm::LaunchSkinny<__nv_bfloat16, __nv_bfloat16>(stream, p, false)
               : gemm::LaunchSkinny<__half, __half>(stream, p, false);
  }
  switch (s.dtype) {
    case ffi::DataType::BF16: return LaunchWarps<__nv_bfloat16>(stream, s, p.x, p.w, p.y);
    case ffi::DataType::F16: return LaunchWarps<__half>(stream, s, p.x, p.w, p.y);
    default: return LaunchWarps<float>(stream, s, p.x, p.w, p.y);
  }
}

ffi::Error LinearCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                      ffi::Result<ffi::AnyBuffer> y) {
  Shape s;
  if (ffi::Error e = Decode(x, weight, *y, &s); e.failure()) return e;
  if (s.tokens == 0) return ffi::Error::Success();
  gemm::SkinnyParams p{};
  p.x = x.untyped_data();
  p.w = weight.untyped_data();
  p.y = y->untyped_data();
  p.tokens = s.tokens;
  p.k = s.in;
  p.n = s.out;
  p.bn = 1;
  if (const cudaError_t status = Launch(stream, s, p); status != cudaSuccess)
    return ffi::Error::Internal(std::string(kOp) + ": CUDA error: " + cudaGetErrorString(status));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::linear

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkLinearCuda, xla_kernels::linear::LinearCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});
