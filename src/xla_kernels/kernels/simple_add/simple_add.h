// simple_add kernel core: out[i] = a[i] + b[i]. No framework types.
#pragma once

#include <cstdint>

namespace xla_kernels::simple_add {

enum class Dtype { kF16, kBF16, kF32, kF64 };

// Host implementation; `n` elements of `dtype` in each buffer.
void AddHost(Dtype dtype, const void* a, const void* b, void* out, int64_t n);

}  // namespace xla_kernels::simple_add
