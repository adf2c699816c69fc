// e4m3 weights as the B operand of a 16-bit mma.sync, converted in registers; shared by
// fp8_linear's kernels and the skinny GEMM (gemm/skinny_*.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace xla_kernels::gemm {

// Four e4m3 bytes as two B registers of a 16-bit MMA in T (bf16 or f16): bytes (0, 1) and
// (2, 3). Exact: every e4m3 value is a bf16 and an f16.
template <typename T>
__device__ __forceinline__ void E4m3ToB16(uint32_t four, uint32_t* b0, uint32_t* b1) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(four & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(four >> 16), __NV_E4M3);
    *b0 = *reinterpret_cast<const uint32_t*>(&lo);
    *b1 = *reinterpret_cast<const uint32_t*>(&hi);
  } else {  // bf16 fields hold the value times 2^-120; 2^120 in bf16 is exact
    const __nv_bfloat162 k2p120 = __floats2bfloat162_rn(0x1p120f, 0x1p120f);
    uint32_t lo = __byte_perm(four, 0u, 0x4140), hi = __byte_perm(four, 0u, 0x4342);
    lo = ((lo & 0x007f007fu) << 4) | ((lo & 0x00800080u) << 8);
    hi = ((hi & 0x007f007fu) << 4) | ((hi & 0x00800080u) << 8);
    __nv_bfloat162 l = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&lo), k2p120);
    __nv_bfloat162 h = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&hi), k2p120);
    *b0 = *reinterpret_cast<uint32_t*>(&l);
    *b1 = *reinterpret_cast<uint32_t*>(&h);
  }
}

}  // namespace xla_kernels::gemm
