// Decoding and validating paged_attention's XLA FFI buffers and attributes: shared by the CPU
// handler (paged_attention_cpu.cc) and the CUDA handler (paged_attention.cu), so both reject
// bad input with the same messages. Plain C++ (no CUDA).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "paged_attention_limits.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/dtype_dispatch.h"
#include "xla_kernels/errors.h"
#include "xla_kernels/paged_cache_checks.h"

namespace xla_kernels::paged_attention {

namespace ffi = xla::ffi;

// The problem, as read from the buffers. Strides are in elements and describe either layout.
struct Shape {
  ffi::DataType dtype;        // query and output
  ffi::DataType cache_dtype;  // dtype, or F8E4M3FN (then dtype is BF16 or F16)
  int64_t num_seqs, num_q_heads, num_kv_heads, head_dim;
  int64_t num_blocks, block_size, max_blocks_per_seq;
  int64_t stride_block, stride_slot, stride_head;
  bool pallas;  // layout "pallas" ([kv_heads, blocks, block_size, d]) instead of "vllm"
};

inline ffi::Error Bad(const std::string& arg, const std::string& problem, const std::string& fix) {
  return InvalidArgument("xla_kernels.paged_attention", arg, problem, fix);
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
  const auto kd = key_cache.dimensions();
  const auto vd = value_cache.dimensions();
  const auto bd = block_tables.dimensions();
  const auto sd = seq_lens.dimensions();
  const auto od = out.dimensions();
  const ffi::DataType dt = query.element_type();
  const ffi::DataType ct = key_cache.element_type();
  if (ffi::Error e = CheckPagedCacheDtypes("xla_kernels.paged_attention", "query", dt, ct,
                                           value_cache.element_type(), out.element_type(),
                                           k_scale, v_scale);
      e.failure())
    return e;
  if (layout != "vllm" && layout != "pallas")
    return Bad("layout", "unknown layout '" + std::string(layout) + "'",
               "use \"vllm\" ([num_blocks, block_size, num_kv_heads, head_dim]) or \"pallas\" "
               "([num_kv_heads, num_blocks, block_size, head_dim])");
  if (qd.size() != 3)
    return Bad("query", "expected shape [num_seqs, num_q_heads, head_dim], got " + DimsText(qd),
               "pass one query token per sequence");
  if (kd.size() != 4)
    return Bad("key_cache", "expected a rank-4 cache, got shape " + DimsText(kd),
               "pass the paged cache in the declared layout");
  if (vd.size() != 4 || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3])
    return Bad("value_cache", "shape " + DimsText(vd) + " differs from key_cache's " +
                                  DimsText(kd),
               "pass key and value caches of one shape");
  const bool pallas = layout == "pallas";
  Shape s{};
  s.dtype = dt;
  s.cache_dtype = ct;
  s.pallas = pallas;
  s.num_seqs = qd[0];
  s.num_q_heads = qd[1];
  s.head_dim = qd[2];
  s.num_kv_heads = pallas ? kd[0] : kd[2];
  s.num_blocks = pallas ? kd[1] : kd[0];
  s.block_size = pallas ? kd[2] : kd[1];
  if (!IsSupportedHeadDim(s.head_dim))
    return Bad("query", "head_dim " + std::to_string(s.head_dim) + " is not supported",
               "use head_dim 64, 128 or 256");
  if (kd[3] != s.head_dim)
    return Bad("key_cache", "head_dim " + std::to_string(kd[3]) + " differs from the query's " +
                                std::to_string(s.head_dim),
               "pass caches with the query's head_dim");
  if (!IsSupportedBlockSize(s.block_size))
    return Bad("key_cache", "block_size " + std::to_string(s.block_size) + " is not supported",
               "use block_size 16, 32, 64, 128 or 256 (check the layout attribute)");
  if (s.num_kv_heads <= 0 || s.num_q_heads % s.num_kv_heads != 0)
    return Bad("key_cache", "num_q_heads " + std::to_string(s.num_q_heads) +
                                " is not a multiple of num_kv_heads " +
                                std::to_string(s.num_kv_heads),
               "use a kv head count that divides the query head count");
  if (bd.size() != 2 || bd[0] != s.num_seqs)
    return Bad("block_tables", "expected shape [" + std::to_string(s.num_seqs) +
                                   ", max_blocks_per_seq], got " + DimsText(bd),
               "pass one row of block ids per sequence");
  if (sd.size() != 1 || sd[0] != s.num_seqs)
    return Bad("seq_lens", "expected shape (" + std::to_string(s.num_seqs) + ",), got " +
                               DimsText(sd),
               "pass one length per sequence");
  if (od.size() != 3 || od[0] != qd[0] || od[1] != qd[1] || od[2] != qd[2])
    return Bad("out", "output shape " + DimsText(od) + " differs from the query's " + DimsText(qd),
               "declare the output like the query");
  if (!std::isfinite(scale))
    return Bad("scale", "must be finite", "pass e.g. scale=1/sqrt(head_dim)");
  if (!(softcap >= 0.f) || !std::isfinite(softcap))
    return Bad("softcap", "must be finite and >= 0", "pass 0 to disable the softcap");
  if (sliding_window < 0)
    return Bad("sliding_window", "must be >= 0", "pass 0 to disable the window");
  s.max_blocks_per_seq = bd[1];
  const PagedCacheStrides st = StridesOfPagedCache(layout, s.num_blocks, s.block_size,
                                                   s.num_kv_heads, s.head_dim);
  s.stride_block = st.block;
  s.stride_slot = st.slot;
  s.stride_head = st.head;
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
