// The Hopper prefill kernel's producer warpgroup: K/V tiles gathered through the block
// table (xla_kernels/paged_cache.cuh) into the swizzled stages with cp.async; on fp8
// caches through a ring of raw e4m3 tiles that it converts.
#pragma once

#include "sm90_config.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

// Block id of token t0 + j of sequence s, or -1 where the token is outside [lo, hi) or its
// block id is invalid (never used to form an address).
__device__ __forceinline__ int tile_block(const Args& a, int s, int t0, int lo, int hi, int j) {
  const int pos = t0 + j;
  if (pos < lo || pos >= hi) return -1;
  const int blk = a.cache.block_id(a.cache.table(s), pos);
  return a.cache.valid(blk) ? blk : -1;
}

// The producer warpgroup (ptid 0..127): tiles 0 .. ntiles - 1 of K and V into the stages,
// 8 threads per token, so that a warp's cp.async reads 4 whole 128-byte lines (with 2
// threads per token it read 16 rows of 32 bytes, one sector per L2 request: 7-15 % slower
// prefill, the design notes). In pass u < N / 16, lanes 8 q .. 8 q + 7 of warp pw copy token
// j = 16 u + 4 pw + q of the tile, chunk `part` = lane % 8 of each 64-column panel (SW128
// puts chunk c of row j at 16 (c ^ (j % 8)); j % 8 does not depend on u, so the
// destinations are one offset plus constants). Each token's source offset is computed
// once per tile, by lane 4 u + q of its warp (its block id loaded a tile ahead), and
// shuffled to the 8 lanes that copy it (as FlashAttention-3's PagedKVManager shares its
// page pointers): per tile and thread one block-table load and one 64-bit offset, and no
// spill at the producer's 24 registers.
template <typename T, int D, int N>
__device__ __forceinline__ void produce_kv(const Args& a, const Work& w, int kvh, int lo,
                                           int hi, int ntiles, uint32_t kv_s,
                                           const StageBarriers& b, int ptid) {
  using C = Sm90Config<D, N>;
  constexpr int S = C::kStages, kPasses = N / 16, kPanels = D / 64;
  static_assert(4 * kPasses <= 32, "a warp's tokens: one offset per lane");
  const int pw = ptid >> 5, lane = ptid & 31, part = lane & 7, q = lane >> 3;
  const uint32_t dst0 = wg::sw128_offset(4 * pw + q, part);  // token 4 pw + q of pass 0
  const int jl = 16 * (lane >> 2) + 4 * pw + (lane & 3);     // the token whose offset it computes
  const bool looks = lane < 4 * kPasses;
  // Bytes: this thread's chunk of kv head kvh; a token's offset.
  const char* kc = reinterpret_cast<const char*>(static_cast<const T*>(a.k) +
                                                 a.cache.head_offset(kvh) + part * 8);
  const char* vc = reinterpret_cast<const char*>(static_cast<const T*>(a.v) +
                                                 a.cache.head_offset(kvh) + part * 8);
  int next = ntiles > 0 && looks ? tile_block(a, w.s, lo, lo, hi, jl) : -1;
  // Pass u's copies of one token into K (kk) and / or V (kv) of a stage: its offset from
  // lane 4 u + q, negative where it is masked (zero-filled, nothing read). K and V in one
  // pass: the shuffled offsets are used at once (ptxas kept all of them live between
  // separate K and V loops, and spilled).
  auto copy = [&](int64_t off, uint32_t ks, uint32_t vs, bool kk, bool kv) {
#pragma unroll
    for (int u = 0; u < kPasses; ++u) {
      const int64_t o = __shfl_sync(kFull, off, 4 * u + q);
      const bool valid = o >= 0;
      const char* kp = kc + (valid ? o : 0);
      const char* vp = vc + (valid ? o : 0);
#pragma unroll
      for (int p = 0; p < kPanels; ++p) {
        const uint32_t dst = u * 16 * 128 + p * C::kKvPanel;
        if (kk) ap::cp_async16_zfill(ks + dst, kp + 128 * p, valid);
        if (kv) ap::cp_async16_zfill(vs + dst, vp + 128 * p, valid);
      }
    }
  };
  int st = 0;
  for (int it = 0; it < ntiles; ++it) {
    const int t0 = lo + it * N;
    const int64_t off = next >= 0 ? a.cache.row_offset(next, t0 + jl) *
                                        static_cast<int64_t>(sizeof(T))
                                  : int64_t{-1};
    if (it + 1 < ntiles && looks) next = tile_block(a, w.s, t0 + N, lo, hi, jl);  // ahead
    const uint32_t ks = kv_s + st * C::kStageBytes + dst0, vs = ks + C::kTileBytes;
    const uint32_t free_parity = ((it / S) & 1) ^ 1;
    if constexpr (C::kSplitKV) {  // K, then V, each as soon as the consumers have freed it
      if (it >= S) ap::mbarrier_wait_parity(b.empty + 8 * st, free_parity);
      copy(off, ks, vs, true, false);
      ap::cp_async_mbarrier_arrive(b.full + 8 * st);
      if (it >= S) ap::mbarrier_wait_parity(b.empty_v + 8 * st, free_parity);
      copy(off, ks, vs, false, true);
      ap::cp_async_mbarrier_arrive(b.full_v + 8 * st);
    } else {
      if (it >= S) ap::mbarrier_wait_parity(b.empty + 8 * st, free_parity);
      copy(off, ks, vs, true, true);
      ap::cp_async_mbarrier_arrive(b.full + 8 * st);  // when the copies have landed
    }
    st = st + 1 == S ? 0 : st + 1;
  }
  cp_async_wait<0>();  // nothing in flight when the thread exits
}

// fp8 caches: the same stages of T, filled by the producer from a ring of raw e4m3 units
// (C::kRawUnits of N x D bytes; unit v = 2 it + half is tile it's K, half 0, or its V).
// kTpt = min(8, D / 16) threads per token (a token's D bytes in 16-byte chunks), so that a
// warp's cp.async reads whole 128-byte lines (head_dim 128 and 256) or 64-byte rows (64);
// token offsets computed once per tile by one lane each and shuffled, as in produce_kv.
// Thread ptid = 32 pw + lane copies, in pass u < kPasses, token j = 4 kP u + kP pw + lane /
// kTpt (kP = 32 / kTpt tokens per warp and pass), chunks part + kTpt f (f < kF) of its row,
// into the raw ring at unit + 2048 (u kF + f) + 16 ptid (consecutive threads, consecutive
// 16 bytes), with cp.async (masked tokens are zero-filled, nothing read) kRawUnits - 1
// units ahead of the unit it converts, so later units' loads are in flight while it
// converts (a synchronous producer kept one tile's load latency per tile: the design notes).
// It converts exactly the chunks it copied, so no barrier is needed among the producer
// threads (cp.async.wait_group orders a thread's own copies before its reads), each to two
// 16-byte chunks (exact: e4m3x2_to; K to T, V to f16), stored where produce_kv's copies
// would land; a proxy fence before its arrival on "full" makes the stores visible to the
// consumers' wgmma (the async proxy).
template <typename T, int D, int N>
__device__ __forceinline__ void produce_kv_fp8(const Args& a, const Work& w, int kvh, int lo,
                                               int hi, int ntiles, uint32_t kv_s,
                                               uint32_t raw_s, const StageBarriers& b,
                                               int ptid) {
  using ::xla_kernels::paged_attention::detail::e4m3x2_to;
  using C = Sm90Config<D, N, true>;
  constexpr int S = C::kStages, R = C::kRawUnits;
  constexpr int kTpt = D / 16 < 8 ? D / 16 : 8;  // threads per token
  constexpr int kP = 32 / kTpt, kPasses = N / (4 * kP);
  constexpr int kF = D / 16 / kTpt;  // e4m3 chunks per thread and token
  static_assert((R & (R - 1)) == 0, "the raw ring's length is a power of two");
  static_assert(kP * kPasses <= 32, "a warp's tokens: one offset per lane");
  const int pw = ptid >> 5, lane = ptid & 31, part = lane % kTpt, qq = lane / kTpt;
  const int j0 = kP * pw + qq;  // this thread's token of pass 0 (+ 4 kP u)
  const int jl = 4 * kP * (lane / kP) + kP * pw + lane % kP;  // the token whose offset it computes
  const bool looks = lane < kP * kPasses;
  // Where chunk 2 part + h (h < 2) of token j0 lands in a stage's tile (SW128); the other
  // chunks and passes are constant offsets from it (2 kTpt f chunks: whole panels; 4 kP u
  // rows: a multiple of 8, the same swizzle), so that ptxas keeps two addresses, not 16.
  // With kSwapHalves (8 threads per token), threads of parts 4..7 (the second panel) store
  // their two chunks in the other order, so that a quarter warp's 16-byte stores (one
  // token's 8 parts) hit 8 different bank groups instead of 4 twice (+3-5 %, the design notes).
  constexpr bool kSwapHalves = kTpt == 8;
  const int swap = kSwapHalves && part >= 4 ? 1 : 0;
  const uint32_t swap8 = 8u * swap;
  uint32_t conv_off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    conv_off[h] =
        (2 * part / 8) * C::kKvPanel + wg::sw128_offset(j0, (2 * part) % 8 + (h ^ swap));
  }
  const uint8_t* kc =
      static_cast<const uint8_t*>(a.k) + a.cache.head_offset(kvh) + part * 16;
  const uint8_t* vc =
      static_cast<const uint8_t*>(a.v) + a.cache.head_offset(kvh) + part * 16;
  const int nunits = 2 * ntiles;
  // Copy side: the byte offset of token jl of the tile being copied (-1: masked), and its
  // block id in the tile after it (read a tile ahead).
  int64_t off = -1;
  int nxt = ntiles > 0 && looks ? tile_block(a, w.s, lo, lo, hi, jl) : -1;
  // Unit v's copies (nothing past the last unit), always one commit group.
  auto copy_unit = [&](int v) {
    if (v < nunits) {
      const int it = v >> 1;
      if ((v & 1) == 0) {  // a new tile: its offset, and the next tile's block id
        const int t0 = lo + it * N;
        off = nxt >= 0 ? a.cache.row_offset(nxt, t0 + jl) : -1;
        if (it + 1 < ntiles && looks) nxt = tile_block(a, w.s, t0 + N, lo, hi, jl);
      }
      const uint8_t* src = (v & 1) ? vc : kc;
      const uint32_t dst = raw_s + (v & (R - 1)) * C::kRawUnitBytes + 16 * ptid;
#pragma unroll
      for (int u = 0; u < kPasses; ++u) {
        const int64_t o = __shfl_sync(kFull, off, kP * u + qq);
        const bool valid = o >= 0;
        const uint8_t* row = src + (valid ? o : 0);
#pragma unroll
        for (int f = 0; f < kF; ++f) {
          ap::cp_async16_zfill(dst + 2048 * (u * kF + f), row + 16 * kTpt * f, valid);
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll 1
  for (int v = 0; v < R - 1; ++v) copy_unit(v);
  int st = 0, phase = 0;  // stage of the unit being converted, and its use count's parity
#pragma unroll 1
  for (int v = 0; v < nunits; ++v) {
    copy_unit(v + R - 1);
    cp_async_wait<R - 1>();  // this thread's chunks of unit v have landed
    const int half = v & 1;
    // V's own barriers (split), or the stage's: waited for before K, arrived on after V.
    const bool own = half == 1 && C::kSplitKV;
    if (v >= 2 * S && (half == 0 || own)) {
      ap::mbarrier_wait_parity((own ? b.empty_v : b.empty) + 8 * st, phase ^ 1);
    }
    const uint32_t src0 = raw_s + (v & (R - 1)) * C::kRawUnitBytes + 16 * ptid;
    const uint32_t dst0 = kv_s + st * C::kStageBytes + half * C::kTileBytes;
    // The unit's chunks as TC: T for K, f16 for V (the consumers' P V runs in f16 on fp8
    // caches: one cvt per pair instead of four for bf16, and P is kept more exactly).
    auto convert = [&](auto tag) {
      using TC = decltype(tag);
#pragma unroll
      for (int u = 0; u < kPasses; ++u) {
#pragma unroll
        for (int f = 0; f < kF; ++f) {
          uint32_t x[4];
          if constexpr (kSwapHalves) {  // x[2 h], x[2 h + 1]: the 8 bytes of conv_off[h]
            lds64(src0 + swap8 + 2048 * (u * kF + f), x[0], x[1]);
            lds64(src0 + (swap8 ^ 8) + 2048 * (u * kF + f), x[2], x[3]);
          } else {
            const uint4 v = lds128(src0 + 2048 * (u * kF + f));
            x[0] = v.x;
            x[1] = v.y;
            x[2] = v.z;
            x[3] = v.w;
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // chunk 2 (part + kTpt f) + (h ^ swap) of its row
            const uint32_t dst = dst0 + conv_off[h] + u * 4 * kP * 128 +
                                 f * (2 * kTpt / 8) * C::kKvPanel;
            sts128(dst, e4m3x2_to<TC>(x[2 * h]), e4m3x2_to<TC>(x[2 * h] >> 16),
                   e4m3x2_to<TC>(x[2 * h + 1]), e4m3x2_to<TC>(x[2 * h + 1] >> 16));
          }
        }
      }
    };
    if (half) {
      convert(__half{});
    } else {
      convert(T{});
    }
    if (half == 1 || C::kSplitKV) {
      wg::fence_proxy_async();  // st.shared -> wgmma (async proxy)
      ap::mbarrier_arrive((own ? b.full_v : b.full) + 8 * st);
    }
    if (half == 1 && ++st == S) {
      st = 0;
      phase ^= 1;
    }
  }
  cp_async_wait<0>();  // nothing in flight when the thread exits
}

}  // namespace xla_kernels::ragged_paged_attention::detail
