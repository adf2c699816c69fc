// Decoding and validating linear's buffers, shared by the CPU handler (linear_cpu.cc) and the
// CUDA handler (linear.cu), worded as the Python shape rule words them. Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/errors.h"

namespace xla_kernels::linear {

namespace ffi = xla::ffi;

constexpr const char* kOp = "xla_kernels.linear";

struct Shape {
  int64_t tokens, in, out;
  ffi::DataType dtype;
};

inline ffi::Error Decode(const ffi::AnyBuffer& x, const ffi::AnyBuffer& weight,
                         const ffi::AnyBuffer& y, Shape* s) {
  const auto xd = x.dimensions(), wd = weight.dimensions(), yd = y.dimensions();
  const ffi::DataType dt = x.element_type();
  if (xd.size() != 2 ||
      (dt != ffi::DataType::F32 && dt != ffi::DataType::BF16 && dt != ffi::DataType::F16))
    return InvalidArgument(kOp, "x", "expected [tokens, in] of f32, bf16 or f16",
                           "pass a rank-2 floating array");
  s->tokens = xd[0];
  s->in = xd[1];
  s->dtype = dt;
  if (wd.size() != 2 || weight.element_type() != dt || wd[1] != s->in || s->in < 1 || wd[0] < 1)
    return InvalidArgument(kOp, "weight",
                           "expected [out, " + std::to_string(s->in) + "] in x's dtype, got " +
                               DimsText(wd),
                           "pass the weight as [out, in] in x's dtype");
  s->out = wd[0];
  if (y.element_type() != dt || yd.size() != 2 || yd[0] != s->tokens || yd[1] != s->out)
    return InvalidArgument(kOp, "y", "must be [tokens, out] in x's dtype", "allocate it so");
  return ffi::Error::Success();
}

}  // namespace xla_kernels::linear
