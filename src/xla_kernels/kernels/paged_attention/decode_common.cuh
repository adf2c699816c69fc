// paged_attention, device side: the kernels' arguments, the flash-decoding partition of a
// sequence, element conversions and the logit transform, used by every core.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "decode_params.h"
#include "paged_attention_limits.h"
#include "paged_attention_tuning.h"
#include "xla_kernels/cuda_mma.cuh"
#include "xla_kernels/cuda_pdl.cuh"
#include "xla_kernels/paged_cache.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

using namespace ::xla_kernels::cuda_mma;  // the shared mma/cp.async helpers
using namespace ::xla_kernels::cuda_pdl;  // programmatic dependent launch

using namespace ::xla_kernels::paged_attention::tuning;  // the tuning table

constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;

struct KernelArgs {
  const void* q;
  const void* k;
  const void* v;
  paged_cache::View cache;  // block tables and the K/V rows' addressing
  const int32_t* lens;
  void* out;
  float* ws;
  int S, Hq, Hkv, G;     // G = q heads per kv head
  int chunks;            // head chunks per kv head (ceil(G / GC))
  int T;                 // partitions per sequence in the grid (>= 1)
  int cta_tile;          // tokens per CTA tile (partition sizes are multiples of it)
  int window;            // 0: none
  float qk_scale;        // scale*log2e, or scale/softcap with a softcap
  float cap_mul;         // softcap*log2e, or 0 without a softcap
  float out_scale;       // fp8 caches: v_scale, applied with the final 1/l
};

struct SeqPart {
  int lo, hi;  // active tokens [lo, hi)
  int P;       // tokens per partition
  int n;       // partitions (1 also for an empty sequence)
};

// The partitioning of a sequence of `L` tokens (its seq_lens entry); the main and the reduce
// kernel must agree on it.
__device__ __forceinline__ SeqPart seq_partition_of(const KernelArgs& a, int L) {
  SeqPart r;
  const int cap = a.cache.capacity();
  L = L < cap ? L : cap;
  if (L <= 0) {
    r.lo = r.hi = 0;
    r.P = 0;
    r.n = 1;
    return r;
  }
  r.hi = L;
  r.lo = (a.window > 0 && L > a.window) ? L - a.window : 0;
  const int len = r.hi - r.lo;
  int n = (len + kPartMin - 1) / kPartMin;
  n = n < a.T ? n : a.T;
  int P = (len + n - 1) / n;
  P = (P + a.cta_tile - 1) / a.cta_tile * a.cta_tile;
  r.P = P;
  r.n = (len + P - 1) / P;
  return r;
}

// The partitioning of sequence s.
__device__ __forceinline__ SeqPart seq_partition(const KernelArgs& a, int s) {
  return seq_partition_of(a, __ldg(a.lens + s));
}

// 16 bytes of T -> floats.
template <typename T>
__device__ __forceinline__ void cvt16(const uint4& u, float* f) {
  if constexpr (std::is_same_v<T, float>) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
}

// N (1, 2, 4 or 8) elements of T in shared memory -> floats.
template <typename T, int N>
__device__ __forceinline__ void lds_cvt(const T* p, float* f) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes % 4 == 0 || kBytes == 2, "unsupported vector");
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[i];
      cvt16<T>(u, f + i * (16 / sizeof(T)));
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        f[i] = p[i];
      } else {
        f[i] = static_cast<float>(p[i]);
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// Logit transform of N dot products, in place: scale, optional softcap, base-2 units. The
// softcap branch is taken once per tile, outside the loops.
template <int N>
__device__ __forceinline__ void logits(float* x, const KernelArgs& a) {
  if (a.cap_mul > 0.f) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = a.cap_mul * tanhf(x[i] * a.qk_scale);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] *= a.qk_scale;
  }
}

}  // namespace detail
}  // namespace xla_kernels::paged_attention
