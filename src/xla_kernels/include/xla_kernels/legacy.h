// Adapter that runs a kernel written for XLA's original custom-call API
//   void fn(cudaStream_t stream, void** buffers, const char* opaque, size_t opaque_len)
// as a typed XLA FFI handler (API_VERSION_TYPED_FFI). The kernel source is unchanged;
// xla-kernels generates one translation unit that includes it and expands one macro:
//
//   #include "my_legacy_kernel.cu"
//   XLA_KERNELS_LEGACY_CUDA_HANDLER(XlaKernelsLegacy_MyKernel, MyKernel);
//
// buffers[] holds the operands, then the results, in order, as the old API did; the
// opaque bytes come from the op's `opaque` attribute (an array of u8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace xla_kernels::legacy {

namespace ffi = xla::ffi;

// Collects operand then result addresses in the order the old API passed them.
inline ffi::Error CollectBuffers(ffi::RemainingArgs args, ffi::RemainingRets rets,
                                 std::vector<void*>& buffers) {
  buffers.clear();
  buffers.reserve(args.size() + rets.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto arg = args.get<ffi::AnyBuffer>(i);
    if (arg.has_error()) return arg.error();
    buffers.push_back(arg.value().untyped_data());
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto ret = rets.get<ffi::AnyBuffer>(i);
    if (ret.has_error()) return ret.error();
    buffers.push_back(ret.value()->untyped_data());
  }
  return ffi::Error::Success();
}

inline const char* OpaqueData(ffi::Span<const uint8_t> opaque) {
  return opaque.size() ? reinterpret_cast<const char*>(opaque.begin()) : "";
}

}  // namespace xla_kernels::legacy

// A host kernel with the same signature; the stream argument is a null void*.
#define XLA_KERNELS_LEGACY_CPU_HANDLER(handler_name, legacy_fn)                          \
  static xla::ffi::Error handler_name##_Impl(xla::ffi::RemainingArgs args,               \
                                             xla::ffi::RemainingRets rets,               \
                                             xla::ffi::Span<const uint8_t> opaque) {     \
    std::vector<void*> buffers;                                                          \
    xla::ffi::Error collected = ::xla_kernels::legacy::CollectBuffers(args, rets, buffers); \
    if (collected.failure()) return collected;                                           \
    legacy_fn(nullptr, buffers.data(), ::xla_kernels::legacy::OpaqueData(opaque),        \
              opaque.size());                                                            \
    return xla::ffi::Error::Success();                                                   \
  }                                                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(handler_name, handler_name##_Impl,                       \
                                xla::ffi::Ffi::Bind()                                    \
                                    .RemainingArgs()                                     \
                                    .RemainingRets()                                     \
                                    .Attr<xla::ffi::Span<const uint8_t>>("opaque"))

#ifdef __CUDACC__
#include <cuda_runtime.h>

#define XLA_KERNELS_LEGACY_CUDA_HANDLER(handler_name, legacy_fn)                         \
  static xla::ffi::Error handler_name##_Impl(cudaStream_t stream,                        \
                                             xla::ffi::RemainingArgs args,               \
                                             xla::ffi::RemainingRets rets,               \
                                             xla::ffi::Span<const uint8_t> opaque) {     \
    std::vector<void*> buffers;                                                          \
    xla::ffi::Error collected = ::xla_kernels::legacy::CollectBuffers(args, rets, buffers); \
    if (collected.failure()) return collected;                                           \
    legacy_fn(stream, buffers.data(), ::xla_kernels::legacy::OpaqueData(opaque),         \
              opaque.size());                                                            \
    cudaError_t status = cudaGetLastError();                                             \
    if (status != cudaSuccess)                                                           \
      return xla::ffi::Error::Internal(std::string(#legacy_fn ": CUDA error: ") +        \
                                       cudaGetErrorString(status));                      \
    return xla::ffi::Error::Success();                                                   \
  }                                                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(handler_name, handler_name##_Impl,                       \
                                xla::ffi::Ffi::Bind()                                    \
                                    .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()       \
                                    .RemainingArgs()                                     \
                                    .RemainingRets()                                     \
                                    .Attr<xla::ffi::Span<const uint8_t>>("opaque"))
#endif  // __CUDACC__
