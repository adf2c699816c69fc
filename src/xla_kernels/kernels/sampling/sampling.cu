// sample on NVIDIA GPUs, sort-free. A row is read by kRanks (8) logical blocks of 512 threads:
// on Hopper, while the grid fits one wave, a cluster of 8, 4 or 2 blocks (one per SM, each
// doing 1, 2 or 4 of them, combining their sums through distributed shared memory);
// otherwise one block doing the 8 in turn. Thread t of logical block r holds
// the runs of 4 tokens of column c = 512 r + t (sampling_core.h: 16-byte loads of f32,
// coalesced; also the draw's order). Each step is one pass over the row (L2 or HBM):
//   1. the largest logit (ties: lowest index) and the smallest/largest ordered key;
//      temperature <= 0 ends here (argmax);
//   2. top-k: the k-th largest key by a bracket search (Search below): each pass counts the
//      keys at or above 15 pivots spread over the bracket [lo, hi] that holds the answer,
//      keeps the sub-bracket where the count crosses k, and tightens it to the keys found in
//      it; it ends when the bracket holds one distinct key (or exactly k tokens lie above a
//      pivot);
//   3. top-p: one pass for the mass of what top-k and min-p keep, then the same search on
//      masses (integer weights, sampling_core.h) for the top-p threshold;
//   4. the draw: each thread sums the weights its column keeps, a scan finds the column
//      where the running mass passes the target, and its block scans that column.
// Masses are integer sums, so the order of the reductions does not matter: the token is the
// one the CPU kernel picks. Handler XkSampleCuda; command-buffer compatible.
#include <cooperative_groups.h>
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

constexpr int kThreads = 512;
constexpr int kRanks = kColumns / kThreads;  // logical blocks per row
constexpr int kWarps = kThreads / 32;
constexpr int kPivots = 15;      // pivots per search pass
constexpr int kValuePivots = 8;  // of which evenly spaced in value (the rest: in key)
constexpr int kMaxPasses = 40;   // a guard: a search ends within 12 passes (32-bit keys)
constexpr int kUnroll = 4;       // runs of kVec tokens each thread loads at once
constexpr int kSlots = kPivots + 1;  // most values one reduction combines
// Top-k survivors a block keeps in shared memory (top-p and the draw then read them, not the
// row) when the row's top-k set holds at most this many tokens.
constexpr int kCandidates = 1024;
constexpr unsigned kFull = 0xffffffffu;
static_assert(kColumns % kThreads == 0, "columns come in whole blocks");

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

struct Candidates {
  int count;
  int index[kCandidates];
  uint32_t key[kCandidates];
  uint64_t weight[kCandidates];
};

struct Shared {
  Candidates c;
  uint64_t warps[kWarps][kSlots];
  uint64_t part[2][kSlots];               // this block's results, read by the cluster
  uint64_t gathered[kSlots][kRanks];      // the cluster's blocks' results
  uint64_t scan[kWarps];
  int column;
  uint64_t base;
  int token;
};

__device__ inline int Lane() { return threadIdx.x % 32; }
__device__ inline int Warp() { return threadIdx.x / 32; }

// One row's blocks: kCluster real blocks (a cluster, or 1), each doing kLocal logical ones.
template <int kCluster>
struct Row {
  static constexpr int kLocal = kRanks / kCluster;
  Shared& sh;
  int rank;   // this block's rank in the cluster
  int phase;  // which sh.part the next cluster reduction writes (alternating)

  // The column thread threadIdx.x holds in its local logical block r.
  __device__ int Column(int r) const { return (rank * kLocal + r) * kThreads + threadIdx.x; }
};

__device__ inline uint64_t Combine(bool max_op, uint64_t a, uint64_t b) {
  return max_op ? (a > b ? a : b) : a + b;
}

// Sums (kMax: maxima) of v[0..N) over the row's threads; every thread gets the results.
template <bool kMax, int N, int kCluster>
__device__ void Reduce(uint64_t (&v)[N], Row<kCluster>& row) {
  static_assert(N <= kSlots, "Shared holds kSlots values per reduction");
  Shared& sh = row.sh;
#pragma unroll
  for (int j = 0; j < N; ++j)
    for (int o = 16; o > 0; o >>= 1) v[j] = Combine(kMax, v[j], __shfl_xor_sync(kFull, v[j], o));
  __syncthreads();  // the previous reduction's readers are done with sh.warps, sh.gathered
  if (Lane() == 0)
#pragma unroll
    for (int j = 0; j < N; ++j) sh.warps[Warp()][j] = v[j];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    uint64_t total = sh.warps[0][j];
    for (int w = 1; w < kWarps; ++w) total = Combine(kMax, total, sh.warps[w][j]);
    v[j] = total;
  }
  if constexpr (kCluster > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    uint64_t* part = sh.part[row.phase];
    row.phase ^= 1;  // a block rewrites this buffer two reductions later, once all read it
    if (threadIdx.x == 0)
#pragma unroll
      for (int j = 0; j < N; ++j) part[j] = v[j];
    cluster.sync();
    if (threadIdx.x < N * kCluster) {
      const int j = threadIdx.x % N, c = threadIdx.x / N;
      sh.gathered[j][c] = *cluster.map_shared_rank(part + j, c);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; ++j) {
      uint64_t total = sh.gathered[j][0];
      for (int c = 1; c < kCluster; ++c) total = Combine(kMax, total, sh.gathered[j][c]);
      v[j] = total;
    }
#else
    __trap();  // clusters are launched on Hopper and later only
#endif
  }
}

// The sum of `v` over the cluster's blocks of rank below this block's (*below), and over all
// of them (*all); `v` is the same in every thread of a block.
template <int kCluster>
__device__ void ClusterPrefix(uint64_t v, Row<kCluster>& row, uint64_t* below, uint64_t* all) {
  uint64_t each[kRanks] = {};
#pragma unroll
  for (int c = 0; c < kRanks; ++c)
    if (c == row.rank && (kCluster == 1 || threadIdx.x == 0)) each[c] = v;
  // One thread per block fills its block's slot: the sum gives every block's value.
  if constexpr (kCluster > 1) {
    uint64_t slots[kCluster];
#pragma unroll
    for (int c = 0; c < kCluster; ++c) slots[c] = each[c];
    Reduce<false>(slots, row);
#pragma unroll
    for (int c = 0; c < kCluster; ++c) each[c] = slots[c];
  }
  *below = 0;
  *all = 0;
#pragma unroll
  for (int c = 0; c < kCluster; ++c) {
    if (c < row.rank) *below += each[c];
    *all += each[c];
  }
}

// Inclusive scan of v over the block's threads in order; *total gets the block's sum.
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

// fn(r, i, x) for the tokens i of this thread's columns (local logical block r), x =
// float(row[i]); vector loads where the row is aligned, kUnroll runs in flight per thread.
template <typename T, int kCluster, typename F>
__device__ inline void ForRow(const T* __restrict__ logits, int64_t vocab,
                              const Row<kCluster>& row, F&& fn) {
  constexpr int64_t kStride = int64_t{kVec} * kColumns;
  const bool aligned = reinterpret_cast<uintptr_t>(logits) % (kVec * sizeof(T)) == 0;
#pragma unroll 1
  for (int r = 0; r < Row<kCluster>::kLocal; ++r) {
    for (int64_t first = int64_t{kVec} * row.Column(r); first < vocab;
         first += kUnroll * kStride) {
      float x[kUnroll][kVec];
#pragma unroll
      for (int a = 0; a < kUnroll; ++a) {
        const int64_t run = first + a * kStride;
        if (aligned && run + kVec <= vocab) {
          Load4(logits + run, x[a]);
        } else {
#pragma unroll
          for (int u = 0; u < kVec; ++u)
            x[a][u] = run + u < vocab ? Load(logits[run + u]) : 0.f;
        }
      }
#pragma unroll
      for (int a = 0; a < kUnroll; ++a)
#pragma unroll
        for (int u = 0; u < kVec; ++u) {
          const int64_t i = first + a * kStride + u;
          if (i < vocab) fn(r, i, x[a][u]);
        }
    }
  }
}

// Token j of column `column` (j = 0, 1, ...: the column's order).
__device__ inline int64_t ColumnToken(int column, int64_t j) {
  return int64_t{kVec} * (column + int64_t{kColumns} * (j / kVec)) + j % kVec;
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
// F(lo) meets it and no member lies above hi. `members(fn)` calls fn(key, value) for this
// thread's members: every token with value 1 (kCount, top-k: goal k), or the tokens of C with
// their weights (top-p). *at gets F(answer) (UINT64_MAX if the guard stopped the search).
// kCount may stop early: when exactly k tokens lie at or above a pivot, that pivot gives the
// same set as the k-th largest key.
template <bool kCount, int kCluster, typename Members>
__device__ uint32_t Search(Members&& members, uint32_t lo, uint32_t hi, double goal,
                           Row<kCluster>& row, uint64_t* at) {
  auto meets = [&](uint64_t f) {
    return kCount ? f >= static_cast<uint64_t>(goal) : Reaches(f, goal);
  };
  uint64_t above = 0;  // F(hi + 1)
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    uint32_t pivot[kPivots];
    Pivots(lo, hi, pivot);
    uint64_t acc[kSlots] = {};  // acc[j]: members at or above pivot[j]; last: all in
    uint32_t low = UINT_MAX, high = 0;
    members([&](uint32_t key, uint64_t value) {
      if (key < lo || key > hi) return;
      acc[kPivots] += value;
#pragma unroll
      for (int j = 0; j < kPivots; ++j) acc[j] += key >= pivot[j] ? value : 0;
      low = min(low, key);
      high = max(high, key);
    });
    Reduce<false>(acc, row);
    uint64_t bounds[2] = {~low & 0xffffffffu, high};
    Reduce<true>(bounds, row);
    low = ~static_cast<uint32_t>(bounds[0]);
    high = static_cast<uint32_t>(bounds[1]);
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
  *at = UINT64_MAX;
  return lo;
}

// The column-order rank of token i within its block: by column, then by index.
__device__ inline uint64_t DrawOrder(int i) {
  return (static_cast<uint64_t>((i / kVec) % kColumns) << 32) | static_cast<uint32_t>(i);
}

// The token of one row; every block of the row returns here (the caller then waits for the
// cluster before its shared memory goes away).
template <typename T, int kCluster>
__device__ void SampleRow(const T* __restrict__ logits, int64_t vocab, float temperature,
                          int32_t top_k, float top_p, float min_p, uint32_t seed,
                          uint32_t offset, int32_t* token, Row<kCluster>& row) {
  Shared& sh = row.sh;
  const bool writer = row.rank == 0 && threadIdx.x == 0;

  // 1. argmax (ties: lowest index; NaN skipped) and the range of keys. The argmax is the
  // largest code OrderedKey(x) << 32 | ~i (0: no token yet).
  uint64_t best = 0;
  uint32_t kmin = UINT_MAX, kmax = 0;
  ForRow(logits, vocab, row, [&](int, int64_t i, float x) {
    const uint32_t key = OrderedKey(x);
    if (x == x) {
      const uint64_t code = (static_cast<uint64_t>(key) << 32) | (~static_cast<uint32_t>(i));
      best = code > best ? code : best;
    }
    kmin = min(kmin, key);
    kmax = max(kmax, key);
  });
  uint64_t first[3] = {best, ~kmin & 0xffffffffu, kmax};
  Reduce<true>(first, row);
  kmin = ~static_cast<uint32_t>(first[1]);
  kmax = static_cast<uint32_t>(first[2]);
  if (first[0] == 0) {  // every logit NaN
    if (writer) *token = 0;
    return;
  }
  const int argmax = static_cast<int>(~static_cast<uint32_t>(first[0]));
  RowState r;
  r.m = KeyFloat(static_cast<uint32_t>(first[0] >> 32));
  r.rule = MakeRule(temperature, top_k, top_p, min_p, vocab, r.m);
  if (r.rule.greedy) {
    if (writer) *token = argmax;
    return;
  }
  r.threshold_k = 0;
  r.threshold_p = 0;

  // 2. top-k.
  uint64_t top_k_count = UINT64_MAX;  // tokens at or above the top-k threshold
  if (r.rule.top_k) {
    auto every = [&](auto&& fn) {
      ForRow(logits, vocab, row, [&](int, int64_t, float x) { fn(OrderedKey(x), 1); });
    };
    r.threshold_k = Search<true>(every, kmin, kmax, static_cast<double>(r.rule.k), row,
                                 &top_k_count);
  }

  // Few top-k survivors: each block copies its own to shared memory in one pass; top-p and
  // the draw then read those.
  if (top_k_count <= kCandidates) {
    Candidates& c = sh.c;
    if (threadIdx.x == 0) c.count = 0;
    __syncthreads();
    ForRow(logits, vocab, row, [&](int, int64_t i, float x) {
      const uint32_t key = OrderedKey(x);
      uint64_t q;
      if (key < r.threshold_k || !InC(r, x, key, &q)) return;
      const int slot = atomicAdd(&c.count, 1);
      c.index[slot] = static_cast<int>(i);
      c.key[slot] = key;
      c.weight[slot] = q;
    });
    __syncthreads();
    const int n = c.count;
    auto candidates = [&](auto&& fn) {
      for (int e = threadIdx.x; e < n; e += kThreads) fn(c.key[e], c.weight[e]);
    };
    if (r.rule.top_p) {
      uint64_t mass[1] = {0};
      candidates([&](uint32_t, uint64_t q) { mass[0] += q; });
      Reduce<false>(mass, row);
      uint64_t unused;
      r.threshold_p = Search<false>(candidates, r.threshold_k, kmax,
                                    TopPGoal(r.rule, mass[0]), row, &unused);
    }
    uint64_t mine = 0;
    candidates([&](uint32_t key, uint64_t q) { mine += key >= r.threshold_p ? q : 0; });
    uint64_t block_total;
    BlockScan(mine, sh, &block_total);
    uint64_t below, all;
    ClusterPrefix(block_total, row, &below, &all);
    const uint64_t target = MulHi64(all, DrawBits(seed, offset));
    if (!(below <= target && target < below + block_total)) return;  // another block's
    if (threadIdx.x == 0) sh.token = argmax;  // kept if nothing is found: cannot happen
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += kThreads) {
      if (c.key[e] < r.threshold_p) continue;
      const uint64_t order = DrawOrder(c.index[e]);
      uint64_t before = below;  // the kept mass ahead of e in the draw's order
      for (int f = 0; f < n; ++f)
        if (c.key[f] >= r.threshold_p && DrawOrder(c.index[f]) < order) before += c.weight[f];
      if (before <= target && target < before + c.weight[e]) sh.token = c.index[e];
    }
    __syncthreads();
    if (threadIdx.x == 0) *token = sh.token;
    return;
  }

  // 3. top-p over what top-k and min-p keep.
  if (r.rule.top_p) {
    uint64_t mass[1] = {0};
    ForRow(logits, vocab, row, [&](int, int64_t, float x) {
      uint64_t q;
      if (InC(r, x, OrderedKey(x), &q)) mass[0] += q;
    });
    Reduce<false>(mass, row);
    auto in_c = [&](auto&& fn) {
      ForRow(logits, vocab, row, [&](int, int64_t, float x) {
        const uint32_t key = OrderedKey(x);
        uint64_t q;
        if (InC(r, x, key, &q)) fn(key, q);
      });
    };
    uint64_t unused;
    r.threshold_p = Search<false>(in_c, r.rule.top_k ? r.threshold_k : kmin, kmax,
                                  TopPGoal(r.rule, mass[0]), row, &unused);
  }

  // 4. the draw: which column (the running mass in column order: logical block, then
  // thread), then where in it.
  auto kept = [&](float x) -> uint64_t {
    const uint32_t key = OrderedKey(x);
    uint64_t q;
    return InC(r, x, key, &q) && key >= r.threshold_p ? q : 0;
  };
  uint64_t mine[Row<kCluster>::kLocal] = {};
  ForRow(logits, vocab, row, [&](int local, int64_t, float x) {
#pragma unroll
    for (int l = 0; l < Row<kCluster>::kLocal; ++l)
      if (l == local) mine[l] += kept(x);
  });
  uint64_t through[Row<kCluster>::kLocal], block_total = 0;
#pragma unroll
  for (int l = 0; l < Row<kCluster>::kLocal; ++l) {
    uint64_t total;
    through[l] = block_total + BlockScan(mine[l], sh, &total);
    block_total += total;
  }
  uint64_t below, all;
  ClusterPrefix(block_total, row, &below, &all);
  const uint64_t target = MulHi64(all, DrawBits(seed, offset));
  if (!(below <= target && target < below + block_total)) return;  // another block's column
  if (threadIdx.x == 0) sh.token = argmax;  // kept if nothing is found: cannot happen
#pragma unroll
  for (int l = 0; l < Row<kCluster>::kLocal; ++l)
    if (below + through[l] - mine[l] <= target && target < below + through[l]) {
      sh.column = row.Column(l);
      sh.base = below + through[l] - mine[l];
    }
  __syncthreads();
  const int column = sh.column;
  uint64_t base = sh.base;
  for (int64_t chunk = 0; ColumnToken(column, chunk * kThreads) < vocab; ++chunk) {
    const int64_t i = ColumnToken(column, chunk * kThreads + threadIdx.x);
    const uint64_t v = i < vocab ? kept(Load(logits[i])) : 0;
    uint64_t chunk_total;
    const uint64_t upto = BlockScan(v, sh, &chunk_total);
    if (base + upto - v <= target && target < base + upto) sh.token = static_cast<int>(i);
    base += chunk_total;
  }
  __syncthreads();
  if (threadIdx.x == 0) *token = sh.token;
}

template <typename T, int kCluster>
__global__ void __launch_bounds__(kThreads)
    SampleKernel(const T* __restrict__ logits, int64_t vocab, const float* __restrict__ temperature,
                 const int32_t* __restrict__ top_k, const float* __restrict__ top_p,
                 const float* __restrict__ min_p, const uint32_t* __restrict__ seeds,
                 const uint32_t* __restrict__ offsets, int32_t* __restrict__ tokens) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x / kCluster;
  Row<kCluster> row{sh, static_cast<int>(blockIdx.x % kCluster), 0};
  SampleRow<T, kCluster>(logits + b * vocab, vocab, temperature[b], top_k[b], top_p[b],
                         min_p[b], seeds[b], offsets[b], tokens + b, row);
  if constexpr (kCluster > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();  // others may still read this block's sh
#endif
  }
}

ffi::Error LaunchError() {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(kOp) + ": launch failed: " + cudaGetErrorString(e));
}

// The blocks a row's kRanks logical blocks run on (a cluster of that many, each block doing
// kRanks / cluster of them in turn): on Hopper and later the largest cluster of 8, 4 or 2
// whose grid fits one block per SM (the kernel's 512 threads x 128 registers fill an SM), so
// the grid runs in one wave; 1 (a block per row, no cluster barriers) above half as many
// rows as SMs (67 on 132), or before Hopper. Either way the token is the same: the columns do
// not change.
int ClusterBlocks(int64_t rows) {
  int device = 0, major = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      major < 9)
    return 1;
  for (int cluster = kRanks; cluster > 1; cluster /= 2)
    if (rows * cluster <= sms) return cluster;
  return 1;
}

struct Args {
  const void* logits;
  int64_t vocab;
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const uint32_t* seeds;
  const uint32_t* offsets;
  int32_t* tokens;
};

// A launch of SampleKernel<T, kCluster> as clusters of kCluster blocks; false where no such
// cluster fits (the caller falls back to a block per row, which draws the same token).
template <typename T, int kCluster>
bool LaunchClusters(cudaStream_t stream, int64_t rows, const Args& a) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows * kCluster));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = kCluster;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  if (cudaLaunchKernelEx(&config, SampleKernel<T, kCluster>, static_cast<const T*>(a.logits),
                         a.vocab, a.temperature, a.top_k, a.top_p, a.min_p, a.seeds, a.offsets,
                         a.tokens) == cudaSuccess)
    return true;
  cudaGetLastError();  // clear the refused launch's error
  return false;
}

template <typename T>
void Launch(cudaStream_t stream, int64_t rows, const Args& a) {
  static_assert(kRanks == 8, "cluster sizes 8, 4 and 2 are instantiated below");
  switch (ClusterBlocks(rows)) {
    case 8: if (LaunchClusters<T, 8>(stream, rows, a)) return; break;
    case 4: if (LaunchClusters<T, 4>(stream, rows, a)) return; break;
    case 2: if (LaunchClusters<T, 2>(stream, rows, a)) return; break;
    default: break;
  }
  SampleKernel<T, 1><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<const T*>(a.logits), a.vocab, a.temperature, a.top_k, a.top_p, a.min_p,
      a.seeds, a.offsets, a.tokens);
}

ffi::Error SampleCuda(cudaStream_t stream, ffi::AnyBuffer logits, ffi::AnyBuffer temperature,
                      ffi::AnyBuffer top_k, ffi::AnyBuffer top_p, ffi::AnyBuffer min_p,
                      ffi::AnyBuffer seeds, ffi::AnyBuffer offsets,
                      ffi::Result<ffi::AnyBuffer> tokens) {
  Shape s;
  ffi::Error err = Decode(logits, temperature, top_k, top_p, min_p, seeds, offsets, *tokens, &s);
  if (err.failure()) return err;
  if (s.rows == 0) return ffi::Error::Success();
  if (s.rows * kRanks > 0x7fffffff)
    return Bad("logits", "too many rows for one launch", "split logits");
  const Args a{logits.untyped_data(),
               s.vocab,
               static_cast<const float*>(temperature.untyped_data()),
               static_cast<const int32_t*>(top_k.untyped_data()),
               static_cast<const float*>(top_p.untyped_data()),
               static_cast<const float*>(min_p.untyped_data()),
               static_cast<const uint32_t*>(seeds.untyped_data()),
               static_cast<const uint32_t*>(offsets.untyped_data()),
               static_cast<int32_t*>(tokens->untyped_data())};
  switch (logits.element_type()) {
    case ffi::DataType::F32: Launch<float>(stream, s.rows, a); break;
    case ffi::DataType::BF16: Launch<__nv_bfloat16>(stream, s.rows, a); break;
    case ffi::DataType::F16: Launch<__half>(stream, s.rows, a); break;
    default: return Bad("logits", "unsupported dtype on cuda", "pass f32, bf16 or f16 logits");
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
