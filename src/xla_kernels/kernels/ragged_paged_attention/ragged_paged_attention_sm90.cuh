// Ragged paged attention, Hopper prefill kernel: wgmma (sm_90a) for bf16/f16 with head_dim
// 64, 128 or 256. Same semantics as the kernels of ragged_paged_attention.cuh (its header
// comment), and the same helpers (ragged_common.cuh: Args, Work, find_work, token_range,
// row_range, logit...).
//
// Design (FlashAttention-3's warp specialization, intra-warpgroup overlap and ping-pong
// between the consumers; no TMA, whose boxes cannot follow a block table):
//  * CTA = 3 warpgroups (384 threads) on 128 packed rows of one (sequence, kv head): a
//    producer warpgroup that only copies K/V tiles, and two consumer warpgroups with 64 rows
//    each (one wgmma M). setmaxnreg moves registers from the producer to the consumers
//    (tuning::wgmma_consumer_regs). Grid and work search as the mma.sync kernel
//    (find_work with 128-row tiles), but a sequence's CTAs take its row tiles last first:
//    the longest causal ranges start first and the grid's tail is short ones.
//  * K/V: N-token tiles (tuning::wgmma_tile_tokens), gathered through the block
//    table with 16-byte cp.async by the producer (8 threads per token: whole 128-byte
//    lines per warp instruction; each token's offset computed by one lane and shuffled)
//    into 128-byte-swizzled shared memory (cuda_wgmma.cuh's SW128 panels), in as
//    many stages as fit. Tokens outside the CTA's range or with an invalid block id are
//    zero-filled by the same cp.async (src-size 0: nothing read); the consumers mask them
//    from the block table themselves (a few entries per tile, read a tile ahead), so a
//    stage holds K and V only and the consumers read it through wgmma alone.
//  * Stage hand-off with mbarriers (cuda_async_pipeline.cuh), no CTA barrier after the
//    start: "full" completes when the producer's copies of the stage have landed (one
//    cp.async arrival per producer thread), "empty" when the 8 consumer warps have finished
//    with it (after the P V that reads its V). Where only two stages fit (head_dim 256), K
//    and V of a stage have barriers of their own (FA3's two pipelines): K is freed after
//    S = Q K^T and refilled while the P V of the tile before still reads V; with one pair
//    the producer could not run ahead of the consumers (Nsight Compute).
//  * Q: each consumer thread loads its own A fragments of Q (its warp's 16 rows) from
//    global memory into registers once; at head_dim 256, and 128 with 128-token tiles, where
//    the registers do not suffice, each consumer warpgroup stages its rows in shared memory
//    (and there, at the end, its O for 16-byte row stores).
//  * A consumer warpgroup runs over the contiguous tiles its rows attend, [jlo, jhi):
//    prologue S_jlo and its softmax; then per tile j: issue S_j = Q K_j^T (register-A wgmma,
//    K-major K), issue O = alpha_{j-1} O + P_{j-1} V_{j-1} (register-A P, MN-major V:
//    transpose bit), wait for S_j only, run the online softmax of S_j (base 2, f32
//    statistics, a row's statistics reduced over the 4 lanes of a quad) while the tensor
//    cores work on P_{j-1} V_{j-1}, wait for it, free stage j - 1, pack P_j; epilogue
//    P_{jhi-1} V_{jhi-1}. Tiles outside [jlo, jhi) are only waited for and freed.
//  * Ping-pong (Sm90Config::kPingPong): the consumers take turns, one per tile of the CTA,
//    to issue S_j and the pending P V, so one's softmax runs under the other's wgmmas.
//  * The per-element mask (causal, window, valid token, rows past the tile) runs only on
//    tiles that need it: a warpgroup's tile is "full" when every token is valid and every
//    one of its 64 rows attends every token of the tile. Full tiles without softcap take
//    exp2(s * scale - max) as one FFMA + ex2.approx.ftz per element.
//  * fp8 caches (f8e4m3fn, bf16/f16 queries): the producer copies the raw e4m3 tiles into a
//    ring of its own (cp.async, up to 3 K/V units ahead) and converts them into the same
//    stages (K to the query dtype, V to f16); the consumers run P V in f16, fold k_scale
//    into the logit scale and v_scale into the final 1/l (produce_kv_fp8).
// Dispatch (launch_ragged_paged_attention): bf16/f16 (head_dim 64/128/256), a device of
// compute capability 9.0, the library built for sm_90a (the kernel then has static shared
// memory; the sm_80 / plain sm_90 builds compile it to an empty body without any), and the
// environment variable XLA_KERNELS_RAGGED_WGMMA not "0" (xla_kernels/env.py). Decode-only
// batches keep the decode path.
//
// The parts, by role: sm90_config.cuh (shape, barriers, shared-memory helpers; the tuning
// table is ragged_paged_attention_tuning.h), sm90_producer.cuh (the K/V copies through the
// paged cache view), sm90_consumer.cuh (Q, S = Q K^T, P V, turns), sm90_softmax.cuh,
// sm90_epilogue.cuh (O normalized and stored); this file: the kernel, which sets up the
// CTA and hands each warpgroup its role.
#pragma once

#include "sm90_consumer.cuh"
#include "sm90_producer.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

template <typename T, int D, int N, bool kFp8 = false>
__global__ void __launch_bounds__(kSm90Threads, 1) ragged_wgmma_kernel(const Args a) {
#if XK_HAS_WGMMA
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  using C = Sm90Config<D, N, kFp8>;
  constexpr int S = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  // Static shared memory exists only in this (sm_90a) body: the host reads it as "built
  // with wgmma" (wgmma_kernel_usable).
  __shared__ Work work;
  constexpr int SV = C::kSplitKV ? S : 0;  // stages with V barriers of their own
  __shared__ __align__(8) uint64_t full_bar[S + SV], empty_bar[S + SV];  // K's (stage's), V's
  static_assert(16 * (S + SV) + sizeof(Work) <= C::kStaticReserve, "static shared memory");
  unsigned char* qs = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  const uint32_t kv_s = wg::smem_u32(qs + C::kQBytes);
  const uint32_t full = wg::smem_u32(full_bar), empty = wg::smem_u32(empty_bar);
  const StageBarriers bars{full, empty, full + 8 * S, empty + 8 * S};

  const int tid = threadIdx.x, lane = tid & 31;
  const int wgi = __shfl_sync(kFull, tid >> 7, 0);  // warp-uniform warpgroup index
  const int kvh = blockIdx.y;
  if (tid == 0) {
    for (int st = 0; st < S + SV; ++st) {
      ap::mbarrier_init(full + 8 * st, 128);                 // one per producer thread
      ap::mbarrier_init(empty + 8 * st, 4 * kSm90Consumers);  // one per consumer warp
    }
  }
  if (tid < 32) find_work(a, blockIdx.x, kSm90Rows, &work, lane);
  __syncthreads();
  Work w = work;
  if (w.s < 0) return;  // uniform over the CTA
  // A sequence's row tiles last first: the longest causal ranges start first, the grid's
  // tail is short ones.
  w.tile = row_tiles(a, w.q_len, kSm90Rows) - 1 - w.tile;

  const TileRows tr = tile_rows(a, w, kSm90Rows);
  int lo, hi;
  token_range(a, tr, tr.r0, tr.r_end, &lo, &hi);
  const int ntiles = hi > lo ? (hi - lo + N - 1) / N : 0;

  if (wgi == 0) {
    ap::setmaxnreg_dec<C::kProducerRegs>();
    if constexpr (kFp8) {
      produce_kv_fp8<T, D, N>(a, w, kvh, lo, hi, ntiles, kv_s,
                              kv_s + S * C::kStageBytes, bars, tid);
    } else {
      produce_kv<T, D, N>(a, w, kvh, lo, hi, ntiles, kv_s, bars, tid);
    }
    return;
  }
  ap::setmaxnreg_inc<C::kConsumerRegs>();
  sm90_consume<T, D, N, kFp8>(a, w, tr, kvh, lo, ntiles, wg::smem_u32(qs), kv_s, bars, tid,
                              wgi);
#else
  (void)a;  // not built for sm_90a: never launched (wgmma_kernel_usable is false)
#endif
}

}  // namespace xla_kernels::ragged_paged_attention::detail
