// The Hopper prefill kernel's epilogue: a consumer warpgroup's O normalized by the row sums
// (and v_scale on fp8 caches) and stored to its rows of the output.
#pragma once

#include "sm90_softmax.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

// O of a consumer thread (OH halves of OW f32 accumulators, rows pr0 and pr0 + 8 of its
// warp) / l -> out. Where Q was staged in shared memory (C::kQSmem), O goes through the
// warpgroup's Q panels (its last S = Q K^T has been waited for), then out in 16-byte stores
// of whole rows: a warp instruction writes 32 x 16 contiguous bytes of 512 / (2 D) rows,
// where the 4-byte stores from the accumulators each write 16 bytes of 8 rows (+1.5 % at
// prefill 4 x 4096, +5 % at head_dim 256). Otherwise 4-byte stores from the accumulators.
template <typename T, int D, int N, bool kFp8>
__device__ __forceinline__ void sm90_store_output(
    const float (&o)[Sm90Config<D, N, kFp8>::kOH][Sm90Config<D, N, kFp8>::kOW], Sm90Stats st,
    const Args& a, const Work& w, const TileRows& tr, int kvh, int cw, int wr0, int pr0,
    uint32_t q_s, int tid, int wgi, int wwarp, int lane) {
  using C = Sm90Config<D, N, kFp8>;
  constexpr int OH = C::kOH, OW = C::kOW;
  const int g0 = lane >> 2, tig = lane & 3, pr1 = pr0 + 8;
  float l0 = st.l0, l1 = st.l1;
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  if constexpr (kFp8) {  // v_scale (k_scale is in qk_scale)
    inv0 *= a.out_scale;
    inv1 *= a.out_scale;
  }
  T* out = static_cast<T*>(a.out);
  if constexpr (C::kQSmem) {
    const int r0 = wwarp * 16 + g0;  // this thread's rows pr0, pr1 within the warpgroup
#pragma unroll
    for (int h = 0; h < OH; ++h) {
#pragma unroll
      for (int i = 0; i < OW / 4; ++i) {
        const int chunk = h * (OW / 4) + i;  // 16-byte chunk (8 columns) of the row
        // q_panel_chunk's address, 4 tig added before the swizzle.
        const uint32_t at = q_s + (chunk / 8) * 64 * 128 + 4 * tig;
        sts32(at + wg::sw128_offset(r0, chunk % 8),
              pack2<T>(o[h][4 * i] * inv0, o[h][4 * i + 1] * inv0));
        sts32(at + wg::sw128_offset(r0 + 8, chunk % 8),
              pack2<T>(o[h][4 * i + 2] * inv1, o[h][4 * i + 3] * inv1));
      }
    }
    ap::named_barrier_sync(1 + cw, 128);
    // Thread ct copies chunk ch of rows ct / kCpr + kRows k (the Q staging's mapping); the
    // packed row's (query row, head) advanced by kRows without a division per row.
    constexpr int kCpr = D / 8, kRows = 128 / kCpr;
    const int ct = tid - 128 * wgi, ch = ct % kCpr;
    const int step_rows = kRows / a.G, step_heads = kRows % a.G;
    int pr = wr0 + ct / kCpr;
    int64_t row = static_cast<int64_t>(w.start) + pr / a.G;
    int head = pr % a.G;
#pragma unroll
    for (int r = ct / kCpr; r < 64; r += kRows) {
      if (pr < tr.r_end) {
        *reinterpret_cast<uint4*>(out + (row * a.Hq + kvh * a.G + head) * D + ch * 8) =
            lds128(q_panel_chunk(q_s, r, ch));
      }
      pr += kRows;
      row += step_rows;
      head += step_heads;
      if (head >= a.G) {
        head -= a.G;
        ++row;
      }
    }
  } else {
    // Row pr's outputs (e = 0: this thread's row pr0, registers 4i, 4i + 1; e = 2: pr1,
    // 4i + 2, 4i + 3). Register 4i + e of half h: column 128 h + 8 i + 2 tig + (e & 1), as
    // 32-bit word 64 h + 4 i + tig of the row.
    auto store_row = [&](int pr, float inv, int e) {
      if (pr >= tr.r_end) return;
      uint32_t* o32 = reinterpret_cast<uint32_t*>(out + out_offset(a, w, kvh, pr, D));
#pragma unroll
      for (int h = 0; h < OH; ++h) {
#pragma unroll
        for (int i = 0; i < OW / 4; ++i)
          o32[64 * h + 4 * i + tig] = pack2<T>(o[h][4 * i + e] * inv, o[h][4 * i + e + 1] * inv);
      }
    };
    store_row(pr0, inv0, 0);
    store_row(pr1, inv1, 2);
  }
}

}  // namespace xla_kernels::ragged_paged_attention::detail
