// e4m3 weights as the B operand of a 16-bit mma.sync, converted in registers; shared by
// fp8_linear's kernels and the skinny GEMM (gemm/skinny_*.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace xla_kernels::gemm {

// e4m3's NaN is S.1111.111. NanProbe(four) has bit 7 of a byte set exactly where that byte of
// four is a NaN (its low 7 bits all ones; the + 1 carries into bit 7 and never across a
// byte), among other bits: a hot loop ORs the probes of its words (two instructions a word)
// and tests kNanProbeBits once at the end.
constexpr uint32_t kNanProbeBits = 0x80808080u;
__device__ __forceinline__ uint32_t NanProbe(uint32_t four) {
  return (four & 0x7f7f7f7fu) + 0x01010101u;
}

// Bytes (b, c) of four, each sign-extended to 16 bits (prmt's sign-replicating selector).
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t SignExtendedBytes(uint32_t four) {
  uint32_t out;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(out) : "r"(four), "n"(kSelector));
  return out;
}

// Four e4m3 bytes as two B registers of a 16-bit MMA in T (bf16 or f16): bytes (0, 1) and
// (2, 3). Exact for every finite e4m3 value (each is a bf16 and an f16). A NaN byte: NaN in
// f16; in bf16 it comes out as +-480, which no finite e4m3 value is: callers that may see NaN
// weights take E4m3ToB16 below, or track NanProbe themselves.
template <typename T>
__device__ __forceinline__ void E4m3ToB16NanAs480(uint32_t four, uint32_t* b0, uint32_t* b1) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(four & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(four >> 16), __NV_E4M3);
    *b0 = *reinterpret_cast<const uint32_t*>(&lo);
    *b1 = *reinterpret_cast<const uint32_t*>(&hi);
  } else {
    // Each byte sign-extended to a 16-bit lane and shifted left by 4 puts S.EEEE.MMM at bits
    // 4-11 with copies of S above; the mask keeps S at bit 15 and EEEE.MMM at bits 4-10 (and
    // drops what the shift carried from the low lane into the high one): a bf16 whose value
    // is the e4m3 value times 2^-120, exact, scaled back by a bf16x2 multiply with 2^120.
    const __nv_bfloat162 k2p120 = __floats2bfloat162_rn(0x1p120f, 0x1p120f);
    uint32_t lo = (SignExtendedBytes<0x9180>(four) << 4) & 0x87f087f0u;
    uint32_t hi = (SignExtendedBytes<0xb3a2>(four) << 4) & 0x87f087f0u;
    __nv_bfloat162 l = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&lo), k2p120);
    __nv_bfloat162 h = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&hi), k2p120);
    *b0 = *reinterpret_cast<uint32_t*>(&l);
    *b1 = *reinterpret_cast<uint32_t*>(&h);
  }
}

// E4m3ToB16NanAs480, with NaN bytes as NaN in bf16 too (a rare branch: the NaN keeps its
// sign and takes bf16's all-ones exponent; 480 | 0x7fc0 is a NaN).
template <typename T>
__device__ __forceinline__ void E4m3ToB16(uint32_t four, uint32_t* b0, uint32_t* b1) {
  E4m3ToB16NanAs480<T>(four, b0, b1);
  if constexpr (!std::is_same_v<T, __half>) {
    const uint32_t nan_bytes = NanProbe(four) & kNanProbeBits;
    if (nan_bytes != 0u) {
      *b0 |= (__byte_perm(nan_bytes, 0u, 0x4140) >> 7) * 0x7fc0u;
      *b1 |= (__byte_perm(nan_bytes, 0u, 0x4342) >> 7) * 0x7fc0u;
    }
  }
}

}  // namespace xla_kernels::gemm
