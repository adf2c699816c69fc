// HostElem<dtype>: the storage type of an FFI float dtype on the host, and loads/stores
// through its accumulation type (f32, or f64 for f64), so one templated CPU kernel serves
// f64, f32, bf16, f16 and f8e4m3fn (whose Store saturates to +-448, see half.h).
//
//   template <ffi::DataType DT> void Scale(const void* x, void* y, int64_t n) {
//     using E = xla_kernels::HostElem<DT>;
//     for (int64_t i = 0; i < n; ++i)
//       static_cast<typename E::T*>(y)[i] = E::Store(2 * E::Load(static_cast<const typename E::T*>(x)[i]));
//   }
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/half.h"

namespace xla_kernels {

template <xla::ffi::DataType DT>
struct HostElem;

template <>
struct HostElem<xla::ffi::DataType::F64> {
  using T = double;
  using Acc = double;
  static Acc Load(T x) { return x; }
  static T Store(Acc x) { return x; }
};

template <>
struct HostElem<xla::ffi::DataType::F32> {
  using T = float;
  using Acc = float;
  static Acc Load(T x) { return x; }
  static T Store(Acc x) { return x; }
};

template <>
struct HostElem<xla::ffi::DataType::BF16> {
  using T = uint16_t;
  using Acc = float;
  static Acc Load(T x) { return Bf16ToF32(x); }
  static T Store(Acc x) { return F32ToBf16(x); }
};

template <>
struct HostElem<xla::ffi::DataType::F16> {
  using T = uint16_t;
  using Acc = float;
  static Acc Load(T x) { return F16ToF32(x); }
  static T Store(Acc x) { return F32ToF16(x); }
};

template <>
struct HostElem<xla::ffi::DataType::F8E4M3FN> {
  using T = uint8_t;
  using Acc = float;
  static Acc Load(T x) { return E4m3ToF32(x); }
  static T Store(Acc x) { return F32ToE4m3Sat(x); }
};

}  // namespace xla_kernels
