// Tensor-core and async-copy building blocks for sm_80+ kernels (bf16/f16 mma.sync
// m16n8k16 with f32 accumulation, ldmatrix, cp.async), shared by the attention kernels.
//
//   using namespace xla_kernels::cuda_mma;
//   cp_async16(smem, gmem); cp_async_commit(); cp_async_wait<0>();
//   mma16816<__nv_bfloat16>(acc, a_frag, b0, b1);
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace xla_kernels::cuda_mma {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// cp_async16 with an L2 prefetch-size hint: a miss in L2 fetches the whole aligned
// kL2Bytes (64, 128 or 256) from DRAM, not only the requested sectors; 0: no hint
// (cp_async16). CUTLASS's and FlashInfer's cp.async loads say 128.
template <int kL2Bytes>
__device__ __forceinline__ void cp_async16_l2(void* smem, const void* gmem) {
  static_assert(kL2Bytes == 0 || kL2Bytes == 64 || kL2Bytes == 128 || kL2Bytes == 256,
                "L2 prefetch size: 0, 64, 128 or 256 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kL2Bytes == 64) {
    asm volatile("cp.async.cg.shared.global.L2::64B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem)
                 : "memory");
  } else if constexpr (kL2Bytes == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem)
                 : "memory");
  } else if constexpr (kL2Bytes == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem)
                 : "memory");
  } else {
    cp_async16(smem, gmem);
  }
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The transpose of an 8x8 matrix of 16-bit values held in the m8n8 fragment layout (lane
// l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1, low half first), e.g. two packed m16n8
// accumulators turned into an MMA's B operand (sm_75+).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// D += A (16x16, row) * B (16x8, col), f32 accumulate.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// The A operand of an m16n8k16 MMA (16 rows x 16 k) from two m16n8 f32 accumulator tiles
// covering k 0-7 (lo) and 8-15 (hi): e.g. P = softmax(S) feeding O += P V.
template <typename T>
__device__ __forceinline__ void accumulators_to_a(const float (&lo)[4], const float (&hi)[4],
                                                  uint32_t (&a)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// Base used for exp2 so that -inf statistics never produce NaN.
__device__ __forceinline__ float safe_max(float m) { return m == -INFINITY ? 0.f : m; }

}  // namespace xla_kernels::cuda_mma
