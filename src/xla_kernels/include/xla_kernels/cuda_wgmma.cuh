// Hopper (sm_90a) warpgroup MMA building blocks: wgmma.mma_async with f32 accumulation,
// shared-memory matrix descriptors for 128-byte-swizzled tiles, and the fences wgmma needs.
// Used by ragged_paged_attention's prefill kernel (ragged_paged_attention_sm90.cuh) and
// checked on its own by tests/gpu/wgmma_unit_check.cu.
//
// Everything that emits wgmma is compiled only where __CUDA_ARCH_FEAT_SM90_ALL is defined
// (nvcc -arch=sm_90a; see Kernel(arch_specific=True)); elsewhere (sm_80, plain sm_90) the
// functions trap, so kernels that use them must not be launched there (XK_HAS_WGMMA tells).
//
// Shared-memory layout ("SW128 panels"): a matrix of R rows x C 16-bit columns (C a multiple
// of 64) is stored as C / 64 panels, one after another, each R rows of 128 bytes; row r of a
// panel starts at r * 128 and its 16-byte chunk c (columns 8c..8c+7 of the panel) sits at
// chunk c ^ (r % 8) (sw128_offset). Panels must start 1024-byte aligned. Then:
//   * as a K-major operand (rows = M or N, columns = K; Q and K of attention), the k-step
//     kk (16 columns) of the rows starting at row r0 (a multiple of 8) has the descriptor
//     sw128_desc(panel kk / 4 + r0 * 128 + (kk % 4) * 32, lbo = 16 (unused), sbo = 1024);
//   * as an MN-major operand (rows = K, columns = N; V of attention), the k-step of rows
//     k0 .. k0 + 15 has sw128_desc(base + k0 * 128, lbo = R * 128 (the next panel: N
//     columns 64..127), sbo = 1024 (the next 8 rows of K)) and the transpose bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define XK_HAS_WGMMA 1
#else
#define XK_HAS_WGMMA 0
#endif

namespace xla_kernels::cuda_wgmma {

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in an SW128 panel.
__host__ __device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// A wgmma shared-memory descriptor with 128-byte swizzle; addresses and offsets in bytes
// (shared window). Bits: 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 49-51 base offset
// (0: panels are 1024-byte aligned), 62-63 swizzle mode (1 = 128 bytes).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Orders this thread's earlier generic-proxy shared-memory writes (st.shared, cp.async
// once waited for) before later async-proxy reads (wgmma operands). Follow with a barrier.
__device__ __forceinline__ void fence_proxy_async() {
#if XK_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Before a warpgroup's first wgmma, and whenever accumulator or A registers were written
// by other instructions since the last one.
__device__ __forceinline__ void wgmma_fence() {
#if XK_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if XK_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if XK_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Pins accumulator registers around asynchronous wgmma (no code): keeps the compiler from
// moving their reads or writes across the issue / wait points.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Accumulator layout of m64nN (f32, N / 2 registers per thread): warp w of the warpgroup
// holds rows 16w .. 16w + 15; register 4i + e is row 16w + lane / 4 + 8 * (e / 2), column
// 8i + 2 * (lane % 4) + (e % 2) -- N / 8 copies of mma.sync m16n8's accumulator layout.
// The register A operand (4 x 32 bits) is mma.sync m16n8k16's A fragment of the warp's 16
// rows, so cuda_mma::accumulators_to_a turns S columns 16j .. 16j + 15 into the A of k-step j.

// Operand lists of 64 f32 accumulators (m64n128): the asm register list and the matching
// constraints, "+f" (accumulate) or "=f" (output only).
#define WGMMA_D64_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WGMMA_R4(c, d, b) c(d[b]), c(d[b + 1]), c(d[b + 2]), c(d[b + 3])
#define WGMMA_R16(c, d, b) \
  WGMMA_R4(c, d, b), WGMMA_R4(c, d, b + 4), WGMMA_R4(c, d, b + 8), WGMMA_R4(c, d, b + 12)
#define WGMMA_R64(c, d) \
  WGMMA_R16(c, d, 0), WGMMA_R16(c, d, 16), WGMMA_R16(c, d, 32), WGMMA_R16(c, d, 48)
#define WGMMA_INOUT(x) "+f"(x)
#define WGMMA_OUT(x) "=f"(x)
// Operand list of 32 f32 accumulators (m64n64).
#define WGMMA_D32_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WGMMA_R32(c, d) WGMMA_R16(c, d, 0), WGMMA_R16(c, d, 16)
// Emits OP("bf16") or OP("f16") for the input type T (the wrappers with a run-time
// scale_d, whose D registers are always inputs and outputs).
#define WGMMA_TYPED_BODY(OP)                     \
  if constexpr (std::is_same_v<T, __nv_bfloat16>) { \
    OP("bf16");                                     \
  } else {                                          \
    OP("f16");                                      \
  }

// The scaled wrappers' instructions: D = D * (scale_d != 0) + A B, scale_d a run-time
// predicate. SS: A and B from shared memory, both K-major. RS: A from registers, B
// MN-major (the transpose bit of B set). TY the input type's PTX name.
#define WGMMA_SS_N64_SCALED(TY)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " WGMMA_D32_REGS \
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                             \
               : WGMMA_R32(WGMMA_INOUT, d)                                             \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define WGMMA_RS_N64_SCALED(TY)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " WGMMA_D32_REGS \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                               \
               : WGMMA_R32(WGMMA_INOUT, d)                                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
#define WGMMA_RS_N128_SCALED(TY)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " WGMMA_D64_REGS \
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                \
               : WGMMA_R64(WGMMA_INOUT, d)                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

// D (64 x 64, f32) = D * (scale_d != 0) + A (64 x 16, shared, K-major) * B (16 x 64,
// shared, K-major: stored as 64 rows of K).
template <typename T>
__device__ __forceinline__ void mma_ss_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                               int scale_d) {
#if XK_HAS_WGMMA
  WGMMA_TYPED_BODY(WGMMA_SS_N64_SCALED)
#else
  (void)d; (void)desc_a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

// m64n64k16, register A, K-major B; SCALE_D "0" (D = A B, D output only) or "1" (D += A B);
// TY the input type's PTX name.
#define WGMMA_RS_N64_KMAJOR(TY, SCALE_D, CONSTRAINT)                                    \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " WGMMA_D32_REGS \
               ", {%32, %33, %34, %35}, %36, " SCALE_D ", 1, 1, 0;\n"                      \
               : WGMMA_R32(CONSTRAINT, d)                                               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
// The body of a K-major wrapper (template parameters T and kInit): OP(TY, SCALE_D,
// CONSTRAINT) for bf16 or f16, with kInit D = A B (D's registers outputs only: instructions
// that wrote them before, while another wgmma is in flight, do not make ptxas serialize the
// warpgroup's wgmmas, its warning C7513), else D += A B.
#define WGMMA_KMAJOR_BODY(OP)                          \
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {       \
    if constexpr (kInit) {                                \
      OP("bf16", "0", WGMMA_OUT);                      \
    } else {                                              \
      OP("bf16", "1", WGMMA_INOUT);                    \
    }                                                     \
  } else {                                                \
    if constexpr (kInit) {                                \
      OP("f16", "0", WGMMA_OUT);                       \
    } else {                                              \
      OP("f16", "1", WGMMA_INOUT);                     \
    }                                                     \
  }

// D (64 x 64, f32) = A (64 x 16, registers: the m16n8k16 A fragment of each warp's 16 rows)
// * B (16 x 64, shared, K-major: stored as 64 rows of K), plus D unless kInit (D's registers
// then outputs only: see WGMMA_KMAJOR_BODY). S = Q K^T with Q held in registers.
template <typename T, bool kInit>
__device__ __forceinline__ void mma_rs_m64n64k16_kmajor(float (&d)[32], const uint32_t (&a)[4],
                                                       uint64_t desc_b) {
#if XK_HAS_WGMMA
  WGMMA_KMAJOR_BODY(WGMMA_RS_N64_KMAJOR)
#else
  (void)d; (void)a; (void)desc_b;
  __trap();
#endif
}

// D (64 x 64, f32) = D * (scale_d != 0) + A (64 x 16, registers: the m16n8k16 A fragment of
// each warp's 16 rows) * B (16 x 64, shared, MN-major: stored as 16 rows of 64).
template <typename T>
__device__ __forceinline__ void mma_rs_m64n64k16(float (&d)[32], const uint32_t (&a)[4],
                                                uint64_t desc_b, int scale_d) {
#if XK_HAS_WGMMA
  WGMMA_TYPED_BODY(WGMMA_RS_N64_SCALED)
#else
  (void)d; (void)a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

// D (64 x 128, f32) = D * (scale_d != 0) + A (64 x 16, registers: the m16n8k16 A fragment of
// each warp's 16 rows) * B (16 x 128, shared, MN-major: stored as 16 rows of 128).
template <typename T>
__device__ __forceinline__ void mma_rs_m64n128k16(float (&d)[64], const uint32_t (&a)[4],
                                                uint64_t desc_b, int scale_d) {
#if XK_HAS_WGMMA
  WGMMA_TYPED_BODY(WGMMA_RS_N128_SCALED)
#else
  (void)d; (void)a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

// m64n128k16, register A, K-major B (no transpose); SCALE_D "0" (D = A B, D output only) or
// "1" (D += A B); TY the input type's PTX name.
#define WGMMA_RS_N128_KMAJOR(TY, SCALE_D, CONSTRAINT)                                   \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " WGMMA_D64_REGS \
               ", {%64, %65, %66, %67}, %68, " SCALE_D ", 1, 1, 0;\n"                      \
               : WGMMA_R64(CONSTRAINT, d)                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

// D (64 x 128, f32) = A (64 x 16, registers: the m16n8k16 A fragment of each warp's 16
// rows) * B (16 x 128, shared, K-major: stored as 128 rows of K), plus D unless kInit (then
// D's registers are outputs only, as in mma_rs_m64n64k16_kmajor). S = Q K^T for 128-token
// K tiles.
template <typename T, bool kInit>
__device__ __forceinline__ void mma_rs_m64n128k16_kmajor(float (&d)[64], const uint32_t (&a)[4],
                                                        uint64_t desc_b) {
#if XK_HAS_WGMMA
  WGMMA_KMAJOR_BODY(WGMMA_RS_N128_KMAJOR)
#else
  (void)d; (void)a; (void)desc_b;
  __trap();
#endif
}

// m64n128k16, A and B from shared memory, both K-major; SCALE_D as above.
#define WGMMA_SS_N128_KMAJOR(TY, SCALE_D, CONSTRAINT)                                   \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " WGMMA_D64_REGS \
               ", %64, %65, " SCALE_D ", 1, 1, 0, 0;\n"                                     \
               : WGMMA_R64(CONSTRAINT, d)                                                \
               : "l"(desc_a), "l"(desc_b))

// D (64 x 128, f32) = A (64 x 16, shared, K-major) * B (16 x 128, shared, K-major: stored as
// 128 rows of K), plus D unless kInit. S = Q K^T with Q in shared memory, where registers do
// not allow Q in registers (head_dim 128 with 128-token tiles).
template <typename T, bool kInit>
__device__ __forceinline__ void mma_ss_m64n128k16_kmajor(float (&d)[64], uint64_t desc_a,
                                                        uint64_t desc_b) {
#if XK_HAS_WGMMA
  WGMMA_KMAJOR_BODY(WGMMA_SS_N128_KMAJOR)
#else
  (void)d; (void)desc_a; (void)desc_b;
  __trap();
#endif
}

// m64n64k16, A and B from shared memory, both K-major; SCALE_D as above.
#define WGMMA_SS_N64_KMAJOR(TY, SCALE_D, CONSTRAINT)                                   \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " WGMMA_D32_REGS \
               ", %32, %33, " SCALE_D ", 1, 1, 0, 0;\n"                                    \
               : WGMMA_R32(CONSTRAINT, d)                                               \
               : "l"(desc_a), "l"(desc_b))

// D (64 x 64, f32) = A (64 x 16, shared, K-major) * B (16 x 64, shared, K-major: stored as
// 64 rows of K), plus D unless kInit (D's registers then outputs only). S = Q K^T with Q in
// shared memory at head_dim 256.
template <typename T, bool kInit>
__device__ __forceinline__ void mma_ss_m64n64k16_kmajor(float (&d)[32], uint64_t desc_a,
                                                       uint64_t desc_b) {
#if XK_HAS_WGMMA
  WGMMA_KMAJOR_BODY(WGMMA_SS_N64_KMAJOR)
#else
  (void)d; (void)desc_a; (void)desc_b;
  __trap();
#endif
}

}  // namespace xla_kernels::cuda_wgmma

// The operand-list and instruction macros above write the wrappers' inline assembly (a
// list of 32 or 64 accumulator registers cannot be written otherwise); they end here.
#undef WGMMA_D32_REGS
#undef WGMMA_D64_REGS
#undef WGMMA_INOUT
#undef WGMMA_KMAJOR_BODY
#undef WGMMA_OUT
#undef WGMMA_R16
#undef WGMMA_R32
#undef WGMMA_R4
#undef WGMMA_R64
#undef WGMMA_RS_N128_KMAJOR
#undef WGMMA_RS_N128_SCALED
#undef WGMMA_RS_N64_KMAJOR
#undef WGMMA_RS_N64_SCALED
#undef WGMMA_SS_N128_KMAJOR
#undef WGMMA_SS_N64_KMAJOR
#undef WGMMA_SS_N64_SCALED
#undef WGMMA_TYPED_BODY
