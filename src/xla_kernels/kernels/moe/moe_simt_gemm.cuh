// fused_moe's grouped GEMMs in f32 on NVIDIA GPUs: SimtGemmKernel, the CUDA-core GEMM the
// f32 calls run (moe_gemm.cuh has the tensor-core one). Kernel core without XLA types.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moe_gemm_config.cuh"

namespace xla_kernels::moe {

// f32 (for float32 checks on a GPU): CUDA cores. A CTA of kSimtThreads threads computes
// kSimtThreads output columns (one per thread) of a tile of at most kSimtRows rows, K in
// chunks of kSimtK: the chunk's weight rows (gate and up for GEMM1) and A rows are loaded
// into shared memory with coalesced reads, then each thread accumulates its column over the
// chunk in K order. The tiles come from the same sort, with tile_rows = kSimtRows.
constexpr int kSimtRows = 16;
constexpr int kSimtThreads = 128;
constexpr int kSimtK = 32;

template <bool kFp8, bool kGated>
__global__ void __launch_bounds__(kSimtThreads) SimtGemmKernel(const GemmParams p) {
  __shared__ float w_s[kGated ? 2 : 1][kSimtThreads][kSimtK + 1];  // +1: no bank conflicts
  __shared__ float a_s[kSimtRows][kSimtK];
  __shared__ const float* a_row[kSimtRows];
  const int tile = blockIdx.x;
  if (tile >= *p.tile_count) return;  // the whole CTA: before any barrier
  const int tid = threadIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kSimtThreads;
  const int64_t K = p.K, N = p.N;
  const int expert = p.tiles[2 * tile], row0 = p.tiles[2 * tile + 1];
  const int rows = min(kSimtRows, p.offsets[expert + 1] - row0);
  const int64_t w_rows = kGated ? 2 * N : N;
  if (tid < kSimtRows) {
    const int64_t src = kGated ? p.sorted_pairs[row0 + min(tid, rows - 1)] / p.top_k
                               : row0 + min(tid, rows - 1);
    a_row[tid] = tid < rows ? static_cast<const float*>(p.a) + src * K : nullptr;
  }
  const int64_t per_expert =
      !kFp8 ? 0 : p.scale_bk == 0 ? w_rows : CeilDiv(w_rows, p.scale_bn) * CeilDiv(K, p.scale_bk);
  // Weight (wr, k) of this expert, dequantized for fp8; 0 past the matrix.
  auto weight = [&](int64_t wr, int64_t k) -> float {
    if (wr >= w_rows || k >= K) return 0.f;
    const int64_t at = (static_cast<int64_t>(expert) * w_rows + wr) * K + k;
    if constexpr (kFp8) {
      const float* sc = p.scale + expert * per_expert;
      return E4m3ToF32(static_cast<const uint8_t*>(p.w)[at]) *
             sc[ScaleIndex(wr, k, K, p.scale_bn, p.scale_bk)];
    } else {
      return static_cast<const float*>(p.w)[at];
    }
  };
  float acc[kSimtRows] = {}, acc_up[kSimtRows] = {};
  __syncthreads();
  for (int64_t k0 = 0; k0 < K; k0 += kSimtK) {
    for (int idx = tid; idx < kSimtThreads * kSimtK; idx += kSimtThreads) {
      const int j = idx / kSimtK, kk = idx % kSimtK;
      const int64_t col = n0 + j;
      w_s[0][j][kk] = col < N ? weight(col, k0 + kk) : 0.f;
      if constexpr (kGated) w_s[kGated ? 1 : 0][j][kk] = col < N ? weight(N + col, k0 + kk) : 0.f;
    }
    for (int idx = tid; idx < kSimtRows * kSimtK; idx += kSimtThreads) {
      const int r = idx / kSimtK, kk = idx % kSimtK;
      a_s[r][kk] = a_row[r] != nullptr && k0 + kk < K ? a_row[r][k0 + kk] : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kSimtK; ++kk) {
      const float g = w_s[0][tid][kk];
      const float u = kGated ? w_s[kGated ? 1 : 0][tid][kk] : 0.f;
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        acc[r] += a_s[r][kk] * g;
        if constexpr (kGated) acc_up[r] += a_s[r][kk] * u;
      }
    }
    __syncthreads();
  }
  const int64_t col = n0 + tid;
  if (col >= N) return;
  float* out = static_cast<float*>(p.out);
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) {
    if (r >= rows) break;
    const int64_t row = row0 + r;
    out[row * N + col] = kGated ? Activate(p.activation, acc[r]) * acc_up[r]
                                : acc[r] * p.topk_weights[p.sorted_pairs[row]];
  }
}

}  // namespace xla_kernels::moe
