// Hopper (sm_90) building blocks for warp-specialized kernels: shared-memory mbarriers
// (a producer fills a stage and a consumer frees it, without CTA-wide barriers), cp.async
// whose completion arrives on an mbarrier, named barriers for one warpgroup, and setmaxnreg
// (register budgets moved from producer to consumer warpgroups). Used by
// ragged_paged_attention's prefill kernel (ragged_paged_attention_sm90.cuh).
//
// Stage protocol (n stages, tile j in stage j % n, phase (j / n) & 1):
//   producer: wait_parity(empty[st], phase ^ 1) for j >= n; fill; arrive on full[st]
//   consumer: wait_parity(full[st], phase); read; arrive on empty[st]
// mbarrier waits have acquire and arrivals release semantics (CTA scope), so what a
// producer wrote with ordinary stores before its arrival is visible after the wait.
//
// Everything here is compiled only for sm_90 and newer (XK_HAS_ASYNC_PIPELINE); elsewhere
// the functions are empty, and kernels using them must not be launched there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define XK_HAS_ASYNC_PIPELINE 1
#else
#define XK_HAS_ASYNC_PIPELINE 0
#endif

namespace xla_kernels::cuda_async_pipeline {

// One thread initializes each barrier (expected arrivals per phase), before a CTA barrier.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
#if XK_HAS_ASYNC_PIPELINE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#else
  (void)bar, (void)count;
#endif
}

// One arrival (release: this thread's earlier shared-memory writes are visible to threads
// that wait for the phase it completes).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if XK_HAS_ASYNC_PIPELINE
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
      : "memory");
#else
  (void)bar;
#endif
}

// One arrival, made when every cp.async this thread issued before has landed (counts as
// one of the barrier's expected arrivals: .noinc).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint32_t bar) {
#if XK_HAS_ASYNC_PIPELINE
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#else
  (void)bar;
#endif
}

// Blocks until the phase with the given parity (0 or 1) has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
#if XK_HAS_ASYNC_PIPELINE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
#else
  (void)bar, (void)parity;
#endif
}

// 16-byte cp.async global -> shared (shared-window address); with valid false nothing is
// read (src-size 0) and the 16 bytes are zero-filled, so `gmem` only has to be a pointer
// into global memory.
__device__ __forceinline__ void cp_async16_zfill(uint32_t smem, const void* gmem, bool valid) {
#if XK_HAS_ASYNC_PIPELINE
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  (void)smem, (void)gmem, (void)valid;
#endif
}

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
#if XK_HAS_ASYNC_PIPELINE
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
  (void)id, (void)threads;
#endif
}

// Arrives at barrier `id` without waiting: the arriving threads count towards `threads`,
// whose other members wait there with named_barrier_sync (a producer/consumer hand-off
// between warp groups; `threads` as in the waiters' sync).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
#if XK_HAS_ASYNC_PIPELINE
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
  (void)id, (void)threads;
#endif
}

// The warpgroup's registers per thread become N (every warp of the warpgroup executes it):
// producers give registers back (dec) so that consumers can take them (inc). sm_90a only.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

}  // namespace xla_kernels::cuda_async_pipeline
