// The XLA FFI side the handlers of the attention ops over a paged KV cache (paged_attention,
// ragged_paged_attention) share: the cache shape they decode, the checks of the layout, the
// caches against the queries, the output and the attributes (worded as kernels/paged_cache.py
// words them; the dtype rules are paged_cache_checks.h's), and the launchers' shared Params.
// Each op's ffi header checks its own row arguments between these. Plain C++ (no CUDA).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/attention_limits.h"
#include "xla_kernels/attention_params.h"
#include "xla_kernels/errors.h"
#include "xla_kernels/paged_cache_checks.h"

namespace xla_kernels {

// The queries' and the cache's part of a call, as read from the buffers. Strides are in
// elements and describe every layout.
struct PagedCacheShape {
  xla::ffi::DataType dtype;        // queries and output
  xla::ffi::DataType cache_dtype;  // dtype, or F8E4M3FN (then dtype is BF16 or F16)
  int64_t num_q_heads, num_kv_heads, head_dim;
  int64_t num_blocks, block_size, max_blocks_per_seq;
  int64_t stride_block, stride_slot, stride_head;
  // Elements from the key cache's first element to the value cache's: 0 where keys and values
  // are separate arrays; head_dim in the fused layout, where one array holds both.
  int64_t value_offset;
};

// "vllm" or "pallas", and "fused" where the op takes it.
inline xla::ffi::Error CheckAttentionLayout(const std::string& op, std::string_view layout,
                                            bool fused_ok) {
  if (layout != "vllm" && layout != "pallas" && !(fused_ok && layout == "fused"))
    return InvalidArgument(op, "layout", "unknown layout '" + std::string(layout) + "'",
                           "use \"vllm\" ([num_blocks, block_size, num_kv_heads, head_dim]) or "
                           "\"pallas\" ([num_kv_heads, num_blocks, block_size, head_dim])");
  return xla::ffi::Error::Success();
}

// The caches (kd: key_cache's dimensions, named `cache_arg`; vd: value_cache's) in `layout`
// against the queries (qd: [rows, num_q_heads, head_dim], rank checked, named `query_arg`):
// rank 4, one shape, a supported head_dim and block_size, the queries' head_dim, kv heads
// dividing the q heads. Fills `s`'s heads, head_dim, cache dimensions and strides.
inline xla::ffi::Error CheckPagedCacheShapes(const std::string& op, const std::string& query_arg,
                                             const std::string& cache_arg,
                                             xla::ffi::Span<const int64_t> qd,
                                             xla::ffi::Span<const int64_t> kd,
                                             xla::ffi::Span<const int64_t> vd,
                                             std::string_view layout, PagedCacheShape* s) {
  const std::string possessive = query_arg + (query_arg.back() == 's' ? "'" : "'s");
  auto bad = [&](const std::string& arg, const std::string& problem, const std::string& fix) {
    return InvalidArgument(op, arg, problem, fix);
  };
  if (kd.size() != 4)
    return bad(cache_arg, "expected a rank-4 cache, got shape " + DimsText(kd),
               "pass the paged cache in the declared layout");
  if (vd.size() != 4 || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3])
    return bad("value_cache", "shape " + DimsText(vd) + " differs from key_cache's " +
                                  DimsText(kd),
               "pass key and value caches of one shape");
  const bool pallas = layout == "pallas";
  s->num_q_heads = qd[1];
  s->head_dim = qd[2];
  s->num_kv_heads = pallas ? kd[0] : layout == "fused" ? kd[2] / 2 : kd[2];
  s->num_blocks = pallas ? kd[1] : kd[0];
  s->block_size = pallas ? kd[2] : kd[1];
  if (!IsSupportedHeadDim(s->head_dim))
    return bad(query_arg, "head_dim " + std::to_string(s->head_dim) + " is not supported",
               "use head_dim 64, 128 or 256");
  if (kd[3] != s->head_dim)
    return bad(cache_arg, "head_dim " + std::to_string(kd[3]) + " differs from the " +
                              possessive + " " + std::to_string(s->head_dim),
               "pass caches with the " + possessive + " head_dim");
  if (!IsSupportedBlockSize(s->block_size))
    return bad(cache_arg, "block_size " + std::to_string(s->block_size) + " is not supported",
               "use block_size 16, 32, 64, 128 or 256 (check the layout attribute)");
  if (s->num_kv_heads <= 0 || s->num_q_heads % s->num_kv_heads != 0)
    return bad(cache_arg, "num_q_heads " + std::to_string(s->num_q_heads) +
                              " is not a multiple of num_kv_heads " +
                              std::to_string(s->num_kv_heads),
               "use a kv head count that divides the query head count");
  const PagedCacheStrides st = StridesOfPagedCache(layout, s->num_blocks, s->block_size,
                                                   s->num_kv_heads, s->head_dim);
  s->stride_block = st.block;
  s->stride_slot = st.slot;
  s->stride_head = st.head;
  s->value_offset = st.value_offset;
  return xla::ffi::Error::Success();
}

// The output (od) has the queries' (qd) shape.
inline xla::ffi::Error CheckOutputShape(const std::string& op, const std::string& query_arg,
                                        xla::ffi::Span<const int64_t> od,
                                        xla::ffi::Span<const int64_t> qd) {
  const std::string possessive = query_arg + (query_arg.back() == 's' ? "'" : "'s");
  if (od.size() != 3 || od[0] != qd[0] || od[1] != qd[1] || od[2] != qd[2])
    return InvalidArgument(op, "out", "output shape " + DimsText(od) + " differs from the " +
                                          possessive + " " + DimsText(qd),
                           "declare the output like the " + query_arg);
  return xla::ffi::Error::Success();
}

// scale finite, softcap finite and >= 0, sliding_window >= 0.
inline xla::ffi::Error CheckAttentionAttrs(const std::string& op, float scale, float softcap,
                                           int64_t sliding_window) {
  if (!std::isfinite(scale))
    return InvalidArgument(op, "scale", "must be finite", "pass e.g. scale=1/sqrt(head_dim)");
  if (!(softcap >= 0.f) || !std::isfinite(softcap))
    return InvalidArgument(op, "softcap", "must be finite and >= 0",
                           "pass 0 to disable the softcap");
  if (sliding_window < 0)
    return InvalidArgument(op, "sliding_window", "must be >= 0", "pass 0 to disable the window");
  return xla::ffi::Error::Success();
}

// The launchers' shared Params of a validated call, but for the buffers' addresses.
inline PagedAttentionParams PagedAttentionParamsOf(const PagedCacheShape& s, float scale,
                                                   float softcap, int64_t sliding_window,
                                                   float k_scale, float v_scale) {
  using DT = xla::ffi::DataType;
  PagedAttentionParams p;
  p.dtype = s.dtype == DT::BF16  ? AttentionDType::kBF16
            : s.dtype == DT::F16 ? AttentionDType::kF16
                                 : AttentionDType::kF32;
  p.fp8_cache = s.cache_dtype == DT::F8E4M3FN;
  p.num_q_heads = s.num_q_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.num_blocks = s.num_blocks;
  p.block_size = s.block_size;
  p.max_blocks_per_seq = s.max_blocks_per_seq;
  p.stride_block = s.stride_block;
  p.stride_slot = s.stride_slot;
  p.stride_head = s.stride_head;
  p.scale = scale;
  p.softcap = softcap;
  p.sliding_window = sliding_window;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return p;
}

}  // namespace xla_kernels
