// Decoding and validating fp8_linear's buffers and attributes, shared by the CPU handler
// (fp8_linear_cpu.cc) and the CUDA handler (fp8_linear.cu), worded as the Python shape rule
// words them. Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/errors.h"
#include "xla_kernels/fp8_scales.h"

namespace xla_kernels::fp8_linear {

namespace ffi = xla::ffi;

constexpr const char* kOp = "xla_kernels.fp8_linear";

struct Shape {
  int64_t tokens, in, out;
  ffi::DataType dtype;
  bool dynamic;    // activation_scheme "dynamic": x quantized per token
  int64_t bn, bk;  // scale blocks; per-channel scales are (1, 0) (see ScaleIndex)
};

inline ffi::Error Decode(const ffi::AnyBuffer& x, const ffi::AnyBuffer& weight,
                         const ffi::AnyBuffer& scale, const ffi::AnyBuffer& y,
                         ffi::Span<const int64_t> block_shape,
                         std::string_view activation_scheme, Shape* s) {
  const auto xd = x.dimensions(), wd = weight.dimensions(), sd = scale.dimensions();
  const ffi::DataType dt = x.element_type();
  if (xd.size() != 2 ||
      (dt != ffi::DataType::F32 && dt != ffi::DataType::BF16 && dt != ffi::DataType::F16))
    return InvalidArgument(kOp, "x", "expected [tokens, in] of f32, bf16 or f16",
                           "pass a rank-2 floating array");
  s->tokens = xd[0];
  s->in = xd[1];
  s->dtype = dt;
  if (wd.size() != 2 || weight.element_type() != ffi::DataType::F8E4M3FN || wd[1] != s->in ||
      s->in < 1 || wd[0] < 1)
    return InvalidArgument(kOp, "weight", "expected f8e4m3fn [out, " + std::to_string(s->in) +
                                              "], got " + DimsText(wd),
                           "pass the weight as [out, in]");
  s->out = wd[0];
  if (block_shape.size() != 2)
    return InvalidArgument(kOp, "block_shape", "expected two sizes", "pass (bn, bk)");
  const int64_t bn = block_shape[0], bk = block_shape[1];
  if (!((bn == 0 && bk == 0) || (bn >= 1 && bk >= 1)))
    return InvalidArgument(kOp, "block_shape", "expected (0, 0) or two sizes >= 1",
                           "pass (128, 128) or (0, 0)");
  const int64_t want0 = bn == 0 ? s->out : CeilDiv(s->out, bn);
  const int64_t want1 = bn == 0 ? 1 : CeilDiv(s->in, bk);
  if (scale.element_type() != ffi::DataType::F32 || sd.size() != 2 || sd[0] != want0 ||
      sd[1] != want1)
    return InvalidArgument(kOp, "weight_scale", "expected f32 [" + std::to_string(want0) +
                                                    ", " + std::to_string(want1) + "], got " +
                                                    DimsText(sd),
                           "pass the scales the weight was quantized with");
  // A per-channel scale is a block of one row spanning every column.
  s->bn = bn == 0 ? 1 : bn;
  s->bk = bn == 0 ? 0 : bk;
  if (activation_scheme == "none") {
    s->dynamic = false;
  } else if (activation_scheme == "dynamic") {
    s->dynamic = true;
  } else {
    return InvalidArgument(kOp, "activation_scheme",
                           "unknown scheme '" + std::string(activation_scheme) + "'",
                           "pass 'none' or 'dynamic'");
  }
  const auto yd = y.dimensions();
  if (y.element_type() != dt || yd.size() != 2 || yd[0] != s->tokens || yd[1] != s->out)
    return InvalidArgument(kOp, "y", "must be [tokens, out] in x's dtype", "allocate it so");
  return ffi::Error::Success();
}

inline int64_t RoundUp4(int64_t n) { return (n + 3) / 4 * 4; }

// f32 elements of the workspace output (the Python twin: workspace_elements in __init__.py),
// for whichever path the call takes: the tensor-core path's f32 sums [tokens, out], the token
// scales [tokens] ("dynamic") and x in the GEMM's stage order (16-byte aligned; e4m3 for
// "dynamic", else x's 2-byte dtype); W8A8 on the Hopper path, the token scales and e4m3 x
// row-major (fewer bytes than the former); or the Hopper stream-K schedule's partial-sum tiles
// (tokens padded to 64, out to 128) and barriers (8 bytes per 128 x 16 tile), each rounded up
// to a 128-byte line; f32 x (CUDA cores only): 1.
inline int64_t WorkspaceElements(const Shape& s) {
  if (s.dtype == ffi::DataType::F32) return 1;
  const int64_t padded_tiles = (s.tokens + 63) / 64 * 64 * ((s.out + 127) / 128 * 128);
  const int64_t x_bytes = s.tokens * s.in * (s.dynamic ? 1 : 2);
  return RoundUp4(padded_tiles + s.tokens) + (x_bytes + 3) / 4 + 1 + padded_tiles / 1024 + 64;
}

// The per-token activation scale of "dynamic": max(amax, 1e-12) times 1 / 448 (the f32
// constant; XLA rewrites a division by a constant into this product, so the plain-XLA path
// computes it the same way).
XK_HOST_DEVICE inline float ActivationScale(float amax) {
  return (amax > 1e-12f ? amax : 1e-12f) * (1.f / 448.f);
}

}  // namespace xla_kernels::fp8_linear
