// What the CPU kernel (sampling_cpu.cc) and the CUDA kernel (sampling.cu) must compute alike,
// as host/device functions of integers and IEEE float operations that both compilers round
// the same way (no fast-math, explicit fmaf), so both pick the same token:
//
//   * a token's weight: q = floor(2^40 * 2^t), t = (x - max) * log2(e) / T, 2^t from a
//     fixed polynomial; masses are sums of these integers, exact in any order;
//   * the filters: top-k keeps keys >= the k-th largest key, min-p keeps q >= min_p * 2^40,
//     top-p keeps the keys >= the largest key v of that set whose mass at and above v is
//     >= top_p times the set's mass;
//   * the draw: Philox4x32-10 (key (seed, 0), counter (offset, 0, 0, 0)) gives a 64-bit r;
//     target = floor(mass * r / 2^64); the token is where the running mass of the kept
//     tokens first exceeds the target, walking the vocabulary in "column order": the tokens
//     of column 0, then column 1, ..., where column t holds the tokens
//     kVec * (t + kColumns * g) + u (g = 0, 1, ...; u < kVec) in increasing order: how the
//     CUDA kernel's threads hold the row.
#pragma once

#include <cstdint>
#include <cstring>

#include "xla_kernels/host_device.h"

#ifdef __CUDACC__
#define XK_SAMPLING_FMA(a, b, c) fmaf(a, b, c)
#else
#include <cmath>
#define XK_SAMPLING_FMA(a, b, c) std::fma(a, b, c)
#endif

namespace xla_kernels::sampling {

// The draw's columns: the threads of the CUDA kernel's 8 blocks of 512 (per row), each
// holding runs of kVec tokens.
constexpr int kColumns = 4096;
constexpr int kVec = 4;
// A token's weight is an integer in units of 2^-40 of the most likely token's.
constexpr int kWeightBits = 40;
constexpr double kMaxWeight = 1099511627776.0;  // 2^40
constexpr float kLog2e = 1.4426950408889634f;

XK_HOST_DEVICE inline uint32_t FloatBits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

XK_HOST_DEVICE inline float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// An unsigned key ordered as the floats are (-0 just below +0; NaNs at the ends).
XK_HOST_DEVICE inline uint32_t OrderedKey(float x) {
  const uint32_t u = FloatBits(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The float whose OrderedKey is `key`.
XK_HOST_DEVICE inline float KeyFloat(uint32_t key) {
  return BitsFloat((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

XK_HOST_DEVICE inline uint64_t MulHi64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

XK_HOST_DEVICE inline uint32_t MulHiLo32(uint32_t a, uint32_t b, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *lo = static_cast<uint32_t>(p);
  return static_cast<uint32_t>(p >> 32);
}

// Philox4x32-10 (Salmon et al., SC'11), as in Random123 and curand.
XK_HOST_DEVICE inline void Philox4x32(const uint32_t counter[4], const uint32_t key[2],
                                      uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    uint32_t lo0, lo1;
    const uint32_t hi0 = MulHiLo32(0xD2511F53u, c0, &lo0);
    const uint32_t hi1 = MulHiLo32(0xCD9E8D57u, c2, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The 64 random bits of one draw: words 0 and 1 of Philox at key (seed, 0), counter
// (offset, 0, 0, 0).
XK_HOST_DEVICE inline uint64_t DrawBits(uint32_t seed, uint32_t offset) {
  const uint32_t counter[4] = {offset, 0u, 0u, 0u};
  const uint32_t key[2] = {seed, 0u};
  uint32_t out[4];
  Philox4x32(counter, key, out);
  return (static_cast<uint64_t>(out[0]) << 32) | out[1];
}

// floor(2^40 * 2^((x - m) * s)) for s = log2(e) / T > 0; 0 below 2^-40 and for NaN. The
// polynomial (2^f on [0, 1), relative error 2e-8) is evaluated with correctly rounded fmas.
XK_HOST_DEVICE inline uint64_t Weight(float x, float m, float s) {
  const float t = (x - m) * s;
  if (!(t > -static_cast<float>(kWeightBits))) return 0;
  const float k = floorf(t);
  const float f = t - k;  // exact: t and k are within one binade of each other
  float p = 2.1871262e-04f;
  p = XK_SAMPLING_FMA(p, f, 1.2382416e-03f);
  p = XK_SAMPLING_FMA(p, f, 9.6861860e-03f);
  p = XK_SAMPLING_FMA(p, f, 5.5478912e-02f);
  p = XK_SAMPLING_FMA(p, f, 2.4023110e-01f);
  p = XK_SAMPLING_FMA(p, f, 6.9314682e-01f);
  p = XK_SAMPLING_FMA(p, f, 1.0f);
  const int e = kWeightBits + static_cast<int>(k);  // 0 .. 40: t > -40, k <= 0
  const float scaled = p * BitsFloat(static_cast<uint32_t>(127 + e) << 23);  // exact
  return static_cast<uint64_t>(scaled);
}

// One row's sampling parameters, normalized: out-of-range values mean "off" or are clamped
// (see the op's documentation).
struct RowRule {
  bool greedy;        // temperature <= 0 or NaN, or a non-finite maximum logit
  float s;            // log2(e) / temperature
  bool top_k;         // 0 < k < vocab
  uint32_t k;
  bool top_p;         // top_p < 1
  double p;           // clamped to >= 0
  bool min_p;         // min_p > 0
  double min_weight;  // min(min_p, 1) * 2^40
};

XK_HOST_DEVICE inline RowRule MakeRule(float temperature, int32_t top_k, float top_p,
                                       float min_p, int64_t vocab, float max_logit) {
  RowRule r{};
  r.s = kLog2e / temperature;
  const bool finite_max = max_logit - max_logit == 0.0f;
  r.greedy = !(temperature > 0.0f) || !(r.s < 3.0e38f) || !finite_max;
  r.top_k = top_k > 0 && static_cast<int64_t>(top_k) < vocab;
  r.k = r.top_k ? static_cast<uint32_t>(top_k) : 0u;
  r.top_p = top_p < 1.0f;
  r.p = top_p > 0.0f ? static_cast<double>(top_p) : 0.0;
  r.min_p = min_p > 0.0f;
  r.min_weight = (min_p < 1.0f ? static_cast<double>(min_p) : 1.0) * kMaxWeight;
  return r;
}

XK_HOST_DEVICE inline bool KeepsMinP(const RowRule& r, uint64_t q) {
  return !r.min_p || static_cast<double>(q) >= r.min_weight;
}

// The top-p goal: the kept mass must reach p * (mass of the set top-p filters).
XK_HOST_DEVICE inline double TopPGoal(const RowRule& r, uint64_t mass) {
  return r.p * static_cast<double>(mass);
}

// Whether a mass meets the top-p goal; a goal of 0 (top_p <= 0) is met by the first key
// with any weight, the most likely token's.
XK_HOST_DEVICE inline bool Reaches(uint64_t mass, double goal) {
  return mass > 0 && static_cast<double>(mass) >= goal;
}

}  // namespace xla_kernels::sampling
