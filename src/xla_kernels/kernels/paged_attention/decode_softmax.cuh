// paged_attention, the online softmax of the tensor-core cores (base 2, f32 statistics).
#pragma once

#include "decode_common.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

// The online-softmax step after scale / softcap / mask, shared by the tensor-core cores. A
// lane's m16n8 accumulator values x[i][e] belong to two statistics (m, l)[0] and [1]: by
// row (e / 2: rows g0 and g0 + 8, the q heads of MmaCore and Fp8MmaCore) or, with kCols, by
// column (e % 2: columns 2tig and 2tig + 1, the q heads of Fp8MmaCoreT). mx0 and mx1 are the
// lane's maxima of each; they are reduced over the lanes that share the statistic (the
// quad's 4 lanes, or a column's 8). x becomes exp2(x - m), (m, l) are updated and the O
// accumulators o, whose values follow the same mapping, are rescaled when a reference moves.
template <bool kCols, int N, int DT>
__device__ __forceinline__ void online_softmax_update(float (&x)[N][4], float mx0, float mx1,
                                                      float (&m)[2], float (&l)[2],
                                                      float (&o)[DT][4]) {
  auto stat = [](int e) { return kCols ? e & 1 : e >> 1; };
  if constexpr (kCols) {
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, off));
    }
  } else {
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
  }
  const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
  const float b0 = safe_max(mn0), b1 = safe_max(mn1);
  const float al0 = exp2f(m[0] - b0), al1 = exp2f(m[1] - b1);
  m[0] = mn0;
  m[1] = mn1;
  // The two values of statistic 0 in each x[i] (those of 1 follow them): (0, 1) by row, (0, 2)
  // by column.
  constexpr int kPair = kCols ? 2 : 1;
  float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[i][e] = exp2f(x[i][e] - (stat(e) ? b1 : b0));
    rs0 += x[i][0] + x[i][kPair];
    rs1 += x[i][3 - kPair] + x[i][3];
  }
  l[0] = l[0] * al0 + rs0;
  l[1] = l[1] * al1 + rs1;
  if (__any_sync(kFull, al0 != 1.f || al1 != 1.f)) {
#pragma unroll
    for (int i = 0; i < DT; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] *= stat(e) ? al1 : al0;
    }
  }
}

// S (NT n-tiles of 8 tokens, m16n8 accumulator layout: rows g0 = lane/4 and g0 + 8) ->
// scale / softcap / mask, then the online softmax: S becomes P, (m, l) are updated and the
// O accumulators (DT n-tiles) rescaled. Shared by the bf16/f16 and the fp8 core.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax(float (&sc)[NT][4], uint32_t mask, float (&m)[2],
                                               float (&l)[2], float (&o)[DT][4], int tig,
                                               const KernelArgs& a) {
  logits<NT * 4>(&sc[0][0], a);
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int t = i * 8 + tig * 2;
    const bool v0 = (mask >> t) & 1u, v1 = (mask >> (t + 1)) & 1u;
    if (!v0) sc[i][0] = sc[i][2] = -INFINITY;
    if (!v1) sc[i][1] = sc[i][3] = -INFINITY;
    mx0 = fmaxf(mx0, fmaxf(sc[i][0], sc[i][1]));
    mx1 = fmaxf(mx1, fmaxf(sc[i][2], sc[i][3]));
  }
  online_softmax_update<false>(sc, mx0, mx1, m, l, o);
}

// An MMA warp's (m, l) of its accumulator rows g0 = lane / 4 and g1 = g0 + 8 (rows < nh)
// -> ml: l summed over the row's quad first.
__device__ __forceinline__ void store_row_stats(const float (&m)[2], const float (&l)[2],
                                                float* ml, int nh, int lane) {
  float l0 = l[0], l1 = l[1];
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  const int g0 = lane >> 2, g1 = g0 + 8;
  if ((lane & 3) == 0) {
    if (g0 < nh) {
      ml[g0 * 2] = m[0];
      ml[g0 * 2 + 1] = l0;
    }
    if (g1 < nh) {
      ml[g1 * 2] = m[1];
      ml[g1 * 2 + 1] = l1;
    }
  }
}

}  // namespace detail
}  // namespace xla_kernels::paged_attention
