// Decoding rms_norm's buffers: rows of `hidden` elements (x is [..., hidden]), shared by the
// CPU handlers (rms_norm_cpu.cc) and the CUDA handlers (rms_norm.cu). Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/errors.h"

namespace xla_kernels::rms_norm {

namespace ffi = xla::ffi;

struct Rows {
  int64_t rows, hidden;
};

inline ffi::Error Bad(const std::string& op, const std::string& arg, const std::string& problem,
                      const std::string& fix) {
  return InvalidArgument(op, arg, problem, fix);
}

// x [..., hidden] and weight [hidden] of one dtype; `same` buffers must have x's shape.
inline ffi::Error DecodeRows(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& weight,
                             std::initializer_list<const ffi::AnyBuffer*> same, Rows* r) {
  const auto xd = x.dimensions();
  if (xd.size() < 1 || weight.dimensions().size() != 1 ||
      weight.dimensions()[0] != xd[xd.size() - 1])
    return Bad(op, "weight", "expected x [..., hidden] and weight [hidden]",
               "pass a weight of x's last dimension");
  if (weight.element_type() != x.element_type())
    return Bad(op, "weight", "dtype differs from x's", "cast weight to x's dtype");
  for (const ffi::AnyBuffer* b : same)
    if (b->element_type() != x.element_type() || b->element_count() != x.element_count())
      return Bad(op, "x", "every array of x's shape must have x's dtype and size", "cast it");
  r->hidden = xd[xd.size() - 1];
  r->rows = r->hidden ? static_cast<int64_t>(x.element_count()) / r->hidden : 0;
  return ffi::Error::Success();
}

}  // namespace xla_kernels::rms_norm
