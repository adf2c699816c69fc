// bf16, f16 and fp8 e4m3fn <-> f32 on the host, bit-exact and without compiler half-float
// support. Conversions to half round to nearest even and keep NaN a NaN, as XLA's own do; the
// conversion to e4m3fn also saturates (e4m3fn has no infinity: +-inf and finite values beyond
// the range become +-448), as an fp8 KV cache write does.
//
//   #include "xla_kernels/half.h"
//   float x = xla_kernels::Bf16ToF32(bits);
//   uint16_t y = xla_kernels::F32ToF16(x * 2.f);
//   uint8_t q = xla_kernels::F32ToE4m3Sat(x / scale);
#pragma once

#include <cmath>
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

// float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinity, NaN is
// S.1111.111; largest finite 448, smallest subnormal 2^-9. Every value is exact in f32.
constexpr float kE4m3Max = 448.f;

inline float E4m3ToF32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  uint32_t u;
  if (exp == 0xfu && mant == 0x7u) {
    u = sign | 0x7fc00000u;
  } else if (exp != 0) {
    u = sign | ((exp + 120u) << 23) | (mant << 20);
  } else {  // zero or subnormal: mant * 2^-9, exact
    float f = static_cast<float>(mant) * 0.001953125f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; |x| >= 448 (and +-inf) saturate to +-448; NaN stays NaN.
inline uint8_t F32ToE4m3Sat(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7fu;  // NaN
  float a;
  std::memcpy(&a, &absu, 4);
  if (a >= kE4m3Max) return sign | 0x7eu;
  if (a < 0.015625f) {  // below the smallest normal 2^-6: a multiple of 2^-9 (8 is 2^-6)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.f));
  }
  const uint32_t r = absu + 0x7ffffu + ((absu >> 20) & 1u);  // round the mantissa to 3 bits
  const uint32_t exp = (r >> 23) - 120u;                     // rebias 127 -> 7
  return sign | static_cast<uint8_t>((exp << 3) | ((r >> 20) & 0x7u));
}

}  // namespace xla_kernels
