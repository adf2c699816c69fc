// fused_moe's grouped GEMMs on NVIDIA GPUs (sm_80+: mma.sync m16n8k16, bf16/f16 operands,
// f32 accumulation), kernel core without XLA types.
//
// A CTA computes one tile of rows (at most BM token pairs routed to one expert, from the
// sort's tile table) times BN output columns of that expert:
//   GEMM1 (kGated): A = the pairs' hidden rows (gathered by token), B = the expert's w13
//     rows n0.. (gate) and intermediate + n0.. (up), both in one shared tile, so every
//     thread holds a gate and the matching up accumulator: the epilogue writes
//     act(gate) * up, rounded to the dtype, as the row's activation [pairs, intermediate].
//   GEMM2: A = the activation rows (contiguous: rows are in sorted order), B = the expert's
//     w2 rows; the epilogue multiplies by the pair's routing weight and writes the row's
//     output [pairs, hidden] in the dtype (the combine kernel sums a token's rows).
// Tiles of BK = 64 along K go through a cp.async pipeline of kStages stages. Shared tiles of
// the dtype are stored with 16-byte chunks XOR-swizzled by row (chunk c of row r at
// c ^ (r % 8)) so that ldmatrix reads 8 rows of one column without bank conflicts.
//
// The parts, by role: moe_gemm_config.cuh (parameters, tile shapes, shared-memory layout;
// the tuning table is moe_tuning.h), moe_gemm_scheduler.cuh (a CTA's tile),
// moe_gemm_mainloop.cuh (the loads into the pipeline's stages, fp8 dequantization, the
// K loop), moe_gemm_mma.cuh (the warps' MMAs and the K groups' reduction),
// moe_gemm_epilogue.cuh (the stores); this file: the kernel, which finds its tile and runs the
// roles in order.
#pragma once

#include "moe_gemm_epilogue.cuh"
#include "moe_gemm_mainloop.cuh"

namespace xla_kernels::moe {

template <typename T, bool kFp8, bool kGated, int BM, int BN, int kStages>
__global__ void __launch_bounds__(GemmConfig<T, kFp8, kGated, BM, BN, kStages>::kThreads)
    GroupedGemmKernel(const GemmParams p) {
  using C = GemmConfig<T, kFp8, kGated, BM, BN, kStages>;
  static_assert(C::kReduceBytes <= kStages * C::kStageBytes, "the reduction fits the pipeline");
  extern __shared__ __align__(128) unsigned char smem[];
  GemmTile t;
  if (!ScheduleTile<BM, BN>(p, &t)) return;  // the whole CTA: before any barrier
  const int64_t K = p.K, N = p.N;
  const int tid = threadIdx.x;
  const GemmWarp w = WarpOf<C>(tid);
  GemmAccumulators<C, kGated> acc =
      GemmMainloop<T, kFp8, kGated, BM, BN, kStages>(p, t, K, N, w, tid);
  if (!ReduceKGroups(acc, smem, w)) return;
  GemmEpilogue<T>(p, t, acc, w, N);
}

}  // namespace xla_kernels::moe
