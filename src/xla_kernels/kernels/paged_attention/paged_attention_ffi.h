// Decoding and validating paged_attention's XLA FFI buffers and attributes: shared by the CPU
// handler (paged_attention_cpu.cc) and the CUDA handler (paged_attention.cu), so both reject
// bad input with the same messages. Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "paged_attention_limits.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/attention_ffi.h"
#include "xla_kernels/errors.h"
#include "xla_kernels/paged_cache_checks.h"

namespace xla_kernels::paged_attention {

namespace ffi = xla::ffi;

constexpr char kOp[] = "xla_kernels.paged_attention";

// The problem, as read from the buffers: the queries' and the cache's part (one query row per
// sequence) and the sequences.
struct Shape : PagedCacheShape {
  int64_t num_seqs;
};

inline ffi::Error Bad(const std::string& arg, const std::string& problem, const std::string& fix) {
  return InvalidArgument(kOp, arg, problem, fix);
}

// Checks every shape, dtype and attribute; fills `shape` on success.
inline ffi::Error DecodeAndValidate(const ffi::AnyBuffer& query, const ffi::AnyBuffer& key_cache,
                                    const ffi::AnyBuffer& value_cache,
                                    const ffi::Buffer<ffi::S32>& block_tables,
                                    const ffi::Buffer<ffi::S32>& seq_lens,
                                    const ffi::AnyBuffer& out, float scale, float softcap,
                                    int64_t sliding_window, std::string_view layout,
                                    float k_scale, float v_scale, Shape* shape) {
  const auto qd = query.dimensions();
  const auto bd = block_tables.dimensions();
  const auto sd = seq_lens.dimensions();
  if (ffi::Error e = CheckPagedCacheDtypes(kOp, "query", query.element_type(),
                                           key_cache.element_type(), value_cache.element_type(),
                                           out.element_type(), k_scale, v_scale);
      e.failure())
    return e;
  if (ffi::Error e = CheckAttentionLayout(kOp, layout, /*fused_ok=*/false); e.failure()) return e;
  if (qd.size() != 3)
    return Bad("query", "expected shape [num_seqs, num_q_heads, head_dim], got " + DimsText(qd),
               "pass one query token per sequence");
  Shape s{};
  s.dtype = query.element_type();
  s.cache_dtype = key_cache.element_type();
  s.num_seqs = qd[0];
  if (ffi::Error e = CheckPagedCacheShapes(kOp, "query", "key_cache", qd, key_cache.dimensions(),
                                           value_cache.dimensions(), layout, &s);
      e.failure())
    return e;
  if (bd.size() != 2 || bd[0] != s.num_seqs)
    return Bad("block_tables", "expected shape [" + std::to_string(s.num_seqs) +
                                   ", max_blocks_per_seq], got " + DimsText(bd),
               "pass one row of block ids per sequence");
  if (sd.size() != 1 || sd[0] != s.num_seqs)
    return Bad("seq_lens", "expected shape (" + std::to_string(s.num_seqs) + ",), got " +
                               DimsText(sd),
               "pass one length per sequence");
  if (ffi::Error e = CheckOutputShape(kOp, "query", out.dimensions(), qd); e.failure()) return e;
  if (ffi::Error e = CheckAttentionAttrs(kOp, scale, softcap, sliding_window); e.failure())
    return e;
  s.max_blocks_per_seq = bd[1];
  *shape = s;
  return ffi::Error::Success();
}

// The operands, results and attributes both handlers bind, in order; the CUDA handler
// passes a binding that already holds its stream.
template <typename Binding>
auto BindOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // query
      .template Arg<ffi::AnyBuffer>()                    // key_cache
      .template Arg<ffi::AnyBuffer>()                    // value_cache
      .template Arg<ffi::Buffer<ffi::S32>>()             // block_tables
      .template Arg<ffi::Buffer<ffi::S32>>()             // seq_lens
      .template Ret<ffi::AnyBuffer>()                    // out
      .template Ret<ffi::Buffer<ffi::F32>>()             // workspace
      .template Attr<float>("scale")
      .template Attr<float>("softcap")
      .template Attr<int64_t>("sliding_window")
      .template Attr<std::string_view>("layout")
      .template Attr<float>("k_scale")
      .template Attr<float>("v_scale");
}

}  // namespace xla_kernels::paged_attention
