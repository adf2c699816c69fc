// Adapters that run a kernel written for XLA's original custom-call API as a typed XLA FFI
// handler (API_VERSION_TYPED_FFI). The kernel source is unchanged; xla-kernels compiles
// legacy_adapter.cc/.cu, which includes it and expands one of these macros:
//
//   XLA_KERNELS_LEGACY_CUDA_HANDLER(XlaKernelsLegacy_MyKernel, MyKernel);
//     void fn(cudaStream_t stream, void** buffers, const char* opaque, size_t opaque_len)
//   XLA_KERNELS_LEGACY_CPU_HANDLER(XlaKernelsLegacy_MyKernel, MyKernel);
//     void fn(void* stream /* null */, void** buffers, const char* opaque, size_t opaque_len)
//   XLA_KERNELS_LEGACY_CPU_CLASSIC_HANDLER(XlaKernelsLegacy_MyKernel, MyKernel);
//     void fn(void* out, const void** in)
//     void fn(void* out, const void** in, XlaCustomCallStatus* status)
//
// buffers[] holds the operands, then the results, in order, as the old API did; the
// opaque bytes come from the op's `opaque` attribute (an array of u8). In the classic CPU
// form, in[] holds the operands; `out` is the result buffer when there is one result and,
// as in XLA's tuple-result convention, an array of result pointers (void**) when there are
// several.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/custom_call_status.h"

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

// Calls a classic CPU function, with or without the XlaCustomCallStatus* argument: which
// form it has is read off its type, so one adapter serves both.
template <typename Fn>
ffi::Error CallClassicCpu(Fn* fn, const char* name, ffi::RemainingArgs args,
                          ffi::RemainingRets rets) {
  std::vector<void*> buffers;
  ffi::Error collected = CollectBuffers(args, rets, buffers);
  if (collected.failure()) return collected;
  std::vector<const void*> in(buffers.begin(), buffers.begin() + args.size());
  std::vector<void*> outs(buffers.begin() + args.size(), buffers.end());
  // One result: the buffer itself. Several: XLA passed a tuple, i.e. a table of pointers.
  void* out = outs.size() == 1 ? outs[0] : static_cast<void*>(outs.data());
  if constexpr (std::is_invocable_v<Fn*, void*, const void**>) {
    fn(out, in.data());
    return ffi::Error::Success();
  } else {
    static_assert(std::is_invocable_v<Fn*, void*, const void**, XlaCustomCallStatus*>,
                  "a classic CPU custom call must be void fn(void* out, const void** in) or "
                  "void fn(void* out, const void** in, XlaCustomCallStatus* status)");
    XlaCustomCallStatus status;
    fn(out, in.data(), &status);
    if (status.failed) return ffi::Error::Internal(std::string(name) + ": " + status.message);
    return ffi::Error::Success();
  }
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

// A host kernel in the classic CPU form `void fn(void* out, const void** in)` (optionally
// with a trailing XlaCustomCallStatus*). It takes no opaque bytes; the op's `opaque`
// attribute is accepted and ignored so every legacy op has the same attributes.
#define XLA_KERNELS_LEGACY_CPU_CLASSIC_HANDLER(handler_name, legacy_fn)                  \
  static xla::ffi::Error handler_name##_Impl(xla::ffi::RemainingArgs args,               \
                                             xla::ffi::RemainingRets rets,               \
                                             xla::ffi::Span<const uint8_t> opaque) {     \
    (void)opaque;                                                                        \
    return ::xla_kernels::legacy::CallClassicCpu(&legacy_fn, #legacy_fn, args, rets);    \
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
