// reshape_and_cache on the host: each token's key and value rows are copied to its slot.
// Handler XkReshapeAndCacheCpu (see kv_cache_ffi.h for the binding).
#include <cstdint>
#include <cstring>
#include <string_view>

#include "kv_cache_ffi.h"
#include "xla/ffi/api/ffi.h"

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

ffi::Error ReshapeAndCacheCpu(ffi::AnyBuffer key, ffi::AnyBuffer value, ffi::AnyBuffer key_cache,
                              ffi::AnyBuffer value_cache, ffi::Buffer<ffi::S32> slot_mapping,
                              ffi::Result<ffi::AnyBuffer> key_out,
                              ffi::Result<ffi::AnyBuffer> value_out, std::string_view layout) {
  Layout l;
  ffi::Error err = Decode(key, value, key_cache, value_cache, slot_mapping, *key_out, *value_out,
                          layout, &l);
  if (err.failure()) return err;
  const size_t elem = ElementSize(key.element_type());
  const int32_t* slots = slot_mapping.typed_data();
  CopyRows(l, slots, static_cast<const char*>(key.untyped_data()),
           static_cast<char*>(key_out->untyped_data()), elem);
  CopyRows(l, slots, static_cast<const char*>(value.untyped_data()),
           static_cast<char*>(value_out->untyped_data()), elem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::kv_cache

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkReshapeAndCacheCpu, xla_kernels::kv_cache::ReshapeAndCacheCpu,
                              xla_kernels::kv_cache::BindOperands(ffi::Ffi::Bind()));
