// paged_attention's epilogue across CTAs: the reduce kernel that combines a sequence's
// flash-decoding partitions.
#pragma once

#include "decode_common.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

// Combines the partitions of each (sequence, q head); sequences with one partition were
// finished by the main kernel. One CTA of kReduceWarps warps per (sequence, q head): every
// warp reads the (m, l) of all partitions (lanes hold two each) and finds the common
// maximum; warp w sums partitions w, w + kReduceWarps, ... (lanes over D); the warps' sums
// are added through shared memory. Everything the sum needs is loaded in one round trip
// after the main kernel: the (m, l) of every partition slot (a.T of them), the warp's first
// kReduceBatch accumulators and the sequence's length are all in flight together, and the
// slots past the partitions the main kernel used (never written) are dropped once they
// arrive (the length, then (m, l), then the accumulators would put three dependent round
// trips between the main kernel's end and the output).
constexpr int kReduceWarps = 4;
static_assert(kMaxParts <= 64, "the reduce kernel holds two partitions per lane");

// Accumulators per warp in flight at once: every partition slot in one round up to head_dim
// 128 (64 registers of them per lane), half of them at 256.
template <int D>
constexpr int kReduceBatch = (D <= 128 ? kMaxParts : kMaxParts / 2) / kReduceWarps;

template <typename T, int D, bool kScaled = false>
__global__ void __launch_bounds__(32 * kReduceWarps) paged_attention_reduce(const KernelArgs a) {
  constexpr int kDpl = D / 32;
  constexpr int kBatch = kReduceBatch<D>;
  __shared__ __align__(16) float sums[kReduceWarps][D];
  pdl_wait();  // the main kernel's partials are complete and visible
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = blockIdx.x / a.Hq, h = blockIdx.x % a.Hq;
  const int len = __ldg(a.lens + s);
  const int64_t row = (static_cast<int64_t>(s) * a.Hq + h) * a.T;
  const float* ws_acc = a.ws + row * D;
  const float* ws_ml = a.ws + static_cast<int64_t>(a.S) * a.Hq * a.T * D + row * 2;
  // The loads are volatile asm so that the compiler issues them here, before the length is
  // used: with plain loads it had sunk most of them below the (then early) return for
  // one-partition sequences, behind the length's round trip. ptxas still places two of the
  // accumulator loads after the length's division at head_dim 128, four at 256 (none at 64).
  auto ld2 = [](const float* src, float* x) {
    asm volatile("ld.global.v2.f32 {%0, %1}, [%2];" : "=f"(x[0]), "=f"(x[1]) : "l"(src));
  };
  auto ld4 = [](const float* src, float* x) {
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                 : "l"(src));
  };
  // Partition slot p's accumulator: this lane's kDpl values (any slot < a.T is inside the
  // workspace, written or not).
  auto load_acc = [&](int p, float (&x)[kDpl]) {
    const float* src = ws_acc + static_cast<int64_t>(p) * D + lane * kDpl;
    if constexpr (kDpl % 4 == 0) {
#pragma unroll
      for (int e = 0; e < kDpl; e += 4) ld4(src + e, x + e);
    } else {
      ld2(src, x);
    }
  };
  float ml0[2] = {-INFINITY, 0.f}, ml1[2] = {-INFINITY, 0.f};
  if (lane < a.T) ld2(ws_ml + 2 * lane, ml0);
  if (lane + 32 < a.T) ld2(ws_ml + 2 * (lane + 32), ml1);
  float x[kBatch][kDpl];
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    const int p = warp + j * kReduceWarps;
    if (p < a.T) load_acc(p, x[j]);
  }
  // A sequence with one partition (finished by the main kernel) is not stored below; no
  // early return here, which let ptxas sink loads below it.
  const SeqPart sp = seq_partition_of(a, len);
  const float m0 = lane < sp.n ? ml0[0] : -INFINITY, l0 = lane < sp.n ? ml0[1] : 0.f;
  const float m1 = lane + 32 < sp.n ? ml1[0] : -INFINITY, l1 = lane + 32 < sp.n ? ml1[1] : 0.f;
  float mx = fmaxf(m0, m1);
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
  const float b = safe_max(mx);
  const float w0 = exp2f(m0 - b), w1 = exp2f(m1 - b);  // 0 for absent partitions
  float acc[kDpl];
#pragma unroll
  for (int e = 0; e < kDpl; ++e) acc[e] = 0.f;
  // Adds partition p's accumulator (x, loaded before) with its weight; the values of a slot
  // past sp.n are garbage and are never used (a select, not a product with weight 0).
  auto add = [&](int p, const float (&xp)[kDpl]) {  // p warp-uniform
    const float w = __shfl_sync(kFull, p < 32 ? w0 : w1, p & 31);
    if (p < sp.n) {
#pragma unroll
      for (int e = 0; e < kDpl; ++e) acc[e] = fmaf(w, xp[e], acc[e]);
    }
  };
#pragma unroll
  for (int j = 0; j < kBatch; ++j) add(warp + j * kReduceWarps, x[j]);
  // Slots beyond the first round (head_dim 256 with more than 32 partitions).
  for (int p = warp + kBatch * kReduceWarps; p < sp.n; p += kReduceWarps) {
    float xp[kDpl];
    load_acc(p, xp);
    add(p, xp);
  }
#pragma unroll
  for (int e = 0; e < kDpl; ++e) sums[warp][lane * kDpl + e] = acc[e];
  float lsum = w0 * l0 + w1 * l1;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) lsum += __shfl_xor_sync(kFull, lsum, off);
  __syncthreads();
  float inv = lsum > 0.f ? 1.f / lsum : 0.f;
  if constexpr (kScaled) inv *= a.out_scale;  // fp8 caches: v_scale
  if (sp.n <= 1) return;
  T* o = static_cast<T*>(a.out) + (static_cast<int64_t>(s) * a.Hq + h) * D;
  for (int d = threadIdx.x; d < D; d += 32 * kReduceWarps) {
    float x = 0.f;
#pragma unroll
    for (int w = 0; w < kReduceWarps; ++w) x += sums[w][d];
    o[d] = from_float<T>(x * inv);
  }
}

}  // namespace detail
}  // namespace xla_kernels::paged_attention
