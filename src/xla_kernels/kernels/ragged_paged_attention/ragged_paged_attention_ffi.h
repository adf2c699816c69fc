// Decoding and validating ragged_paged_attention's XLA FFI buffers and attributes: shared by
// the CPU handler (ragged_paged_attention_cpu.cc) and the CUDA handler
// (ragged_paged_attention.cu), so both reject bad input with the same messages as the Python
// shape rule. Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ragged_paged_attention_limits.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/attention_ffi.h"
#include "xla_kernels/errors.h"
#include "xla_kernels/paged_cache_checks.h"

namespace xla_kernels::ragged_paged_attention {

namespace ffi = xla::ffi;

constexpr char kOp[] = "xla_kernels.ragged_paged_attention";

// The problem, as read from the buffers: the queries' and the cache's part and the ragged rows.
struct Shape : PagedCacheShape {
  int64_t num_tokens, max_seqs;
};

// Element size of a cache dtype (bf16/f16/f32, or fp8).
inline int64_t CacheElementBytes(ffi::DataType ct) {
  return ct == ffi::DataType::F32 ? 4 : ct == ffi::DataType::F8E4M3FN ? 1 : 2;
}

// The value cache's first element: value_cache's own, or, in the fused layout (where
// key_cache and value_cache are the one kv_cache), head_dim elements past the keys'.
inline const void* ValueCacheData(const ffi::AnyBuffer& value_cache, const Shape& s) {
  return static_cast<const char*>(value_cache.untyped_data()) +
         s.value_offset * CacheElementBytes(s.cache_dtype);
}

inline ffi::Error Bad(const std::string& arg, const std::string& problem, const std::string& fix) {
  return InvalidArgument(kOp, arg, problem, fix);
}

// Checks every shape, dtype and attribute; fills `shape` on success.
inline ffi::Error DecodeAndValidate(const ffi::AnyBuffer& queries, const ffi::AnyBuffer& key_cache,
                                    const ffi::AnyBuffer& value_cache,
                                    const ffi::Buffer<ffi::S32>& kv_lens,
                                    const ffi::Buffer<ffi::S32>& block_tables,
                                    const ffi::Buffer<ffi::S32>& cu_q_lens,
                                    const ffi::Buffer<ffi::S32>& num_seqs,
                                    const ffi::AnyBuffer& out, float scale, float softcap,
                                    int64_t sliding_window, std::string_view layout,
                                    float k_scale, float v_scale, Shape* shape) {
  const bool fused = layout == "fused";
  std::vector<int64_t> packed;  // a fused cache's 4-D dimensions, when it came as 5-D
  const auto qd = queries.dimensions();
  const auto kd = fused ? FusedCacheDims(key_cache.dimensions(), &packed)
                        : key_cache.dimensions();
  const auto ld = kv_lens.dimensions();
  const auto bd = block_tables.dimensions();
  const auto cd = cu_q_lens.dimensions();
  const auto nd = num_seqs.dimensions();
  if (ffi::Error e = CheckPagedCacheDtypes(kOp, "queries", queries.element_type(),
                                           key_cache.element_type(), value_cache.element_type(),
                                           out.element_type(), k_scale, v_scale);
      e.failure())
    return e;
  if (ffi::Error e = CheckAttentionLayout(kOp, layout, /*fused_ok=*/true); e.failure()) return e;
  // The fused layout's one array [num_blocks, block_size, 2 * num_kv_heads, head_dim] holds
  // head h's key at index 2h and its value at 2h + 1 of the third axis (tpu-inference's
  // layout); the handler passes it as both caches.
  const std::string cache_arg = fused ? "kv_cache" : "key_cache";
  if (qd.size() != 3)
    return Bad("queries", "expected shape [num_tokens, num_q_heads, head_dim], got " +
                              DimsText(qd),
               "pass the batch's query tokens, concatenated");
  if (fused && key_cache.untyped_data() != value_cache.untyped_data())
    return Bad("layout", "\"fused\" is the layout of one kv_cache array",
               "call ragged_paged_attention_fused with the kv_cache, or pass separate caches "
               "in layout \"vllm\" or \"pallas\"");
  if (fused && kd.size() == 4 && kd[2] % 2 != 0)
    return Bad(cache_arg, "its third axis has " + std::to_string(kd[2]) +
                              " entries; the fused layout needs 2 * num_kv_heads",
               "pass [num_blocks, block_size, 2 * num_kv_heads, head_dim], keys and values "
               "interleaved per head");
  Shape s{};
  s.dtype = queries.element_type();
  s.cache_dtype = key_cache.element_type();
  s.num_tokens = qd[0];
  if (ffi::Error e = CheckPagedCacheShapes(kOp, "queries", cache_arg, qd, kd,
                                           fused ? kd : value_cache.dimensions(), layout, &s);
      e.failure())
    return e;
  if (ld.size() != 1 || ld[0] < 1)
    return Bad("kv_lens", "expected shape (max_seqs,) with max_seqs >= 1, got " + DimsText(ld),
               "pass one context length per sequence slot");
  s.max_seqs = ld[0];
  if (bd.size() != 2 || bd[0] != s.max_seqs)
    return Bad("block_tables", "expected shape [" + std::to_string(s.max_seqs) +
                                   ", max_blocks_per_seq], got " + DimsText(bd),
               "pass one row of block ids per sequence slot (kv_lens' length)");
  if (cd.size() != 1 || cd[0] != s.max_seqs + 1)
    return Bad("cu_q_lens", "expected shape (" + std::to_string(s.max_seqs + 1) + ",), got " +
                                DimsText(cd),
               "pass max_seqs + 1 cumulative query lengths, starting at 0");
  if (nd.size() != 1 || nd[0] != 1)
    return Bad("num_seqs", "expected shape (1,), got " + DimsText(nd),
               "pass the number of sequences as an int32 array of one element");
  if (ffi::Error e = CheckOutputShape(kOp, "queries", out.dimensions(), qd); e.failure())
    return e;
  if (ffi::Error e = CheckAttentionAttrs(kOp, scale, softcap, sliding_window); e.failure())
    return e;
  s.max_blocks_per_seq = bd[1];
  if (s.num_tokens * s.num_q_heads > kMaxPackedRows)
    return Bad("queries", "num_tokens * num_q_heads is above 2^30",
               "split the batch into several calls");
  if (s.max_blocks_per_seq * s.block_size > kMaxCapacity)
    return Bad("block_tables", "max_blocks_per_seq * block_size is above 2^30 tokens",
               "pass a smaller block table");
  *shape = s;
  return ffi::Error::Success();
}

// The operands after the caches, the results and the attributes up to `layout`, in order.
template <typename Binding>
auto BindAfterCaches(Binding binding) {
  return std::move(binding).template Arg<ffi::Buffer<ffi::S32>>()  // kv_lens
      .template Arg<ffi::Buffer<ffi::S32>>()             // block_tables
      .template Arg<ffi::Buffer<ffi::S32>>()             // cu_q_lens
      .template Arg<ffi::Buffer<ffi::S32>>()             // num_seqs
      .template Ret<ffi::AnyBuffer>()                    // out
      .template Ret<ffi::Buffer<ffi::F32>>()             // workspace (the CUDA decode path)
      .template Attr<float>("scale")
      .template Attr<float>("softcap")
      .template Attr<int64_t>("sliding_window");
}

// ragged_paged_attention's operands, results and attributes, in order; the CUDA handler
// passes a binding that already holds its stream.
template <typename Binding>
auto BindOperands(Binding binding) {
  return BindAfterCaches(std::move(binding).template Arg<ffi::AnyBuffer>()  // queries
                             .template Arg<ffi::AnyBuffer>()     // key_cache
                             .template Arg<ffi::AnyBuffer>())    // value_cache
      .template Attr<std::string_view>("layout")
      .template Attr<float>("k_scale")
      .template Attr<float>("v_scale");
}

// ragged_paged_attention_fused's: one kv_cache, and no layout attribute (it is "fused").
template <typename Binding>
auto BindFusedOperands(Binding binding) {
  return BindAfterCaches(std::move(binding).template Arg<ffi::AnyBuffer>()  // queries
                             .template Arg<ffi::AnyBuffer>())    // kv_cache
      .template Attr<float>("k_scale")
      .template Attr<float>("v_scale");
}

// One sequence as the kernels see it; the rules for inconsistent device data, in one place:
// n = clamp(num_seqs, 0, max_seqs); c_j = clamp(max(cu_q_lens[0..j]), 0, num_tokens) for
// j <= n (a running maximum, so row ranges never overlap); sequence s < n owns query rows
// [c_s, c_{s+1}); its context length is L_s = clamp(kv_lens[s], 0, capacity). Row i of it sits
// at position p = L_s - q_len + i and attends t in [max(0, p - window + 1), p] (all t <= p
// without a window); a row with p < 0 attends nothing and is zeros.
struct SeqView {
  int64_t start, q_len, kv_len;
};

}  // namespace xla_kernels::ragged_paged_attention
