// reshape_and_cache on NVIDIA GPUs: one CTA per token; its threads copy the token's
// num_kv_heads rows of key and value into the slot, 16 bytes per thread and step where rows
// allow it (head_dim * element size a multiple of 16, buffers 16-byte aligned), else one
// element at a time.
// Bandwidth-bound: it reads and writes each new row once. Into fp8 (f8e4m3fn) caches each
// element is quantized: x / scale in f32, cvt.rn.satfinite to e4m3 (round to nearest even,
// +-448 for anything larger, infinities too; NaN stays NaN), one element per thread and step
// (consecutive threads write consecutive bytes). Handler XkReshapeAndCacheCuda,
// command-buffer compatible (it only enqueues a kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "kv_cache_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace xla_kernels::kv_cache {
namespace {

template <typename Word>
__global__ void CopyRowsKernel(Layout l, const int32_t* __restrict__ slots,
                               const Word* __restrict__ key, const Word* __restrict__ value,
                               Word* __restrict__ key_cache, Word* __restrict__ value_cache,
                               int64_t words_per_row) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= l.capacity()) return;  // padding or out of range: skipped
  const int64_t words = l.num_kv_heads * words_per_row;
  const int64_t scale = l.head_dim / words_per_row;  // elements per word
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
    const int64_t h = i / words_per_row, w = i % words_per_row;
    const int64_t dst = l.RowOffset(slot, h) / scale + w;
    const int64_t src = t * words + i;
    key_cache[dst] = key[src];
    value_cache[dst] = value[src];
  }
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename Src>
__global__ void QuantizeRowsKernel(Layout l, const int32_t* __restrict__ slots,
                                   const Src* __restrict__ key, const Src* __restrict__ value,
                                   __nv_fp8_storage_t* __restrict__ key_cache,
                                   __nv_fp8_storage_t* __restrict__ value_cache, float k_scale,
                                   float v_scale) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= l.capacity()) return;  // padding or out of range: skipped
  const int64_t n = l.num_kv_heads * l.head_dim;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t h = i / l.head_dim, d = i % l.head_dim;
    const int64_t dst = l.RowOffset(slot, h) + d;
    key_cache[dst] = __nv_cvt_float_to_fp8(ToFloat(key[t * n + i]) / k_scale, __NV_SATFINITE,
                                           __NV_E4M3);
    value_cache[dst] = __nv_cvt_float_to_fp8(ToFloat(value[t * n + i]) / v_scale,
                                             __NV_SATFINITE, __NV_E4M3);
  }
}

template <typename Src>
void LaunchQuantize(cudaStream_t stream, dim3 grid, dim3 block, const Layout& l,
                    const int32_t* slots, const ffi::AnyBuffer& key, const ffi::AnyBuffer& value,
                    void* key_dst, void* value_dst, float k_scale, float v_scale) {
  QuantizeRowsKernel<Src><<<grid, block, 0, stream>>>(
      l, slots, static_cast<const Src*>(key.untyped_data()),
      static_cast<const Src*>(value.untyped_data()), static_cast<__nv_fp8_storage_t*>(key_dst),
      static_cast<__nv_fp8_storage_t*>(value_dst), k_scale, v_scale);
}

template <typename Word>
void LaunchCopy(cudaStream_t stream, dim3 grid, dim3 block, const Layout& l,
                const int32_t* slots, const ffi::AnyBuffer& key, const ffi::AnyBuffer& value,
                void* key_dst, void* value_dst, int64_t words_per_row) {
  CopyRowsKernel<Word><<<grid, block, 0, stream>>>(
      l, slots, static_cast<const Word*>(key.untyped_data()),
      static_cast<const Word*>(value.untyped_data()), static_cast<Word*>(key_dst),
      static_cast<Word*>(value_dst), words_per_row);
}

ffi::Error ReshapeAndCacheCuda(cudaStream_t stream, ffi::AnyBuffer key, ffi::AnyBuffer value,
                               ffi::AnyBuffer key_cache, ffi::AnyBuffer value_cache,
                               ffi::Buffer<ffi::S32> slot_mapping,
                               ffi::Result<ffi::AnyBuffer> key_out,
                               ffi::Result<ffi::AnyBuffer> value_out, std::string_view layout,
                               float k_scale, float v_scale) {
  Layout l;
  ffi::Error err = Decode(key, value, key_cache, value_cache, slot_mapping, *key_out, *value_out,
                          layout, k_scale, v_scale, &l);
  if (err.failure()) return err;
  if (l.num_tokens == 0 || l.num_kv_heads == 0 || l.head_dim == 0) return ffi::Error::Success();
  if (l.num_tokens > 0x7fffffff) return Bad("key", "too many tokens for one launch", "split it");
  const size_t elem = ElementSize(key.element_type());
  const size_t row_bytes = static_cast<size_t>(l.head_dim) * elem;
  const dim3 grid(static_cast<unsigned>(l.num_tokens)), block(128);
  const int32_t* slots = slot_mapping.typed_data();
  void* key_dst = key_out->untyped_data();
  void* value_dst = ValueDestination(*value_out, l);
  const bool aligned = ((reinterpret_cast<uintptr_t>(key.untyped_data()) |
                         reinterpret_cast<uintptr_t>(value.untyped_data()) |
                         reinterpret_cast<uintptr_t>(key_dst) |
                         reinterpret_cast<uintptr_t>(value_dst)) % 16) == 0;
  if (l.quantize) {
    switch (key.element_type()) {
      case ffi::DataType::BF16:
        LaunchQuantize<__nv_bfloat16>(stream, grid, block, l, slots, key, value, key_dst,
                                      value_dst, k_scale, v_scale);
        break;
      case ffi::DataType::F16:
        LaunchQuantize<__half>(stream, grid, block, l, slots, key, value, key_dst, value_dst,
                               k_scale, v_scale);
        break;
      default:
        LaunchQuantize<float>(stream, grid, block, l, slots, key, value, key_dst, value_dst,
                              k_scale, v_scale);
    }
  } else if (row_bytes % 16 == 0 && aligned) {
    LaunchCopy<uint4>(stream, grid, block, l, slots, key, value, key_dst, value_dst,
                      static_cast<int64_t>(row_bytes / 16));
  } else if (elem == 4) {
    LaunchCopy<uint32_t>(stream, grid, block, l, slots, key, value, key_dst, value_dst,
                         l.head_dim);
  } else {
    LaunchCopy<uint16_t>(stream, grid, block, l, slots, key, value, key_dst, value_dst,
                         l.head_dim);
  }
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess)
    return ffi::Error::Internal(std::string("xla_kernels.reshape_and_cache: launch failed: ") +
                                cudaGetErrorString(launch));
  return ffi::Error::Success();
}

ffi::Error ReshapeAndCacheFusedCuda(cudaStream_t stream, ffi::AnyBuffer key,
                                    ffi::AnyBuffer value, ffi::AnyBuffer kv_cache,
                                    ffi::Buffer<ffi::S32> slot_mapping,
                                    ffi::Result<ffi::AnyBuffer> kv_out, float k_scale,
                                    float v_scale) {
  return ReshapeAndCacheCuda(stream, key, value, kv_cache, kv_cache, slot_mapping, kv_out, kv_out,
                             "fused", k_scale, v_scale);
}

}  // namespace
}  // namespace xla_kernels::kv_cache

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkReshapeAndCacheCuda, xla_kernels::kv_cache::ReshapeAndCacheCuda,
                              xla_kernels::kv_cache::BindOperands(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkReshapeAndCacheFusedCuda,
                              xla_kernels::kv_cache::ReshapeAndCacheFusedCuda,
                              xla_kernels::kv_cache::BindFusedOperands(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
