// simple_add on the host: the kernel core and its XLA FFI binding.
#include <cstdint>

#include "simple_add.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/dtype_dispatch.h"
#include "xla_kernels/half.h"

namespace ffi = xla::ffi;

namespace xla_kernels::simple_add {
namespace {

// f16 and bf16 are added in f32 and rounded to nearest even, as XLA does
// (xla_kernels/half.h converts).
template <typename T>
void AddSame(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void AddHalf(const uint16_t* a, const uint16_t* b, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Store(Load(a[i]) + Load(b[i]));
}

}  // namespace

void AddHost(Dtype dtype, const void* a, const void* b, void* out, int64_t n) {
  switch (dtype) {
    case Dtype::kF32:
      return AddSame(static_cast<const float*>(a), static_cast<const float*>(b),
                     static_cast<float*>(out), n);
    case Dtype::kF64:
      return AddSame(static_cast<const double*>(a), static_cast<const double*>(b),
                     static_cast<double*>(out), n);
    case Dtype::kF16:
      return AddHalf<F16ToF32, F32ToF16>(static_cast<const uint16_t*>(a),
                                         static_cast<const uint16_t*>(b),
                                         static_cast<uint16_t*>(out), n);
    case Dtype::kBF16:
      return AddHalf<Bf16ToF32, F32ToBf16>(static_cast<const uint16_t*>(a),
                                           static_cast<const uint16_t*>(b),
                                           static_cast<uint16_t*>(out), n);
  }
}

}  // namespace xla_kernels::simple_add

namespace {

using xla_kernels::simple_add::Dtype;

ffi::Error SimpleAddCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out) {
  if (a.element_type() != b.element_type() || a.element_type() != out->element_type())
    return ffi::Error::InvalidArgument("xla_kernels.simple_add: a, b and out differ in dtype");
  if (a.element_count() != b.element_count() || a.element_count() != out->element_count())
    return ffi::Error::InvalidArgument("xla_kernels.simple_add: a, b and out differ in size");
  Dtype dtype;
  switch (a.element_type()) {
    case ffi::DataType::F16: dtype = Dtype::kF16; break;
    case ffi::DataType::BF16: dtype = Dtype::kBF16; break;
    case ffi::DataType::F32: dtype = Dtype::kF32; break;
    case ffi::DataType::F64: dtype = Dtype::kF64; break;
    default:
      return xla_kernels::UnsupportedDtype("xla_kernels.simple_add", a.element_type(),
                                           "f16, bf16, f32, f64");
  }
  xla_kernels::simple_add::AddHost(dtype, a.untyped_data(), b.untyped_data(),
                                   out->untyped_data(), static_cast<int64_t>(a.element_count()));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(XlaKernelsSimpleAddCpu, SimpleAddCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
