// Decoding and validating reshape_and_cache's XLA FFI buffers: shared by the CPU handler
// (kv_cache_cpu.cc) and the CUDA handler (kv_cache.cu), so both reject bad input alike.
// Plain C++ (no CUDA).
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
#include "xla_kernels/host_device.h"
#include "xla_kernels/paged_cache_checks.h"

namespace xla_kernels::kv_cache {

namespace ffi = xla::ffi;

// Where token t's row of head h goes: element offset of slot `slot` (= block * block_size +
// offset) and head h in a cache, for any layout. Rows of head_dim elements are contiguous.
struct Layout {
  int64_t num_tokens, num_kv_heads, head_dim, num_blocks, block_size;
  int64_t stride_slot, stride_head;  // elements
  // Elements from the key cache's first element to the value cache's: 0 where they are
  // separate arrays, head_dim in the fused layout (one array, keys and values interleaved).
  int64_t value_offset;
  bool quantize;  // fp8 caches: rows are quantized on write, not copied

  XK_HOST_DEVICE int64_t capacity() const { return num_blocks * block_size; }
  XK_HOST_DEVICE int64_t RowOffset(int64_t slot, int64_t h) const {
    return slot * stride_slot + h * stride_head;
  }
};

inline ffi::Error Bad(const std::string& arg, const std::string& problem, const std::string& fix) {
  return InvalidArgument("xla_kernels.reshape_and_cache", arg, problem, fix);
}

// Layouts: "vllm" [num_blocks, block_size, num_kv_heads, head_dim], "pallas" [num_kv_heads,
// num_blocks, block_size, head_dim], "fused" [num_blocks, block_size, 2 * num_kv_heads,
// head_dim] with head h's key at index 2h and its value at 2h + 1 (tpu-inference's layout; the
// fused handler passes its one cache as both).
inline ffi::Error Decode(const ffi::AnyBuffer& key, const ffi::AnyBuffer& value,
                         const ffi::AnyBuffer& key_cache, const ffi::AnyBuffer& value_cache,
                         const ffi::Buffer<ffi::S32>& slot_mapping, const ffi::AnyBuffer& key_out,
                         const ffi::AnyBuffer& value_out, std::string_view layout,
                         float k_scale, float v_scale, Layout* l) {
  if (layout != "vllm" && layout != "pallas" && layout != "fused")
    return Bad("layout", "unknown layout '" + std::string(layout) + "'",
               "use \"vllm\" or \"pallas\"");
  const bool pallas = layout == "pallas", fused = layout == "fused";
  std::vector<int64_t> packed;  // a fused cache's 4-D dimensions, when it came as 5-D
  const auto kd = key.dimensions();
  const auto cd = fused ? FusedCacheDims(key_cache.dimensions(), &packed)
                        : key_cache.dimensions();
  const std::string cache_arg = fused ? "kv_cache" : "key_cache";
  if (fused && key_cache.untyped_data() != value_cache.untyped_data())
    return Bad("layout", "\"fused\" is the layout of one kv_cache array",
               "call reshape_and_cache_fused with the kv_cache, or pass separate caches in "
               "layout \"vllm\" or \"pallas\"");
  if (kd.size() != 3 || cd.size() != 4)
    return Bad("key", "expected key [num_tokens, num_kv_heads, head_dim] and a rank-4 cache",
               "pass arrays of those ranks");
  const ffi::DataType dt = key.element_type();
  const ffi::DataType ct = key_cache.element_type();
  const bool fp8 = ct == ffi::DataType::F8E4M3FN;
  if (dt != ffi::DataType::F32 && dt != ffi::DataType::BF16 && dt != ffi::DataType::F16)
    return Bad("key", "dtype " + DtypeName(dt) + " is not supported", "pass bf16, f16 or f32");
  if (value.element_type() != dt || value_cache.element_type() != ct ||
      key_out.element_type() != ct || value_out.element_type() != ct || (ct != dt && !fp8))
    return Bad("value", "key and value must share one dtype, and both caches the key's "
               "dtype or f8e4m3fn", "cast them");
  for (const auto& [name, value] : {std::pair<const char*, float>{"k_scale", k_scale},
                                    std::pair<const char*, float>{"v_scale", v_scale}}) {
    if (!std::isfinite(value) || !(value > 0.f))
      return Bad(name, "must be finite and > 0", "pass the fp8 cache's per-tensor scale, or 1.0");
    if (!fp8 && value != 1.f)
      return Bad(name, "scales apply to f8e4m3fn caches only", "pass 1.0, or fp8 caches");
  }
  l->quantize = fp8;
  l->num_tokens = kd[0];
  l->num_kv_heads = kd[1];
  l->head_dim = kd[2];
  l->num_blocks = pallas ? cd[1] : cd[0];
  l->block_size = pallas ? cd[2] : cd[1];
  const int64_t rows = fused ? 2 : 1;  // head rows per kv head and slot
  const int64_t cache_rows = pallas ? cd[0] : cd[2];
  if (cache_rows != rows * l->num_kv_heads || cd[3] != l->head_dim)
    return Bad(cache_arg, "its heads or head_dim differ from key's", "check the layout");
  // A slot index is block * block_size + offset: one slot stride spans blocks too.
  const PagedCacheStrides st = StridesOfPagedCache(layout, l->num_blocks, l->block_size,
                                                   l->num_kv_heads, l->head_dim);
  l->stride_slot = st.slot;
  l->stride_head = st.head;
  l->value_offset = st.value_offset;
  if (value.element_count() != key.element_count() ||
      value_cache.element_count() != key_cache.element_count() ||
      key_out.element_count() != key_cache.element_count() ||
      value_out.element_count() != key_cache.element_count())
    return Bad("value_cache", "value and value_cache must match key and key_cache",
               "pass arrays of one shape");
  if (slot_mapping.element_count() != static_cast<size_t>(l->num_tokens))
    return Bad("slot_mapping", "needs one slot per token", "pass int32 [num_tokens]");
  return ffi::Error::Success();
}

inline size_t ElementSize(ffi::DataType dt) {
  return dt == ffi::DataType::F32 ? 4 : 2;  // f32, or bf16/f16: a copy needs only the width
}

// Where the value rows go: the value cache's first element, head_dim elements past the keys'
// in the fused layout.
inline void* ValueDestination(ffi::AnyBuffer& value_out, const Layout& l) {
  const size_t elem = l.quantize ? 1 : ElementSize(value_out.element_type());
  return static_cast<char*>(value_out.untyped_data()) + l.value_offset * elem;
}

// The handler's operands: the caches come in as operands and leave as the results that
// alias them (XLA passes one buffer for both).
template <typename Binding>
auto BindOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // key
      .template Arg<ffi::AnyBuffer>()            // value
      .template Arg<ffi::AnyBuffer>()            // key_cache
      .template Arg<ffi::AnyBuffer>()            // value_cache
      .template Arg<ffi::Buffer<ffi::S32>>()     // slot_mapping
      .template Ret<ffi::AnyBuffer>()            // key_cache, updated
      .template Ret<ffi::AnyBuffer>()            // value_cache, updated
      .template Attr<std::string_view>("layout")
      .template Attr<float>("k_scale")
      .template Attr<float>("v_scale");
}

// reshape_and_cache_fused's: one kv_cache in, updated in place, and no layout attribute.
template <typename Binding>
auto BindFusedOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // key
      .template Arg<ffi::AnyBuffer>()            // value
      .template Arg<ffi::AnyBuffer>()            // kv_cache
      .template Arg<ffi::Buffer<ffi::S32>>()     // slot_mapping
      .template Ret<ffi::AnyBuffer>()            // kv_cache, updated
      .template Attr<float>("k_scale")
      .template Attr<float>("v_scale");
}

}  // namespace xla_kernels::kv_cache
