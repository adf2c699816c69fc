// f32, bf16 and f16 <-> f32 in device code (CUDA's intrinsics; to half: round to nearest
// even), for kernels that load any of the three and compute in f32.
//
//   #include "xla_kernels/cuda_f32.cuh"
//   float v = xla_kernels::ToF32(x[i]);
//   y[i] = xla_kernels::FromF32<T>(v * 2.f);
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace xla_kernels {

__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF32(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromF32(float v);
template <>
__device__ __forceinline__ float FromF32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float v) { return __float2half_rn(v); }

}  // namespace xla_kernels
