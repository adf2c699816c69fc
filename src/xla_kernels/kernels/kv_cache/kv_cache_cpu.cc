// reshape_and_cache on the host: each token's key and value rows are copied to its slot, or,
// into fp8 caches, quantized (x / scale in f32, round to nearest even, saturated; see
// xla_kernels/half.h). Handler XkReshapeAndCacheCpu (see kv_cache_ffi.h for the binding).
#include <cstdint>
#include <cstring>
#include <string_view>

#include "kv_cache_ffi.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::kv_cache {
namespace {

void CopyRows(const Layout& l, const int32_t* slots, const char* src, char* cache, size_t elem) {
  const size_t row = static_cast<size_t>(l.head_dim) * elem;
  for (int64_t t = 0; t < l.num_tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0 || slot >= l.capacity()) continue;  // padding or out of range: skipped
    for (int64_t h = 0; h < l.num_kv_heads; ++h)
      std::memcpy(cache + l.RowOffset(slot, h) * elem,
                  src + ((t * l.num_kv_heads + h) * l.head_dim) * elem, row);
  }
}

template <ffi::DataType DT>
void QuantizeRows(const Layout& l, const int32_t* slots, const void* src_raw, uint8_t* cache,
                  float scale) {
  using E = HostElem<DT>;
  const auto* src = static_cast<const typename E::T*>(src_raw);
  for (int64_t t = 0; t < l.num_tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0 || slot >= l.capacity()) continue;
    for (int64_t h = 0; h < l.num_kv_heads; ++h) {
      const auto* row = src + (t * l.num_kv_heads + h) * l.head_dim;
      uint8_t* dst = cache + l.RowOffset(slot, h);
      for (int64_t d = 0; d < l.head_dim; ++d) dst[d] = F32ToE4m3Sat(E::Load(row[d]) / scale);
    }
  }
}

void Quantize(ffi::DataType dt, const Layout& l, const int32_t* slots, const void* src,
              void* cache, float scale) {
  uint8_t* dst = static_cast<uint8_t*>(cache);
  switch (dt) {
    case ffi::DataType::BF16: return QuantizeRows<ffi::DataType::BF16>(l, slots, src, dst, scale);
    case ffi::DataType::F16: return QuantizeRows<ffi::DataType::F16>(l, slots, src, dst, scale);
    default: return QuantizeRows<ffi::DataType::F32>(l, slots, src, dst, scale);
  }
}

ffi::Error ReshapeAndCacheCpu(ffi::AnyBuffer key, ffi::AnyBuffer value, ffi::AnyBuffer key_cache,
                              ffi::AnyBuffer value_cache, ffi::Buffer<ffi::S32> slot_mapping,
                              ffi::Result<ffi::AnyBuffer> key_out,
                              ffi::Result<ffi::AnyBuffer> value_out, std::string_view layout,
                              float k_scale, float v_scale) {
  Layout l;
  ffi::Error err = Decode(key, value, key_cache, value_cache, slot_mapping, *key_out, *value_out,
                          layout, k_scale, v_scale, &l);
  if (err.failure()) return err;
  if (l.quantize) {
    const int32_t* slots = slot_mapping.typed_data();
    Quantize(key.element_type(), l, slots, key.untyped_data(), key_out->untyped_data(), k_scale);
    Quantize(key.element_type(), l, slots, value.untyped_data(), ValueDestination(*value_out, l),
             v_scale);
    return ffi::Error::Success();
  }
  const size_t elem = ElementSize(key.element_type());
  const int32_t* slots = slot_mapping.typed_data();
  CopyRows(l, slots, static_cast<const char*>(key.untyped_data()),
           static_cast<char*>(key_out->untyped_data()), elem);
  CopyRows(l, slots, static_cast<const char*>(value.untyped_data()),
           static_cast<char*>(ValueDestination(*value_out, l)), elem);
  return ffi::Error::Success();
}

ffi::Error ReshapeAndCacheFusedCpu(ffi::AnyBuffer key, ffi::AnyBuffer value,
                                   ffi::AnyBuffer kv_cache, ffi::Buffer<ffi::S32> slot_mapping,
                                   ffi::Result<ffi::AnyBuffer> kv_out, float k_scale,
                                   float v_scale) {
  return ReshapeAndCacheCpu(key, value, kv_cache, kv_cache, slot_mapping, kv_out, kv_out,
                            "fused", k_scale, v_scale);
}

}  // namespace
}  // namespace xla_kernels::kv_cache

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkReshapeAndCacheCpu, xla_kernels::kv_cache::ReshapeAndCacheCpu,
                              xla_kernels::kv_cache::BindOperands(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkReshapeAndCacheFusedCpu,
                              xla_kernels::kv_cache::ReshapeAndCacheFusedCpu,
                              xla_kernels::kv_cache::BindFusedOperands(ffi::Ffi::Bind()));
