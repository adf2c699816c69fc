// fp8_linear on the host: per output row, the weight row dequantized to f32 once, then its
// dot with every token's row (x, or for "dynamic" x quantized to e4m3 and back), f32
// accumulation, rounded once to x's dtype. Handler XkFp8LinearCpu.
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "fp8_linear_ffi.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::fp8_linear {
namespace {

template <ffi::DataType DT>
void ToF32(const void* src, int64_t n, float* dst) {
  using E = HostElem<DT>;
  const auto* p = static_cast<const typename E::T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(E::Load(p[i]));
}

template <ffi::DataType DT>
void FromF32(const float* src, int64_t n, void* dst) {
  using E = HostElem<DT>;
  auto* p = static_cast<typename E::T*>(dst);
  for (int64_t i = 0; i < n; ++i) p[i] = E::Store(src[i]);
}

void LoadX(ffi::DataType dt, const void* x, int64_t n, float* dst) {
  switch (dt) {
    case ffi::DataType::BF16: ToF32<ffi::DataType::BF16>(x, n, dst); break;
    case ffi::DataType::F16: ToF32<ffi::DataType::F16>(x, n, dst); break;
    default: ToF32<ffi::DataType::F32>(x, n, dst); break;
  }
}

void StoreY(ffi::DataType dt, const float* src, int64_t n, void* y) {
  switch (dt) {
    case ffi::DataType::BF16: FromF32<ffi::DataType::BF16>(src, n, y); break;
    case ffi::DataType::F16: FromF32<ffi::DataType::F16>(src, n, y); break;
    default: FromF32<ffi::DataType::F32>(src, n, y); break;
  }
}

// "dynamic": each row of x (f32, [tokens, in]) replaced by its e4m3 values; their scales
// into `row_scale`.
void QuantizeRows(const Shape& s, float* x, float* row_scale) {
  for (int64_t t = 0; t < s.tokens; ++t) {
    float* row = x + t * s.in;
    float amax = 0.f;
    for (int64_t i = 0; i < s.in; ++i) amax = std::fmax(amax, std::fabs(row[i]));
    const float scale = ActivationScale(amax);
    for (int64_t i = 0; i < s.in; ++i) row[i] = E4m3ToF32(F32ToE4m3Sat(row[i] / scale));
    row_scale[t] = scale;
  }
}

void Run(const Shape& s, const void* x, const uint8_t* weight, const float* scale, void* y) {
  std::vector<float> xf(static_cast<size_t>(s.tokens * s.in));
  LoadX(s.dtype, x, s.tokens * s.in, xf.data());
  std::vector<float> row_scale(static_cast<size_t>(s.tokens), 1.f);
  if (s.dynamic) QuantizeRows(s, xf.data(), row_scale.data());
  std::vector<float> w(static_cast<size_t>(s.in));
  std::vector<float> yf(static_cast<size_t>(s.tokens * s.out));
  for (int64_t o = 0; o < s.out; ++o) {
    const uint8_t* q = weight + o * s.in;
    for (int64_t i = 0; i < s.in; ++i)
      w[i] = E4m3ToF32(q[i]) * scale[ScaleIndex(o, i, s.in, s.bn, s.bk)];
    for (int64_t t = 0; t < s.tokens; ++t) {
      const float* xr = xf.data() + t * s.in;
      float acc = 0.f;
      for (int64_t i = 0; i < s.in; ++i) acc += xr[i] * w[i];
      yf[t * s.out + o] = acc * row_scale[t];
    }
  }
  StoreY(s.dtype, yf.data(), s.tokens * s.out, y);
}

ffi::Error Fp8LinearCpu(ffi::AnyBuffer x, ffi::AnyBuffer weight, ffi::AnyBuffer scale,
                        ffi::Result<ffi::AnyBuffer> y,
                        ffi::Result<ffi::AnyBuffer> /*workspace: the CUDA kernel's*/,
                        ffi::Span<const int64_t> block_shape,
                        std::string_view activation_scheme) {
  Shape s{};
  ffi::Error err = Decode(x, weight, scale, *y, block_shape, activation_scheme, &s);
  if (err.failure()) return err;
  Run(s, x.untyped_data(), static_cast<const uint8_t*>(weight.untyped_data()),
      static_cast<const float*>(scale.untyped_data()), y->untyped_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::fp8_linear

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFp8LinearCpu, xla_kernels::fp8_linear::Fp8LinearCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("block_shape")
                                  .Attr<std::string_view>("activation_scheme"));
