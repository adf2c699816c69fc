// The handlers of docs/tutorial.md, on the host: an op updating its input in place, an
// elementwise product with its backward (a declared vjp), a clipped copy whose attributes
// are a float and an int list, and a row sum that reads its input's shape.
#include <algorithm>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// x *= factor; the result buffer is x's buffer (the op declares x in_place).
static ffi::Error ScaleInPlaceImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> out,
                                   float factor) {
  if (x.typed_data() != out->typed_data())
    return ffi::Error::InvalidArgument("tutorial.scale_: the result is not x's buffer");
  for (size_t i = 0; i < x.element_count(); ++i) out->typed_data()[i] *= factor;
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(TutScaleInPlace, ScaleInPlaceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("factor"));

// y = x * w, elementwise (the shape rule guarantees one size).
static ffi::Error MulImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                          ffi::ResultBuffer<ffi::F32> y) {
  for (size_t i = 0; i < x.element_count(); ++i)
    y->typed_data()[i] = x.typed_data()[i] * w.typed_data()[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(TutMul, MulImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// dx = dy * w, dw = dy * x.
static ffi::Error MulBwdImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                             ffi::Buffer<ffi::F32> dy, ffi::ResultBuffer<ffi::F32> dx,
                             ffi::ResultBuffer<ffi::F32> dw) {
  for (size_t i = 0; i < x.element_count(); ++i) {
    dx->typed_data()[i] = dy.typed_data()[i] * w.typed_data()[i];
    dw->typed_data()[i] = dy.typed_data()[i] * x.typed_data()[i];
  }
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(TutMulBwd, MulBwdImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// y = clamp(x, lo, hi) * gain, where bounds = {lo, hi}.
static ffi::Error ClipImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y, float gain,
                           ffi::Span<const int64_t> bounds) {
  if (bounds.size() != 2) return ffi::Error::InvalidArgument("tutorial.clip: bounds needs 2");
  const float lo = static_cast<float>(bounds[0]), hi = static_cast<float>(bounds[1]);
  for (size_t i = 0; i < x.element_count(); ++i)
    y->typed_data()[i] = std::min(std::max(x.typed_data()[i], lo), hi) * gain;
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(TutClip, ClipImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("gain")
                                  .Attr<ffi::Span<const int64_t>>("bounds"));

// y[r] = x[r, 0] + ... + x[r, cols - 1]: the handler reads the shape from its buffers (the
// declaration's rank=2 and shape rule guarantee x is 2-D and y has one entry per row).
static ffi::Error RowSumImpl(ffi::BufferR2<ffi::F32> x, ffi::ResultBufferR1<ffi::F32> y) {
  const auto dims = x.dimensions();  // {rows, cols}
  const int64_t rows = dims[0], cols = dims[1];
  if (y->dimensions()[0] != rows)
    return ffi::Error::InvalidArgument("tutorial.row_sum: y needs one entry per row of x");
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += x.typed_data()[r * cols + c];
    y->typed_data()[r] = sum;
  }
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(TutRowSum, RowSumImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::BufferR2<ffi::F32>>()
                                  .Ret<ffi::BufferR1<ffi::F32>>());
