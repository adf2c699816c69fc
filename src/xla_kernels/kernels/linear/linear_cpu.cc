// linear on the host: each output the f32 dot product of a row of x and a row of the
// weight, rounded once to x's dtype. A reference, not tuned. Handler XkLinearCpu.
#include <cstdint>
#include <vector>

#include "linear_ffi.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::linear {
namespace {

template <ffi::DataType DT>
void Run(const Shape& s, const void* x, const void* weight, void* y) {
  using E = HostElem<DT>;
  const auto* xp = static_cast<const typename E::T*>(x);
  const auto* wp = static_cast<const typename E::T*>(weight);
  auto* yp = static_cast<typename E::T*>(y);
  std::vector<float> xf(static_cast<size_t>(s.tokens * s.in));
  for (int64_t i = 0; i < s.tokens * s.in; ++i) xf[i] = static_cast<float>(E::Load(xp[i]));
  std::vector<float> w(static_cast<size_t>(s.in));
  for (int64_t o = 0; o < s.out; ++o) {
    for (int64_t i = 0; i < s.in; ++i) w[i] = static_cast<float>(E::Load(wp[o * s.in + i]));
    for (int64_t t = 0; t < s.tokens; ++t) {
      const float* xr = xf.data() + t * s.in;
      float acc = 0.f;
      for (int64_t i = 0; i < s.in; ++i) acc += xr[i] * w[i];
      yp[t * s.out + o] = E::Store(acc);
    }
  }
}

ffi::Error LinearCpu(ffi::AnyBuffer x, ffi::AnyBuffer weight, ffi::Result<ffi::AnyBuffer> y) {
  Shape s;
  if (ffi::Error e = Decode(x, weight, *y, &s); e.failure()) return e;
  switch (s.dtype) {
    case ffi::DataType::BF16: Run<ffi::DataType::BF16>(s, x.untyped_data(), weight.untyped_data(), y->untyped_data()); break;
    case ffi::DataType::F16: Run<ffi::DataType::F16>(s, x.untyped_data(), weight.untyped_data(), y->untyped_data()); break;
    default: Run<ffi::DataType::F32>(s, x.untyped_data(), weight.untyped_data(), y->untyped_data()); break;
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::linear

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkLinearCpu, xla_kernels::linear::LinearCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
