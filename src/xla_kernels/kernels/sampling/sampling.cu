// sample on NVIDIA GPUs: one block of kColumns (512) threads per row, no sort.
//
// Thread t holds the row's tokens 4t..4t+3, 4(t + 512)..4(t + 512)+3, ... (16-byte loads of
// f32, coalesced; also the draw's column order, sampling_core.h). Each step is one pass over the row (from L2 or HBM):
//   1. the largest logit (ties: lowest index) and the smallest/largest ordered key;
//      temperature <= 0 ends here (argmax);
//   2. top-k: the k-th largest key by a bracket search (Search below): each pass counts the
//      keys at or above 15 pivots spread over the bracket [lo, hi] that holds the answer,
//      keeps the sub-bracket where the count crosses k, and tightens it to the keys found in
//      it; it ends when the bracket holds one distinct key (or exactly k tokens lie above a
//      pivot): at most ~9 passes, usually fewer;
//   3. top-p: one pass for the mass of what top-k and min-p keep, then the same search on
//      masses (integer weights, sampling_core.h) for the top-p threshold;
//   4. the draw: each thread sums the weights its column keeps, a block scan finds the
//      column where the running mass passes the target, and the block scans that column.
// Masses are integer sums, so the order of the reductions does not matter: the token is the
// one the CPU kernel picks. Handler XkSampleCuda; command-buffer compatible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "sampling_core.h"
#include "sampling_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace xla_kernels::sampling {
namespace {

constexpr int kThreads = kColumns;
constexpr int kWarps = kThreads / 32;
constexpr int kPivots = 15;      // pivots per search pass
constexpr int kValuePivots = 8;  // of which evenly spaced in value (the rest: in key)
constexpr int kMaxPasses = 40;   // a guard: a search ends within 12 passes (32-bit keys)
constexpr int kUnroll = 4;       // runs of kVec tokens each thread loads at once
constexpr unsigned kFull = 0xffffffffu;

__device__ inline float Load(float x) { return x; }
__device__ inline float Load(__half x) { return __half2float(x); }
__device__ inline float Load(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ inline void Load4(const float* p, float (&x)[kVec]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}
__device__ inline void Load4(const __nv_bfloat16* p, float (&x)[kVec]) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
  x[0] = a.x;
  x[1] = a.y;
  x[2] = b.x;
  x[3] = b.y;
}
__device__ inline void Load4(const __half* p, float (&x)[kVec]) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
  x[0] = a.x;
  x[1] = a.y;
  x[2] = b.x;
  x[3] = b.y;
}

// fn(i, x) for this thread's tokens i (its column: kVec * (t + kThreads * g) + u) in
// increasing order, x = float(row[i]); vector loads where the row is aligned, kUnroll runs
// in flight per thread.
template <typename T, typename F>
__device__ inline void ForRow(const T* __restrict__ row, int64_t vocab, F&& fn) {
  constexpr int64_t kStride = int64_t{kVec} * kThreads;
  const bool aligned = reinterpret_cast<uintptr_t>(row) % (kVec * sizeof(T)) == 0;
  for (int64_t first = int64_t{kVec} * threadIdx.x; first < vocab; first += kUnroll * kStride) {
    float x[kUnroll][kVec];
#pragma unroll
    for (int a = 0; a < kUnroll; ++a) {
      const int64_t run = first + a * kStride;
      if (aligned && run + kVec <= vocab) {
        Load4(row + run, x[a]);
      } else {
#pragma unroll
        for (int u = 0; u < kVec; ++u) x[a][u] = run + u < vocab ? Load(row[run + u]) : 0.f;
      }
    }
#pragma unroll
    for (int a = 0; a < kUnroll; ++a)
#pragma unroll
      for (int u = 0; u < kVec; ++u) {
        const int64_t i = first + a * kStride + u;
        if (i < vocab) fn(i, x[a][u]);
      }
  }
}

// Token j of column `column` (j = 0, 1, ...: the column's order).
__device__ inline int64_t ColumnToken(int column, int64_t j) {
  return int64_t{kVec} * (column + int64_t{kThreads} * (j / kVec)) + j % kVec;
}

struct Shared {
  uint64_t sums[kWarps][kPivots + 1];
  uint32_t lows[kWarps], highs[kWarps];
  float values[kWarps];
  int indices[kWarps];
  uint64_t scan[kWarps];
  int column;
  uint64_t base;
  int token;
};

__device__ inline int Lane() { return threadIdx.x % 32; }
__device__ inline int Warp() { return threadIdx.x / 32; }

// Sums each of v[0..N) over the block; every thread gets the sums.
template <int N>
__device__ void BlockSum(uint64_t (&v)[N], Shared& sh) {
#pragma unroll
  for (int j = 0; j < N; ++j)
    for (int o = 16; o > 0; o >>= 1) v[j] += __shfl_xor_sync(kFull, v[j], o);
  __syncthreads();  // the previous reduction's readers are done with sh.sums
  if (Lane() == 0)
#pragma unroll
    for (int j = 0; j < N; ++j) sh.sums[Warp()][j] = v[j];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    uint64_t total = 0;
    for (int w = 0; w < kWarps; ++w) total += sh.sums[w][j];
    v[j] = total;
  }
}

// The block's min of `low` and max of `high`; every thread gets both.
__device__ void BlockMinMax(uint32_t* low, uint32_t* high, Shared& sh) {
  uint32_t lo = *low, hi = *high;
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(kFull, lo, o));
    hi = max(hi, __shfl_xor_sync(kFull, hi, o));
  }
  __syncthreads();
  if (Lane() == 0) {
    sh.lows[Warp()] = lo;
    sh.highs[Warp()] = hi;
  }
  __syncthreads();
  lo = UINT_MAX;
  hi = 0;
  for (int w = 0; w < kWarps; ++w) {
    lo = min(lo, sh.lows[w]);
    hi = max(hi, sh.highs[w]);
  }
  *low = lo;
  *high = hi;
}

// Inclusive scan of v over the threads in order; *total gets the block's sum.
__device__ uint64_t BlockScan(uint64_t v, Shared& sh, uint64_t* total) {
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_up_sync(kFull, v, o);
    if (Lane() >= o) v += n;
  }
  __syncthreads();
  if (Lane() == 31) sh.scan[Warp()] = v;
  __syncthreads();
  uint64_t offset = 0, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    const uint64_t s = sh.scan[w];
    if (w < Warp()) offset += s;
    sum += s;
  }
  *total = sum;
  return v + offset;
}

// What one pass looks at: the largest logit, the rule, and the thresholds found so far.
struct RowState {
  float m;
  RowRule rule;
  uint32_t threshold_k;  // keys below it are out (0: none)
  uint32_t threshold_p;
};

// Whether token x is kept by top-k and min-p (the set top-p filters); *q its weight.
__device__ inline bool InC(const RowState& r, float x, uint32_t key, uint64_t* q) {
  *q = Weight(x, r.m, r.rule.s);
  return key >= r.threshold_k && KeepsMinP(r.rule, *q);
}

// Pivots in the bracket [lo, hi] (lo < hi), each in [lo + 1, hi]: half evenly spaced in
// value (fast on logits, which spread evenly rather than by exponent), half evenly spaced in
// key (the bracket then shrinks at least 8x a pass, whatever the values).
__device__ inline void Pivots(uint32_t lo, uint32_t hi, uint32_t (&pivot)[kPivots]) {
  const float xlo = KeyFloat(lo), xhi = KeyFloat(hi);
  const uint64_t span = hi - lo;
#pragma unroll
  for (int j = 0; j < kPivots; ++j) {
    uint64_t key;
    if (j < kValuePivots) {
      const float fraction = static_cast<float>(j + 1) / (kValuePivots + 1);
      key = OrderedKey(xlo + (xhi - xlo) * fraction);
    } else {
      key = lo + 1 + span * (j - kValuePivots + 1) / (kPivots - kValuePivots + 1);
    }
    pivot[j] = static_cast<uint32_t>(min(max(key, static_cast<uint64_t>(lo) + 1),
                                         static_cast<uint64_t>(hi)));
  }
}

// The largest key v of a member whose value at and above it, F(v), meets the goal, given
// F(lo) meets it and no member lies above hi. Members and values: every token with value 1
// (kCount, top-k: goal k) or the tokens of C with their weights (top-p). *at gets F(answer)
// (top-k: a count, unused). kCount may stop early: when exactly k tokens lie at or above a
// pivot, that pivot gives the same set as the k-th largest key.
template <bool kCount, typename T>
__device__ uint32_t Search(const T* __restrict__ row, int64_t vocab, const RowState& r,
                           uint32_t lo, uint32_t hi, double goal, Shared& sh, uint64_t* at) {
  auto meets = [&](uint64_t f) {
    return kCount ? f >= static_cast<uint64_t>(goal) : Reaches(f, goal);
  };
  uint64_t above = 0;  // F(hi + 1)
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    uint32_t pivot[kPivots];
    Pivots(lo, hi, pivot);
    uint64_t acc[kPivots + 1] = {};  // acc[j]: members at or above pivot[j]; last: all in
    uint32_t low = UINT_MAX, high = 0;
    ForRow(row, vocab, [&](int64_t, float x) {
      const uint32_t key = OrderedKey(x);
      if (key < lo || key > hi) return;
      uint64_t value = 1;
      if (!kCount && !InC(r, x, key, &value)) return;
      acc[kPivots] += value;
#pragma unroll
      for (int j = 0; j < kPivots; ++j) acc[j] += key >= pivot[j] ? value : 0;
      low = min(low, key);
      high = max(high, key);
    });
    BlockSum(acc, sh);
    BlockMinMax(&low, &high, sh);
    if (low > high) break;  // no member left in the bracket: cannot happen
    if (low == high) {
      *at = above + acc[kPivots];
      return low;
    }
    // F is non-increasing: the pivots that meet the goal lie below those that do not.
    uint32_t new_lo = lo, new_hi = hi;
    uint64_t at_lo = above + acc[kPivots], new_above = above;
#pragma unroll
    for (int j = 0; j < kPivots; ++j) {
      const uint64_t f = above + acc[j];
      if (meets(f)) {
        if (pivot[j] > new_lo) {
          new_lo = pivot[j];
          at_lo = f;
        }
      } else if (pivot[j] - 1u < new_hi) {
        new_hi = pivot[j] - 1u;
        new_above = f;
      }
    }
    if (kCount && at_lo == static_cast<uint64_t>(goal)) {
      *at = at_lo;
      return new_lo;
    }
    // No member lies in [new_lo, low) or (high, new_hi]: F(lo) and F(hi + 1) stay.
    lo = max(new_lo, low);
    hi = min(new_hi, high);
    above = new_above;
  }
  *at = above;
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SampleKernel(const T* __restrict__ logits, int64_t vocab, const float* __restrict__ temperature,
                 const int32_t* __restrict__ top_k, const float* __restrict__ top_p,
                 const float* __restrict__ min_p, const uint32_t* __restrict__ seeds,
                 const uint32_t* __restrict__ offsets, int32_t* __restrict__ tokens) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  const T* row = logits + b * vocab;

  // 1. argmax (ties: lowest index; NaN skipped) and the range of keys.
  float best = -INFINITY;
  int best_i = INT_MAX;
  uint32_t kmin = UINT_MAX, kmax = 0;
  ForRow(row, vocab, [&](int64_t i, float x) {
    if (x > best || (x == best && static_cast<int>(i) < best_i)) {
      best = x;
      best_i = static_cast<int>(i);
    }
    const uint32_t key = OrderedKey(x);
    kmin = min(kmin, key);
    kmax = max(kmax, key);
  });
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(kFull, best, o);
    const int vi = __shfl_xor_sync(kFull, best_i, o);
    if (v > best || (v == best && vi < best_i)) {
      best = v;
      best_i = vi;
    }
  }
  if (Lane() == 0) {
    sh.values[Warp()] = best;
    sh.indices[Warp()] = best_i;
  }
  __syncthreads();
  best = sh.values[0];
  best_i = sh.indices[0];
  for (int w = 1; w < kWarps; ++w)
    if (sh.values[w] > best || (sh.values[w] == best && sh.indices[w] < best_i)) {
      best = sh.values[w];
      best_i = sh.indices[w];
    }
  BlockMinMax(&kmin, &kmax, sh);
  if (best_i == INT_MAX) {  // every logit NaN
    if (threadIdx.x == 0) tokens[b] = 0;
    return;
  }
  RowState r;
  r.m = Load(row[best_i]);
  r.rule = MakeRule(temperature[b], top_k[b], top_p[b], min_p[b], vocab, r.m);
  if (r.rule.greedy) {
    if (threadIdx.x == 0) tokens[b] = best_i;
    return;
  }
  r.threshold_k = 0;
  r.threshold_p = 0;
  uint64_t unused;

  // 2. top-k.
  if (r.rule.top_k)
    r.threshold_k = Search<true>(row, vocab, r, kmin, kmax, static_cast<double>(r.rule.k), sh,
                                 &unused);

  // 3. top-p over what top-k and min-p keep.
  if (r.rule.top_p) {
    uint64_t mass[1] = {0};
    ForRow(row, vocab, [&](int64_t, float x) {
      uint64_t q;
      if (InC(r, x, OrderedKey(x), &q)) mass[0] += q;
    });
    BlockSum(mass, sh);
    r.threshold_p = Search<false>(row, vocab, r, r.rule.top_k ? r.threshold_k : kmin, kmax,
                                  TopPGoal(r.rule, mass[0]), sh, &unused);
  }

  // 4. the draw: which column, then where in it.
  auto kept = [&](float x) -> uint64_t {
    const uint32_t key = OrderedKey(x);
    uint64_t q;
    return InC(r, x, key, &q) && key >= r.threshold_p ? q : 0;
  };
  uint64_t mine = 0;
  ForRow(row, vocab, [&](int64_t, float x) { mine += kept(x); });
  uint64_t total;
  const uint64_t through = BlockScan(mine, sh, &total);
  const uint64_t target = MulHi64(total, DrawBits(seeds[b], offsets[b]));
  if (threadIdx.x == 0) sh.token = best_i;  // kept if nothing is found: cannot happen
  if (through - mine <= target && target < through) {
    sh.column = threadIdx.x;
    sh.base = through - mine;
  }
  __syncthreads();
  const int column = sh.column;
  uint64_t base = sh.base;
  for (int64_t chunk = 0; ColumnToken(column, chunk * kThreads) < vocab; ++chunk) {
    const int64_t i = ColumnToken(column, chunk * kThreads + threadIdx.x);
    const uint64_t v = i < vocab ? kept(Load(row[i])) : 0;
    uint64_t chunk_total;
    const uint64_t upto = BlockScan(v, sh, &chunk_total);
    if (base + upto - v <= target && target < base + upto) sh.token = static_cast<int>(i);
    base += chunk_total;
  }
  __syncthreads();
  if (threadIdx.x == 0) tokens[b] = sh.token;
}

ffi::Error LaunchError() {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(kOp) + ": launch failed: " + cudaGetErrorString(e));
}

template <typename T>
void Launch(cudaStream_t stream, const Shape& s, const void* logits, const ffi::AnyBuffer& t,
            const ffi::AnyBuffer& k, const ffi::AnyBuffer& p, const ffi::AnyBuffer& m,
            const ffi::AnyBuffer& seeds, const ffi::AnyBuffer& offsets, void* tokens) {
  SampleKernel<T><<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(
      static_cast<const T*>(logits), s.vocab, static_cast<const float*>(t.untyped_data()),
      static_cast<const int32_t*>(k.untyped_data()), static_cast<const float*>(p.untyped_data()),
      static_cast<const float*>(m.untyped_data()),
      static_cast<const uint32_t*>(seeds.untyped_data()),
      static_cast<const uint32_t*>(offsets.untyped_data()), static_cast<int32_t*>(tokens));
}

ffi::Error SampleCuda(cudaStream_t stream, ffi::AnyBuffer logits, ffi::AnyBuffer temperature,
                      ffi::AnyBuffer top_k, ffi::AnyBuffer top_p, ffi::AnyBuffer min_p,
                      ffi::AnyBuffer seeds, ffi::AnyBuffer offsets,
                      ffi::Result<ffi::AnyBuffer> tokens) {
  Shape s;
  ffi::Error err = Decode(logits, temperature, top_k, top_p, min_p, seeds, offsets, *tokens, &s);
  if (err.failure()) return err;
  if (s.rows == 0) return ffi::Error::Success();
  if (s.rows > 0x7fffffff) return Bad("logits", "too many rows for one launch", "split logits");
  switch (logits.element_type()) {
    case ffi::DataType::F32:
      Launch<float>(stream, s, logits.untyped_data(), temperature, top_k, top_p, min_p, seeds,
                    offsets, tokens->untyped_data());
      break;
    case ffi::DataType::BF16:
      Launch<__nv_bfloat16>(stream, s, logits.untyped_data(), temperature, top_k, top_p, min_p,
                            seeds, offsets, tokens->untyped_data());
      break;
    case ffi::DataType::F16:
      Launch<__half>(stream, s, logits.untyped_data(), temperature, top_k, top_p, min_p, seeds,
                     offsets, tokens->untyped_data());
      break;
    default:
      return Bad("logits", "unsupported dtype on cuda", "pass f32, bf16 or f16 logits");
  }
  return LaunchError();
}

}  // namespace
}  // namespace xla_kernels::sampling

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkSampleCuda, xla_kernels::sampling::SampleCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});
