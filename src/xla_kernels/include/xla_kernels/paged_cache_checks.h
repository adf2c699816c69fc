// The dtype and fp8-scale rules shared by the attention ops over a paged KV cache
// (paged_attention, ragged_paged_attention): the C++ twin of kernels/paged_cache.py's
// check_attention_caches / check_kv_scales, so every handler words a bad call the same way.
//
//   if (ffi::Error e = CheckPagedCacheDtypes("xla_kernels.my_op", "query", query.element_type(),
//                                            key_cache.element_type(), value_cache.element_type(),
//                                            out.element_type(), k_scale, v_scale);
//       e.failure())
//     return e;
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "xla_kernels/dtype_dispatch.h"
#include "xla_kernels/errors.h"

namespace xla_kernels {

// Queries (argument `query_arg`, e.g. "query" or "queries") in f32/f16/bf16; both caches in one
// dtype, which is the queries' or f8e4m3fn (then the queries are bf16/f16); the output in the
// queries' dtype; k_scale/v_scale finite and > 0, and 1.0 unless the caches are fp8.
inline xla::ffi::Error CheckPagedCacheDtypes(const std::string& op, const std::string& query_arg,
                                             xla::ffi::DataType query,
                                             xla::ffi::DataType key_cache,
                                             xla::ffi::DataType value_cache,
                                             xla::ffi::DataType out, float k_scale,
                                             float v_scale) {
  using DT = xla::ffi::DataType;
  const std::string possessive = query_arg + (query_arg.back() == 's' ? "'" : "'s");
  auto bad = [&](const std::string& arg, const std::string& problem, const std::string& fix) {
    return InvalidArgument(op, arg, problem, fix);
  };
  if (query != DT::F32 && query != DT::F16 && query != DT::BF16)
    return bad(query_arg, "dtype " + DtypeName(query) + " is not supported",
               "pass bf16, f16 or f32");
  const bool fp8 = key_cache == DT::F8E4M3FN;
  if (value_cache != key_cache)
    return bad("value_cache", "dtype " + DtypeName(value_cache) + " differs from key_cache's " +
                                  DtypeName(key_cache),
               "store both caches in one dtype");
  if (out != query)
    return bad("out", "the output's dtype must be the " + possessive,
               "declare the output like the " + query_arg);
  if (fp8 && query == DT::F32)
    return bad(query_arg, "dtype f32 is not supported with f8e4m3fn caches",
               "pass bf16 or f16 queries (the output has their dtype)");
  if (!fp8 && key_cache != query)
    return bad("key_cache",
               query_arg + ", key_cache, value_cache and the output must share one dtype "
                           "(or the caches are f8e4m3fn)",
               "cast the caches to the " + possessive + " dtype");
  for (const auto& [name, value] : {std::pair<const char*, float>{"k_scale", k_scale},
                                    std::pair<const char*, float>{"v_scale", v_scale}}) {
    if (!std::isfinite(value) || !(value > 0.f))
      return bad(name, "must be finite and > 0", "pass the fp8 cache's per-tensor scale, or 1.0");
    if (!fp8 && value != 1.f)
      return bad(name, "scales apply to f8e4m3fn caches only", "pass 1.0, or fp8 caches");
  }
  return xla::ffi::Error::Success();
}

// A fused K/V cache may arrive in tpu-inference's packed 5-D shape [blocks, block_size,
// merged, packing, head_dim]: its merged * packing rows per slot are the 2 * kv_heads rows of
// the 4-D fused layout, in the same memory. Returns the 4-D dimensions (kept in `storage`);
// other shapes are returned as they are.
inline xla::ffi::Span<const int64_t> FusedCacheDims(xla::ffi::Span<const int64_t> dims,
                                                   std::vector<int64_t>* storage) {
  if (dims.size() != 5) return dims;
  *storage = {dims[0], dims[1], dims[2] * dims[3], dims[4]};
  return {storage->data(), storage->size()};
}

// Element strides of a paged cache's rows (block, slot, kv head) and the value rows' offset
// from the key rows', for the layouts the attention kernels take (paged_cache.cuh walks the
// cache with them):
//   "vllm"   [num_blocks, block_size, num_kv_heads, head_dim]
//   "pallas" [num_kv_heads, num_blocks, block_size, head_dim]
//   "fused"  [num_blocks, block_size, 2 * num_kv_heads, head_dim]: one array, kv head h's key
//            row at 2h and its value row at 2h + 1, so values start head_dim elements in.
struct PagedCacheStrides {
  int64_t block, slot, head, value_offset;
};

inline PagedCacheStrides StridesOfPagedCache(std::string_view layout, int64_t num_blocks,
                                             int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_dim) {
  if (layout == "pallas")
    return {block_size * head_dim, head_dim, num_blocks * block_size * head_dim, 0};
  const int64_t rows = layout == "fused" ? 2 : 1;  // head rows per kv head and slot
  return {block_size * num_kv_heads * rows * head_dim, num_kv_heads * rows * head_dim,
          rows * head_dim, layout == "fused" ? head_dim : 0};
}

// The CPU kernels' walk of a paged cache (the CUDA kernels' is paged_cache.cuh): the element
// offset, from kv head 0's, of token t's row for a sequence whose block table row is
// `table` (t below the table's capacity), or -1 where the token's block id is outside
// [0, num_blocks): the token holds no data and no address is formed.
struct HostPagedCache {
  int64_t num_blocks, block_size, stride_block, stride_slot, stride_head;

  int64_t RowOffset(const int32_t* table, int64_t t) const {
    const int64_t blk = table[t / block_size];
    if (blk < 0 || blk >= num_blocks) return -1;
    return blk * stride_block + (t % block_size) * stride_slot;
  }
  int64_t HeadOffset(int64_t kvh) const { return kvh * stride_head; }
};

}  // namespace xla_kernels
