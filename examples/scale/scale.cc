// y = x * factor, on the host. One XLA FFI handler; xla-kernels builds and registers it.
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error ScaleCpuImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y,
                               float factor) {
  for (size_t i = 0; i < x.element_count(); ++i) y->typed_data()[i] = x.typed_data()[i] * factor;
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaleCpu, ScaleCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("factor"));
