// Decoding sample's XLA FFI buffers, shared by the CPU handler (sampling_cpu.cc) and the CUDA
// handler (sampling.cu), so both reject bad input alike. Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/errors.h"

namespace xla_kernels::sampling {

namespace ffi = xla::ffi;

constexpr const char* kOp = "xla_kernels.sample";

struct Shape {
  int64_t rows, vocab;
};

inline ffi::Error Bad(const std::string& arg, const std::string& problem,
                      const std::string& fix) {
  return InvalidArgument(kOp, arg, problem, fix);
}

// logits [rows, vocab]; every per-row array [rows] of its dtype; tokens i32 [rows].
inline ffi::Error Decode(const ffi::AnyBuffer& logits, const ffi::AnyBuffer& temperature,
                         const ffi::AnyBuffer& top_k, const ffi::AnyBuffer& top_p,
                         const ffi::AnyBuffer& min_p, const ffi::AnyBuffer& seeds,
                         const ffi::AnyBuffer& offsets, const ffi::AnyBuffer& tokens,
                         Shape* s) {
  const auto d = logits.dimensions();
  if (d.size() != 2)
    return Bad("logits", "expected rank 2 [rows, vocab]", "reshape logits to [rows, vocab]");
  s->rows = d[0];
  s->vocab = d[1];
  if (s->vocab < 1 && s->rows > 0)
    return Bad("logits", "the vocabulary is empty", "pass at least one logit per row");
  if (s->vocab >= (int64_t{1} << 31))
    return Bad("logits", "more than 2^31 - 1 logits per row", "split the vocabulary");
  struct Row {
    const ffi::AnyBuffer* buffer;
    const char* name;
    ffi::DataType a, b;
  };
  const Row rows[] = {{&temperature, "temperature", ffi::DataType::F32, ffi::DataType::F32},
                      {&top_k, "top_k", ffi::DataType::S32, ffi::DataType::S32},
                      {&top_p, "top_p", ffi::DataType::F32, ffi::DataType::F32},
                      {&min_p, "min_p", ffi::DataType::F32, ffi::DataType::F32},
                      {&seeds, "seeds", ffi::DataType::U32, ffi::DataType::S32},
                      {&offsets, "offsets", ffi::DataType::S32, ffi::DataType::U32},
                      {&tokens, "tokens", ffi::DataType::S32, ffi::DataType::S32}};
  for (const Row& r : rows) {
    if (r.buffer->element_type() != r.a && r.buffer->element_type() != r.b)
      return Bad(r.name, "unexpected dtype", "pass the dtype the op declares");
    if (r.buffer->dimensions().size() != 1 || r.buffer->dimensions()[0] != s->rows)
      return Bad(r.name, "expected one value per row of logits", "pass a [rows] array");
  }
  return ffi::Error::Success();
}

}  // namespace xla_kernels::sampling
