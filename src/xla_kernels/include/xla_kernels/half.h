// bf16 and f16 <-> f32 on the host, bit-exact and without compiler half-float support.
// Conversions to half round to nearest even and keep NaN a NaN, as XLA's own do.
//
//   #include "xla_kernels/half.h"
//   float x = xla_kernels::Bf16ToF32(bits);
//   uint16_t y = xla_kernels::F32ToF16(x * 2.f);
#pragma once

#include <cstdint>
#include <cstring>

namespace xla_kernels {

inline float Bf16ToF32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    u = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (absu >= 0x477ff000u) return sign | 0x7c00u;  // overflow -> inf
  if (absu < 0x38800000u) {                        // subnormal or zero
    if (absu < 0x33000000u) return sign;           // below half the smallest subnormal
    const uint32_t e = absu >> 23;
    const uint32_t m = (absu & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  const uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15
  return sign | static_cast<uint16_t>(r >> 13);
}

}  // namespace xla_kernels
