// A kernel in XLA's original custom-call signature (docs/tutorial.md, "Legacy kernels"):
// buffers = {a, b, out}; the opaque bytes carry the element count as an int64.
#include <cstddef>
#include <cstdint>
#include <cstring>

void LegacyAdd(void* stream, void** buffers, const char* opaque, size_t opaque_len) {
  (void)stream;
  int64_t size = 0;
  if (opaque_len == sizeof(size)) std::memcpy(&size, opaque, sizeof(size));
  const float* a = static_cast<const float*>(buffers[0]);
  const float* b = static_cast<const float*>(buffers[1]);
  float* out = static_cast<float*>(buffers[2]);
  for (int64_t i = 0; i < size; ++i) out[i] = a[i] + b[i];
}
