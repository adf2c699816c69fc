// The Hopper prefill kernel's online softmax of one S tile, per consumer thread (its two
// rows): the mask where the tile needs one, the reference maxima, P = exp2(logit - m) and
// the row sums.
#pragma once

#include "sm90_config.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

// A consumer thread's two rows (pr0 and pr0 + 8 of its warp's 16) and its warpgroup's 64:
// what decides which tiles need the per-element mask.
struct Sm90Rows {
  int pos0, lo0, pos1, lo1;  // each row attends tokens [lo, pos] (row_range)
  int tig;                   // lane % 4: the row's token columns 8 i + 2 tig (+ 1)
  bool whole;                // the warpgroup's 64 rows are all rows of the tile
  int pmin;                  // position of the warpgroup's first row
  int lomax;                 // with a window: the latest first token of its rows
  bool plain;                // no softcap and a positive scale (see sm90_softmax_tile)
};

// The softmax statistics of a thread's two rows: reference maxima m, partial row sums l
// (the quad is summed at the end) and the rescale alpha of O before the pending P V.
struct Sm90Stats {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float ap0 = 1.f, ap1 = 1.f;
};

// Online softmax of S (a tile of N tokens from t0): P = exp2(logit - m) in s, row sums, and
// the reference maxima m with their alpha. m only moves when a row's maximum exceeds it by
// more than kRescaleSlack (base-2 units; FlashAttention-4's conditional rescaling): below
// that P stays <= 2^kRescaleSlack, exact enough in f32 and bf16/f16, and O and l need no
// rescale (alpha = 1), because O / l does not depend on the reference. block_id: lane
// l <= N / 16 holds the block table entry of the tile's l-th block (-1 past the table).
// Without softcap and with a positive scale, the row maximum of the raw dot products times
// the scale is the maximum of the logits, and a full tile's exp2(dot * scale - max) is one
// FFMA + MUFU per element.
template <int N>
__device__ __forceinline__ void sm90_softmax_tile(float (&s)[N / 2], Sm90Stats& st,
                                                  const Sm90Rows& rows, const Args& a, int t0,
                                                  int block_id) {
  // Bit l: block (t0 >> log2_bs) + l of the tile has a valid id (never read otherwise).
  const int first_block = a.cache.block_index(t0);
  const uint32_t vb = __ballot_sync(kFull, a.cache.valid(block_id));
  const uint32_t need = (2u << (a.cache.block_index(t0 + N - 1) - first_block)) - 1u;
  const bool all_ok = (vb & need) == need;  // every token of the tile holds data
  const bool full_tile = all_ok && rows.whole && t0 + N - 1 <= rows.pmin &&
                         (a.window == 0 || t0 >= rows.lomax);
  float sc = 1.f;  // scale still to apply inside the exponent (plain full tiles)
  if (full_tile && rows.plain) {
    sc = a.qk_scale;
  } else if (full_tile) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s[i] = logit(s[i], a);
  } else {
    // Masked tile; the softcap test is hoisted out of the element loop (ptxas keeps a
    // branch per element otherwise). Register 4i + e: row pr0 (e < 2) or pr1, token
    // column 8i + 2 tig + (e & 1).
    auto mask = [&](auto f) {
#pragma unroll
      for (int i = 0; i < N / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = i * 8 + rows.tig * 2 + e;
          const int t = t0 + col;
          const bool ok = (vb >> (a.cache.block_index(t) - first_block)) & 1u;
          s[4 * i + e] = (ok && t <= rows.pos0 && t >= rows.lo0) ? f(s[4 * i + e]) : -INFINITY;
          s[4 * i + e + 2] =
              (ok && t <= rows.pos1 && t >= rows.lo1) ? f(s[4 * i + e + 2]) : -INFINITY;
        }
      }
    };
    if (a.cap_mul > 0.f) {
      mask([&](float x) { return logit(x, a); });
    } else {
      mask([&](float x) { return x * a.qk_scale; });
    }
  }
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
  constexpr float kRescaleSlack = 8.f;
  const float mn0 = fmaxf(st.m0, mx0 * sc), mn1 = fmaxf(st.m1, mx1 * sc);
  // A row whose reference moves: the first tile with a finite maximum (m = -inf), or a
  // maximum more than the slack above it.
  const bool mv0 = mn0 - st.m0 > kRescaleSlack, mv1 = mn1 - st.m1 > kRescaleSlack;
  st.ap0 = mv0 ? fast_exp2(st.m0 - safe_max(mn0)) : 1.f;
  st.ap1 = mv1 ? fast_exp2(st.m1 - safe_max(mn1)) : 1.f;
  if (mv0) st.m0 = mn0;
  if (mv1) st.m1 = mn1;
  const float b0 = safe_max(st.m0), b1 = safe_max(st.m1);
  float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    s[4 * i] = fast_exp2(fmaf(s[4 * i], sc, -b0));
    s[4 * i + 1] = fast_exp2(fmaf(s[4 * i + 1], sc, -b0));
    s[4 * i + 2] = fast_exp2(fmaf(s[4 * i + 2], sc, -b1));
    s[4 * i + 3] = fast_exp2(fmaf(s[4 * i + 3], sc, -b1));
    rs0 += s[4 * i] + s[4 * i + 1];
    rs1 += s[4 * i + 2] + s[4 * i + 3];
  }
  st.l0 = st.l0 * st.ap0 + rs0;  // per-lane partial sums; the quad is summed at the end
  st.l1 = st.l1 * st.ap1 + rs1;
}

// P as the register A operand of the next P V: k-step k = token columns 16k .. 16k + 15.
template <typename TV, int N>
__device__ __forceinline__ void sm90_pack_p(uint32_t (&pp)[N / 16][4], const float (&s)[N / 2]) {
#pragma unroll
  for (int k = 0; k < N / 16; ++k) {
    pp[k][0] = pack2<TV>(s[8 * k], s[8 * k + 1]);
    pp[k][1] = pack2<TV>(s[8 * k + 2], s[8 * k + 3]);
    pp[k][2] = pack2<TV>(s[8 * k + 4], s[8 * k + 5]);
    pp[k][3] = pack2<TV>(s[8 * k + 6], s[8 * k + 7]);
  }
}

}  // namespace xla_kernels::ragged_paged_attention::detail
