// simple_add on NVIDIA GPUs: a bandwidth-bound elementwise add and its XLA FFI binding.
//
// Each thread moves 16-byte vectors (kUnroll of them in flight per input before the first
// use); a scalar path takes the tail and any buffer that is not 16-byte aligned (possible
// for eager torch views). Measured on an H100 (benchmarks/results/h100/NOTES.md): one
// vector per thread with many CTAs beat unroll 2/4/8 by 1-2% at 2^26-2^28 elements, and
// streaming cache hints gained nothing, so the defaults are unroll 1, no hints.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/dtype_dispatch.h"

namespace ffi = xla::ffi;

namespace xla_kernels::simple_add {
namespace {

// Tuning knobs, compile-time (benchmarks/simple_add_variants.py measures them side by side).
#ifndef XK_SIMPLE_ADD_UNROLL
#define XK_SIMPLE_ADD_UNROLL 1
#endif
#ifndef XK_SIMPLE_ADD_STREAMING
#define XK_SIMPLE_ADD_STREAMING 0
#endif

constexpr int kThreads = 256;
constexpr int kUnroll = XK_SIMPLE_ADD_UNROLL;

// Every element is touched once: streaming (evict-first) loads and stores keep the data
// from displacing anything else in L2.
__device__ __forceinline__ uint4 Load(const uint4* p) {
  return XK_SIMPLE_ADD_STREAMING ? __ldcs(p) : __ldg(p);
}
__device__ __forceinline__ void Store(uint4* p, uint4 v) {
  if (XK_SIMPLE_ADD_STREAMING) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

template <typename T>
__device__ __forceinline__ T AddScalar(T x, T y) {
  return static_cast<T>(static_cast<float>(x) + static_cast<float>(y));
}
template <>
__device__ __forceinline__ float AddScalar(float x, float y) { return x + y; }

template <typename T>
__device__ __forceinline__ uint4 AddVector(uint4 x, uint4 y) {
  constexpr int kLanes = sizeof(uint4) / sizeof(T);
  const T* xs = reinterpret_cast<const T*>(&x);
  const T* ys = reinterpret_cast<const T*>(&y);
  uint4 r;
  T* rs = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int i = 0; i < kLanes; ++i) rs[i] = AddScalar(xs[i], ys[i]);
  return r;
}

template <typename T>
__global__ void AddVectorized(const uint4* __restrict__ a, const uint4* __restrict__ b,
                              uint4* __restrict__ out, int64_t vectors) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
    uint4 ra[kUnroll], rb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      ra[u] = Load(a + i + u * stride);
      rb[u] = Load(b + i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Store(out + i + u * stride, AddVector<T>(ra[u], rb[u]));
  }
  for (; i < vectors; i += stride) Store(out + i, AddVector<T>(Load(a + i), Load(b + i)));
}

template <typename T>
__global__ void AddScalars(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                           int64_t begin, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = AddScalar(a[i], b[i]);
}

int64_t Blocks(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return blocks < 1 ? 1 : (blocks > (1 << 30) ? (1 << 30) : blocks);
}

template <typename T>
void Launch(cudaStream_t stream, const void* a, const void* b, void* out, int64_t n) {
  constexpr int64_t kLanes = sizeof(uint4) / sizeof(T);
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
        reinterpret_cast<uintptr_t>(out)) % sizeof(uint4)) == 0;
  const int64_t vectors = aligned ? n / kLanes : 0;
  if (vectors > 0) {
    AddVectorized<T><<<Blocks((vectors + kUnroll - 1) / kUnroll), kThreads, 0, stream>>>(
        static_cast<const uint4*>(a), static_cast<const uint4*>(b), static_cast<uint4*>(out),
        vectors);
  }
  const int64_t done = vectors * kLanes;
  if (done < n) {
    AddScalars<T><<<Blocks(n - done), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), done, n);
  }
}

ffi::Error SimpleAddCudaImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                             ffi::Result<ffi::AnyBuffer> out) {
  if (a.element_type() != b.element_type() || a.element_type() != out->element_type())
    return ffi::Error::InvalidArgument("xla_kernels.simple_add: a, b and out differ in dtype");
  if (a.element_count() != b.element_count() || a.element_count() != out->element_count())
    return ffi::Error::InvalidArgument("xla_kernels.simple_add: a, b and out differ in size");
  const int64_t n = static_cast<int64_t>(a.element_count());
  if (n == 0) return ffi::Error::Success();
  switch (a.element_type()) {
    case ffi::DataType::F32:
      Launch<float>(stream, a.untyped_data(), b.untyped_data(), out->untyped_data(), n);
      break;
    case ffi::DataType::F16:
      Launch<__half>(stream, a.untyped_data(), b.untyped_data(), out->untyped_data(), n);
      break;
    case ffi::DataType::BF16:
      Launch<__nv_bfloat16>(stream, a.untyped_data(), b.untyped_data(), out->untyped_data(), n);
      break;
    default:
      return xla_kernels::UnsupportedDtype("xla_kernels.simple_add", a.element_type(),
                                           "f16, bf16, f32");
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    return ffi::Error::Internal(std::string("xla_kernels.simple_add: launch failed: ") +
                                cudaGetErrorString(status));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::simple_add

XLA_FFI_DEFINE_HANDLER_SYMBOL(XlaKernelsSimpleAddCuda, xla_kernels::simple_add::SimpleAddCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});
