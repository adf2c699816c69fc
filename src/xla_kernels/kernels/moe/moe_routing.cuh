// fused_moe on NVIDIA GPUs, the steps around the GEMMs (kernel core, no XLA types):
//   RouteKernel: one warp per token: softmax over the experts in f32, the top_k largest
//     (equal ones: lower expert first), renormalized if asked.
//   SortKernel: one CTA: a counting sort of the (token, expert) pairs by expert: each
//     expert's rows are contiguous (`offsets`), `sorted_pairs[row]` is the pair of a row,
//     `row_of_pair[pair]` its row; and the GEMMs' tile table: (expert, first row) of each
//     tile of at most `tile_rows` rows of one expert, with their count. The order of the rows
//     within an expert is whatever the atomics give: every row is computed on its own and
//     each token sums its experts in its own order, so the result does not depend on it.
//     Expert parallel: with `expert_offset` (device int32, or null for 0) local expert e is
//     global expert *expert_offset + e; a pair routed to a global expert outside the local
//     block gets no row (row_of_pair -1).
//   CombineKernel: out[t] = sum over j of y[row_of_pair[t * top_k + j]] in f32 (pairs without
//     a row add nothing), rounded once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_limits.h"

namespace xla_kernels::moe {

__device__ __forceinline__ float ToF32(float x) { return x; }
__device__ __forceinline__ float ToF32(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromF32(float x);
template <>
__device__ __forceinline__ float FromF32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromF32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr int kRouteWarps = 8;

// Probabilities live in shared memory (kRouteWarps rows of `experts` floats). A taken expert
// is marked -2 and a NaN probability counts as -1, so the search always finds an untaken
// expert (top_k <= experts) and every id is in range whatever the logits hold.
template <typename L>
__global__ void RouteKernel(const L* __restrict__ logits, int tokens, int experts, int top_k,
                            bool renormalize, int32_t* __restrict__ ids,
                            float* __restrict__ weights) {
  extern __shared__ float probs[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= tokens) return;  // no CTA-wide barrier below
  float* p = probs + warp * experts;
  const L* row = logits + static_cast<int64_t>(t) * experts;
  float m = -INFINITY;
  for (int e = lane; e < experts; e += 32) {
    p[e] = ToF32(row[e]);
    m = fmaxf(m, p[e]);
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float sum = 0.f;
  for (int e = lane; e < experts; e += 32) sum += (p[e] = expf(p[e] - m));
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  for (int e = lane; e < experts; e += 32) p[e] = p[e] / sum;
  float chosen = 0.f;
  for (int j = 0; j < top_k; ++j) {
    float best = -3.f;
    int best_e = experts;
    for (int e = lane; e < experts; e += 32) {
      const float key = isnan(p[e]) ? -1.f : p[e];
      if (key > best) best = key, best_e = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    const bool owner = lane == best_e % 32;
    const float w = __shfl_sync(0xffffffffu, owner ? p[best_e] : 0.f, best_e % 32);
    __syncwarp();
    if (owner) p[best_e] = -2.f;
    __syncwarp();
    chosen += w;
    if (lane == 0) {
      ids[static_cast<int64_t>(t) * top_k + j] = best_e;
      weights[static_cast<int64_t>(t) * top_k + j] = w;
    }
  }
  if (renormalize && lane == 0)
    for (int j = 0; j < top_k; ++j) weights[static_cast<int64_t>(t) * top_k + j] /= chosen;
}

constexpr int kSortThreads = static_cast<int>(kMaxExperts);
static_assert(kSortThreads % 32 == 0 && kSortThreads <= 1024, "one thread per expert");

// Exclusive prefix sum over the CTA (thread i gets the sum of the values of threads < i);
// `total` gets the sum of all. Every thread must call it.
__device__ inline int BlockExclusiveScan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // scratch may still be read by a previous scan
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kSortThreads / 32 ? scratch[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    scratch[lane] = w;  // inclusive sums of the warps
  }
  __syncthreads();
  *total = scratch[kSortThreads / 32 - 1];
  return x - v + (warp > 0 ? scratch[warp - 1] : 0);
}

__global__ void __launch_bounds__(kSortThreads)
    SortKernel(const int32_t* __restrict__ ids, int pairs, int experts, int tile_rows,
               int32_t* __restrict__ sorted_pairs, int32_t* __restrict__ row_of_pair,
               int32_t* __restrict__ offsets, int32_t* __restrict__ tiles,
               int32_t* __restrict__ tile_count, const int32_t* __restrict__ expert_offset) {
  __shared__ int count[kSortThreads];
  __shared__ int cursor[kSortThreads];
  __shared__ int scratch[32];
  const int tid = threadIdx.x;
  const int64_t first_expert = expert_offset != nullptr ? *expert_offset : 0;
  // The local expert of pair p, or -1 where it routes outside the local block.
  auto local = [&](int p) {
    const int64_t e = static_cast<int64_t>(ids[p]) - first_expert;
    return e >= 0 && e < experts ? static_cast<int>(e) : -1;
  };
  count[tid] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += kSortThreads) {
    const int e = local(p);
    if (e >= 0) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int c = tid < experts ? count[tid] : 0;
  const int n_tiles = (c + tile_rows - 1) / tile_rows;
  int rows_total, tiles_total;
  const int first_row = BlockExclusiveScan(c, scratch, &rows_total);
  const int first_tile = BlockExclusiveScan(n_tiles, scratch, &tiles_total);
  if (tid < experts) {
    offsets[tid] = first_row;
    cursor[tid] = first_row;
    for (int i = 0; i < n_tiles; ++i) {
      tiles[2 * (first_tile + i)] = tid;
      tiles[2 * (first_tile + i) + 1] = first_row + i * tile_rows;
    }
  }
  if (tid == 0) {
    offsets[experts] = rows_total;
    *tile_count = tiles_total;
  }
  __syncthreads();
  for (int p = tid; p < pairs; p += kSortThreads) {
    const int e = local(p);
    if (e < 0) {
      row_of_pair[p] = -1;
      continue;
    }
    const int row = atomicAdd(&cursor[e], 1);
    sorted_pairs[row] = p;
    row_of_pair[p] = row;
  }
}

constexpr int kCombineThreads = 256;

template <typename T>
__global__ void CombineKernel(const T* __restrict__ y, const int32_t* __restrict__ row_of_pair,
                              int top_k, int64_t hidden, T* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y * static_cast<int64_t>(kCombineThreads) + threadIdx.x;
  if (h >= hidden) return;
  float acc = 0.f;
  for (int j = 0; j < top_k; ++j) {
    const int32_t row = row_of_pair[t * top_k + j];
    if (row >= 0) acc += ToF32(y[static_cast<int64_t>(row) * hidden + h]);
  }
  out[t * hidden + h] = FromF32<T>(acc);
}

}  // namespace xla_kernels::moe
