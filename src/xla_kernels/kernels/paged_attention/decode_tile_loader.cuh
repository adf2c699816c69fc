// paged_attention, the producer side of a warp: block ids looked up ahead, and a tile of K/V
// rows streamed into (swizzled) shared memory with cp.async through the paged cache view.
#pragma once

#include "decode_common.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

// Physical block of token pos0 + lane (lanes < NW), or -1 past the partition's end. Issued
// block_ids_ahead() iterations before the copies that use it, so its latency hides behind
// that many tiles' math.
template <int NW>
__device__ __forceinline__ int lookup_block(const KernelArgs& a, const int32_t* bt_row, int pos0,
                                            int p_hi, int lane) {
  const int pos = pos0 + lane;
  // pos < p_hi <= L <= capacity: the block_tables read is in bounds.
  return (lane < NW && pos < p_hi) ? a.cache.block_id(bt_row, pos) : -1;
}

// Swizzled tiles (bf16/f16 and fp8): 16-byte chunk q of row r (kCpr chunks per row) is
// stored at chunk swz_chunk(q, r). XOR of the low 3 chunk bits with the row (and, for 16
// chunks, the upper half): a bijection per row that keeps MmaCore's ldmatrix (8 rows, one
// chunk each) and Fp8MmaCore's K and V reads free of bank conflicts (Fp8MmaCore at
// head_dim 64: V reads 2-way).
template <int kCpr>
__device__ __forceinline__ int swz_chunk(int q, int r) {
  constexpr int kMask = kCpr < 8 ? kCpr - 1 : 7;
  return q ^ ((r ^ ((q >> 3) << 1)) & kMask);
}

// Streams tokens [pos0, pos0 + NW) of one kv head into shared memory: rows of D elements with
// RS elements between rows (chunks swizzled by swz_chunk with kSwizzle); `blk` comes from
// lookup_block. Returns the warp-uniform mask of the rows that hold a token; the other rows
// are zero-filled and never read from memory.
template <typename T, int D, int NW, int RS, bool kSwizzle = false>
__device__ __forceinline__ uint32_t load_tile(T* ks, T* vs, const KernelArgs& a, int blk,
                                              int pos0, int kvh, int lane) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kCpr = D / kVec;  // 16-byte chunks per row
  constexpr int kPerLane = NW * kCpr / 32;
  static_assert(NW <= 32 && (NW * kCpr) % 32 == 0, "tile does not split over a warp");
  int64_t off = 0;
  const bool valid = a.cache.valid(blk);  // checked before any address is formed
  if (valid) off = a.cache.offset(blk, pos0 + lane, kvh);
  const uint32_t mask = __ballot_sync(kFull, valid);
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    const int row = c / kCpr, chunk = c % kCpr;
    const int col = chunk * kVec;
    const int64_t roff = __shfl_sync(kFull, off, row);
    int scol = col;
    if constexpr (kSwizzle) scol = swz_chunk<kCpr>(chunk, row) * kVec;
    T* kd = ks + row * RS + scol;
    T* vd = vs + row * RS + scol;
    if ((mask >> row) & 1u) {
      cp_async16_l2<kL2PrefetchBytes>(kd, kc + roff + col);
      cp_async16_l2<kL2PrefetchBytes>(vd, vc + roff + col);
    } else {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
    }
  }
  return mask;
}

}  // namespace detail
}  // namespace xla_kernels::paged_attention
