// Ragged paged attention, Hopper prefill kernel: wgmma (sm_90a) for bf16/f16 with head_dim
// 64, 128 or 256. Same semantics as the kernels of ragged_paged_attention.cuh (its header
// comment); this file is included by that header after its device helpers (Args, Work,
// find_work, token_range, row_range, logit...) and is not usable on its own.
//
// Design (FlashAttention-3's warp specialization, intra-warpgroup overlap and ping-pong
// between the consumers; no TMA, whose boxes cannot follow a block table):
//  * CTA = 3 warpgroups (384 threads) on 128 packed rows of one (sequence, kv head): a
//    producer warpgroup that only copies K/V tiles, and two consumer warpgroups with 64 rows
//    each (one wgmma M). setmaxnreg moves registers from the producer (40, or 24) to the
//    consumers (232, or 240: Sm90Config). Grid and work search as the mma.sync kernel
//    (find_work with 128-row tiles), but a sequence's CTAs take its row tiles last first:
//    the longest causal ranges start first and the grid's tail is short ones.
//  * K/V: N-token tiles (N = 128 at head_dim 64 and 128, 64 at 256 and on fp8 caches at 128:
//    the faster where both fit, see wgmma_tile and PERFORMANCE.md), gathered through the block
//    table with 16-byte cp.async by the producer (8 threads per token: whole 128-byte
//    lines per warp instruction; each token's offset computed by one lane and shuffled)
//    into 128-byte-swizzled shared memory (cuda_wgmma.cuh's SW128 panels), in as
//    many stages as fit. Tokens outside the CTA's range or with an invalid block id are
//    zero-filled by the same cp.async (src-size 0: nothing read); the consumers mask them
//    from the block table themselves (a few entries per tile, read a tile ahead), so a
//    stage holds K and V only and the consumers read it through wgmma alone.
//  * Stage hand-off with mbarriers (cuda_async_pipeline.cuh), no CTA barrier after the
//    start: "full" completes when the producer's copies of the stage have landed (one
//    cp.async arrival per producer thread), "empty" when the 8 consumer warps have finished
//    with it (after the P V that reads its V). Where only two stages fit (head_dim 256), K
//    and V of a stage have barriers of their own (FA3's two pipelines): K is freed after
//    S = Q K^T and refilled while the P V of the tile before still reads V; with one pair
//    the producer could not run ahead of the consumers (ncu at 774f06c).
//  * Q: each consumer thread loads its own A fragments of Q (its warp's 16 rows) from
//    global memory into registers once; at head_dim 256, and 128 with 128-token tiles, where
//    the registers do not suffice, each consumer warpgroup stages its rows in shared memory
//    (and there, at the end, its O for 16-byte row stores).
//  * A consumer warpgroup runs over the contiguous tiles its rows attend, [jlo, jhi):
//    prologue S_jlo and its softmax; then per tile j: issue S_j = Q K_j^T (register-A wgmma,
//    K-major K), issue O = alpha_{j-1} O + P_{j-1} V_{j-1} (register-A P, MN-major V:
//    transpose bit), wait for S_j only, run the online softmax of S_j (base 2, f32
//    statistics, a row's statistics reduced over the 4 lanes of a quad) while the tensor
//    cores work on P_{j-1} V_{j-1}, wait for it, free stage j - 1, pack P_j; epilogue
//    P_{jhi-1} V_{jhi-1}. Tiles outside [jlo, jhi) are only waited for and freed.
//  * Ping-pong (Sm90Config::kPingPong): the consumers take turns, one per tile of the CTA,
//    to issue S_j and the pending P V, so one's softmax runs under the other's wgmmas.
//  * The per-element mask (causal, window, valid token, rows past the tile) runs only on
//    tiles that need it: a warpgroup's tile is "full" when every token is valid and every
//    one of its 64 rows attends every token of the tile. Full tiles without softcap take
//    exp2(s * scale - max) as one FFMA + ex2.approx.ftz per element.
//  * fp8 caches (f8e4m3fn, bf16/f16 queries): the producer copies the raw e4m3 tiles into a
//    ring of its own (cp.async, up to 3 K/V units ahead) and converts them into the same
//    stages (K to the query dtype, V to f16); the consumers run P V in f16, fold k_scale
//    into the logit scale and v_scale into the final 1/l (produce_kv_fp8).
// Dispatch (launch_ragged_paged_attention): bf16/f16 (head_dim 64/128/256), a device of
// compute capability 9.0, the library built for sm_90a (the kernel then has static shared
// memory; the sm_80 / plain sm_90 builds compile it to an empty body without any), and the
// environment variable XLA_KERNELS_RAGGED_WGMMA not "0" (the switch back to the mma.sync
// kernel, for A/B checks). Decode-only batches keep the decode path.
#pragma once

#include "xla_kernels/cuda_async_pipeline.cuh"
#include "xla_kernels/cuda_wgmma.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

namespace wg = ::xla_kernels::cuda_wgmma;
namespace ap = ::xla_kernels::cuda_async_pipeline;

constexpr int kSm90Consumers = 2;                        // consumer warpgroups
constexpr int kSm90Threads = 128 * (1 + kSm90Consumers);  // + the producer warpgroup
constexpr int kSm90Rows = 64 * kSm90Consumers;           // packed rows per CTA
// Registers per thread at launch (__launch_bounds__(kSm90Threads, 1)); setmaxnreg then moves
// them from the producer to the consumers (Sm90Config::kConsumerRegs).
constexpr int kSm90LaunchRegs = 65536 / kSm90Threads / 8 * 8;
// The consumers' register budget where it is not the shape's own (Sm90Config); an A/B
// switch: -DXK_RAGGED_CONSUMER_REGS=232 or =240.
#ifndef XK_RAGGED_CONSUMER_REGS
#define XK_RAGGED_CONSUMER_REGS 0
#endif
// Ping-pong of the two consumer warpgroups (FlashAttention-3's warp-scheduler barriers): a
// consumer issues a tile's wgmmas (S_j and the pending P V) only in its turn, then hands
// the turn to the other, so that one's softmax runs while the other's wgmmas keep the
// tensor cores busy. Both take one turn per tile of the CTA, the tiles they pass included.
// Where it is used: Sm90Config::kPingPong; -DXK_RAGGED_PINGPONG=0 or =1 turns it off or on
// for every shape (A/B runs).
#ifndef XK_RAGGED_PINGPONG
#define XK_RAGGED_PINGPONG -1
#endif
// O staged through shared memory for 16-byte stores where Q is in shared memory
// (-DXK_RAGGED_O_STAGED=0: 4-byte stores from the accumulators).
#ifndef XK_RAGGED_O_STAGED
#define XK_RAGGED_O_STAGED 1
#endif
constexpr bool kOStaged = XK_RAGGED_O_STAGED != 0;
// A sequence's CTAs take its row tiles last first (the longest causal ranges start first,
// the grid's tail is short ones); -DXK_RAGGED_HEAVY_FIRST=0: first first.
#ifndef XK_RAGGED_HEAVY_FIRST
#define XK_RAGGED_HEAVY_FIRST 1
#endif
constexpr bool kHeavyFirst = XK_RAGGED_HEAVY_FIRST != 0;
constexpr uint32_t kSm90TurnBarrier = 3;  // + consumer index (1 + consumer index stages Q)

template <int D, int N, bool kFp8 = false>
struct Sm90Config {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  static_assert(N == 64 || N == 128, "K/V tiles of 64 or 128 tokens");
  static_assert(D < 256 || N == 64, "head_dim 256 takes 64-token tiles (O alone is 128 "
                                    "registers per thread)");
  static constexpr int kKvPanel = N * 128;  // bytes of one 64-column panel of a K or V tile
  static constexpr int kTileBytes = N * D * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  // Q of both consumer warpgroups in shared memory (SW128 panels of 64 rows) where the
  // registers do not allow Q in registers (head_dim 128 with 128-token tiles: S and P take
  // 32 registers more; head_dim 256: O takes 128); the other shapes keep Q in registers.
  static constexpr bool kQSmem = D == 256 || (D == 128 && N == 128);
  // O of a consumer thread: kOH halves of kOW f32 accumulators (m64n128 each at head_dim
  // 256, whose P V is two wgmmas per k-step; one m64nD otherwise).
  static constexpr int kOH = D == 256 ? 2 : 1;
  static constexpr int kOW = D / 2 / kOH;
  static constexpr int kQWgBytes = 64 * D * 2;  // one consumer warpgroup's rows
  static constexpr int kQBytes = kQSmem ? kSm90Consumers * kQWgBytes : 0;
  // Shared memory per CTA on sm_90 (227 KB), less the static part (barriers, Work: under
  // 2 KB) and the 1024-byte alignment of the dynamic part.
  static constexpr int kSmemLimit = 232448, kStaticReserve = 2048;
  // fp8 caches: a ring of raw e4m3 units (one K or one V tile, N x D bytes each) that the
  // producer copies with cp.async and converts into the stages: 32 KB, i.e. 4 units (2 tiles)
  // at head_dim 64 and 128, 2 (one tile) at 256.
  static constexpr int kRawUnitBytes = N * D;
  static constexpr int kRawUnits = kFp8 ? 32768 / kRawUnitBytes : 0;
  static constexpr int kRawBytes = kRawUnits * kRawUnitBytes;
  static constexpr int kFit =
      (kSmemLimit - kStaticReserve - 1024 - kQBytes - kRawBytes) / kStageBytes;
  static constexpr int kStages = kFit < 6 ? kFit : 6;
  static_assert(kStages >= 2, "two stages must fit");
  static_assert(!kFp8 || kRawUnits >= 2, "fp8: the raw ring needs two units");
  static constexpr int kBytes = kQBytes + kStages * kStageBytes + kRawBytes + 1024;
  // K and V of a stage behind barriers of their own where two stages are all that fit.
  static constexpr bool kSplitKV = kStages == 2;
  // Ping-pong everywhere but at head_dim 128 with 64-token tiles (fp8 caches there), where
  // it measured 1 % slower; at 128-token tiles with 240 registers +3 %, at head_dim 64 +8 %,
  // at 256 +5 % (PERFORMANCE.md).
  static constexpr bool kPingPong =
      XK_RAGGED_PINGPONG < 0 ? !(D == 128 && N == 64) : XK_RAGGED_PINGPONG != 0;
  // Registers per thread after setmaxnreg: 240 for the consumers at head_dim 128 with
  // 128-token tiles (FA3's split: with 232 the consumers spilled; at 24 the producer spills
  // its 9 copy offsets instead, 36 bytes), else 232; the producer gets what they leave (24
  // or 40). setmaxnreg.inc takes registers only from those the producer gave back from its
  // launch allocation, so the budgets must balance there, not only fit the register file;
  // the fp8 producer converts, and needs its 40.
  static constexpr int kConsumerRegs = XK_RAGGED_CONSUMER_REGS > 0 ? XK_RAGGED_CONSUMER_REGS
                                       : D == 128 && N == 128 && !kFp8 ? 240 : 232;
  static constexpr int kProducerRegs =
      (kSm90LaunchRegs - kSm90Consumers * (kConsumerRegs - kSm90LaunchRegs)) / 8 * 8;
  static_assert(kConsumerRegs % 8 == 0 && kConsumerRegs <= 240 && kProducerRegs >= 24,
                "consumer registers: a multiple of 8 up to 240");
  static_assert((kSm90LaunchRegs - kProducerRegs) * 128 >=
                    (kConsumerRegs - kSm90LaunchRegs) * 128 * kSm90Consumers,
                "the consumers would wait for registers the producer never gives back");
};

// Block id of token t0 + j of sequence s, or -1 where the token is outside [lo, hi) or its
// block id is invalid (never used to form an address).
__device__ __forceinline__ int tile_block(const Args& a, int s, int t0, int lo, int hi, int j) {
  const int pos = t0 + j;
  if (pos < lo || pos >= hi) return -1;
  const int blk = __ldg(a.bt + static_cast<int64_t>(s) * a.max_blocks + (pos >> a.log2_bs));
  return blk >= 0 && blk < a.num_blocks ? blk : -1;
}

// Shared memory by its 32-bit shared-window address (the addresses the stages, Q panels and
// raw ring are kept as): 4-byte stores, 8- and 16-byte loads, 16-byte stores.
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t x) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ void lds64(uint32_t addr, uint32_t& x0, uint32_t& x1) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(x0), "=r"(x1) : "r"(addr) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, uint32_t x0, uint32_t x1, uint32_t x2,
                                       uint32_t x3) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x0), "r"(x1),
               "r"(x2), "r"(x3)
               : "memory");
}

// Byte address of 16-byte chunk ch (8 columns) of row r < 64 in a warpgroup's Q panels at
// q_s (SW128, 64 columns per panel): where Q is staged and O is gathered for its stores.
__device__ __forceinline__ uint32_t q_panel_chunk(uint32_t q_s, int r, int ch) {
  return q_s + (ch / 8) * 64 * 128 + wg::sw128_offset(r, ch % 8);
}

// 2^x with ex2.approx.ftz: exp2f without its subnormal fix-up (a result below 2^-126 becomes
// 0; softmax weights are taken relative to the row maximum, so nothing of weight is lost).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Shared-memory addresses of the stages' mbarriers (stage st's at + 8 st). full / empty
// guard the whole stage, or only its K where the config splits K and V (full_v / empty_v
// then guard V).
struct StageBarriers {
  uint32_t full, empty, full_v, empty_v;
};

// The producer warpgroup (ptid 0..127): tiles 0 .. ntiles - 1 of K and V into the stages,
// 8 threads per token, so that a warp's cp.async reads 4 whole 128-byte lines (with 2
// threads per token it read 16 rows of 32 bytes, one sector per L2 request: 7-15 % slower
// prefill, PERFORMANCE.md). In pass u < N / 16, lanes 8 q .. 8 q + 7 of warp pw copy token
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
                                                 static_cast<int64_t>(kvh) * a.sh + part * 8);
  const char* vc = reinterpret_cast<const char*>(static_cast<const T*>(a.v) +
                                                 static_cast<int64_t>(kvh) * a.sh + part * 8);
  const int slot_mask = (1 << a.log2_bs) - 1;
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
    const int64_t off = next >= 0 ? (static_cast<int64_t>(next) * a.sb +
                                     static_cast<int64_t>((t0 + jl) & slot_mask) * a.ss) *
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
// converts (a synchronous producer kept one tile's load latency per tile: PERFORMANCE.md).
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
  // token's 8 parts) hit 8 different bank groups instead of 4 twice (+3-5 %, PERFORMANCE.md).
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
      static_cast<const uint8_t*>(a.k) + static_cast<int64_t>(kvh) * a.sh + part * 16;
  const uint8_t* vc =
      static_cast<const uint8_t*>(a.v) + static_cast<int64_t>(kvh) * a.sh + part * 16;
  const int slot_mask = (1 << a.log2_bs) - 1;
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
        off = nxt >= 0 ? static_cast<int64_t>(nxt) * a.sb +
                             static_cast<int64_t>((t0 + jl) & slot_mask) * a.ss
                       : -1;
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

template <typename T, int D, int N, bool kFp8 = false>
__global__ void __launch_bounds__(kSm90Threads, 1) ragged_wgmma_kernel(const Args a) {
#if XK_HAS_WGMMA
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  using C = Sm90Config<D, N, kFp8>;
  constexpr int S = C::kStages;
  constexpr int OH = C::kOH, OW = C::kOW;  // O accumulator registers per thread: OH x OW
  constexpr int SR = N / 2;  // S accumulator registers per thread
  constexpr int PK = N / 16; // k-steps of P V
  // P and V: f16 on fp8 caches (the producer converts V to f16 whatever the query dtype),
  // the query dtype otherwise.
  using TV = std::conditional_t<kFp8, __half, T>;
  extern __shared__ unsigned char smem_raw[];
  // Static shared memory exists only in this (sm_90a) body: the host reads it as "built
  // with wgmma" (wgmma_kernel_usable).
  __shared__ Work work;
  constexpr int SV = C::kSplitKV ? S : 0;  // stages with V barriers of their own
  __shared__ __align__(8) uint64_t full_bar[S + SV], empty_bar[S + SV];  // K's (stage's), V's
  static_assert(16 * (S + SV) + sizeof(Work) <= C::kStaticReserve, "static shared memory");
  unsigned char* qs = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  const uint32_t kv_s = wg::smem_u32(qs + C::kQBytes);
  const uint32_t full = wg::smem_u32(full_bar), empty = wg::smem_u32(empty_bar);
  const StageBarriers bars{full, empty, full + 8 * S, empty + 8 * S};

  const int tid = threadIdx.x, lane = tid & 31;
  const int wgi = __shfl_sync(kFull, tid >> 7, 0);  // warp-uniform warpgroup index
  const int kvh = blockIdx.y;
  if (tid == 0) {
    for (int st = 0; st < S + SV; ++st) {
      ap::mbarrier_init(full + 8 * st, 128);                 // one per producer thread
      ap::mbarrier_init(empty + 8 * st, 4 * kSm90Consumers);  // one per consumer warp
    }
  }
  if (tid < 32) find_work(a, blockIdx.x, kSm90Rows, &work, lane);
  __syncthreads();
  Work w = work;
  if (w.s < 0) return;  // uniform over the CTA
  if constexpr (kHeavyFirst) w.tile = row_tiles(a, w.q_len, kSm90Rows) - 1 - w.tile;

  const TileRows tr = tile_rows(a, w, kSm90Rows);
  int lo, hi;
  token_range(a, tr, tr.r0, tr.r_end, &lo, &hi);
  const int ntiles = hi > lo ? (hi - lo + N - 1) / N : 0;

  if (wgi == 0) {
    ap::setmaxnreg_dec<C::kProducerRegs>();
    if constexpr (kFp8) {
      produce_kv_fp8<T, D, N>(a, w, kvh, lo, hi, ntiles, kv_s,
                              kv_s + S * C::kStageBytes, bars, tid);
    } else {
      produce_kv<T, D, N>(a, w, kvh, lo, hi, ntiles, kv_s, bars, tid);
    }
    return;
  }
  ap::setmaxnreg_inc<C::kConsumerRegs>();

  // This warpgroup's rows and the tiles they attend; this thread's two rows.
  const int cw = wgi - 1, wwarp = (tid >> 5) & 3;
  const int wr0 = tr.r0 + cw * 64;
  const bool live = wr0 < tr.r_end;
  int jlo = ntiles, jhi = ntiles;  // no tile of its own
  if (live) {
    int wlo, whi;
    token_range(a, tr, wr0, min(tr.r_end, wr0 + 64), &wlo, &whi);
    if (whi > wlo && ntiles > 0) {
      jlo = (wlo - lo) / N;
      jhi = min(ntiles, (whi - lo + N - 1) / N);
    }
  }
  const bool wg_whole = wr0 + 64 <= tr.r_end;
  const int wg_pmin = tr.p0 + wr0 / a.G;                        // position of row wr0
  const int wg_lomax = tr.p0 + (wr0 + 63) / a.G - a.window + 1;  // with a window
  const int g0 = lane >> 2, tig = lane & 3;
  const int pr0 = wr0 + wwarp * 16 + g0, pr1 = pr0 + 8;
  int pos0, lo0, pos1, lo1;
  row_range(a, tr, pr0, &pos0, &lo0);
  row_range(a, tr, pr1, &pos1, &lo1);

  // Q in registers: the A fragments (m16n8k16 layout) of this warp's 16 rows for every
  // k-step of S = Q K^T, loaded once from global memory (zeros past the tile's rows). With
  // kQSmem instead: the warpgroup's 64 rows staged once into its SW128 panels.
  uint32_t qf[C::kQSmem ? 1 : D / 16][4];
  const uint32_t q_s = wg::smem_u32(qs) + cw * C::kQWgBytes;
  const T* qg = static_cast<const T*>(a.q);
  if constexpr (C::kQSmem) {
    // Thread ct of the warpgroup copies chunk ct % kCpr of rows ct / kCpr + kRows i with
    // cp.async, all in flight at once (zeros past the tile's rows), then waits once (loads
    // into registers and st.shared waited for a load per two chunks: 3 % slower prefill).
    constexpr int kCpr = D / 8, kRows = 128 / kCpr;  // 16-byte chunks per row; rows per pass
    const int ct = tid - 128 * wgi, ch = ct % kCpr;
#pragma unroll
    for (int r = ct / kCpr; r < 64; r += kRows) {
      const bool valid = wr0 + r < tr.r_end;
      ap::cp_async16_zfill(q_panel_chunk(q_s, r, ch),
                           valid ? qg + out_offset(a, w, kvh, wr0 + r, D) + ch * 8 : qg,
                           valid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    wg::fence_proxy_async();  // cp.async -> wgmma (async proxy)
    ap::named_barrier_sync(1 + cw, 128);
  } else {
    const uint32_t* q0 = pr0 < tr.r_end ? reinterpret_cast<const uint32_t*>(
                                              qg + out_offset(a, w, kvh, pr0, D))
                                        : nullptr;
    const uint32_t* q1 = pr1 < tr.r_end ? reinterpret_cast<const uint32_t*>(
                                              qg + out_offset(a, w, kvh, pr1, D))
                                        : nullptr;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // columns 16 kk + 2 tig (+ 8 h), two values each
        const int c2 = kk * 8 + tig + 4 * h;  // in 32-bit words
        qf[kk][2 * h] = q0 != nullptr ? __ldg(q0 + c2) : 0u;
        qf[kk][2 * h + 1] = q1 != nullptr ? __ldg(q1 + c2) : 0u;
      }
    }
  }

  // Descriptors: built once, then advanced by constant offsets (the address field is the
  // low 14 bits, in 16-byte units; shared addresses stay below 2^18, so it never carries).
  const uint64_t kv_desc_k = wg::sw128_desc(kv_s, 16, 1024);
  const uint64_t kv_desc_v = wg::sw128_desc(kv_s, C::kKvPanel, 1024);
  const uint64_t q_desc = wg::sw128_desc(q_s, 16, 1024);
  // Logits without softcap and with a positive scale: the row maximum of the raw dot
  // products times the scale is the maximum of the logits, and exp2(dot * scale - max) is
  // one FFMA + MUFU per element.
  const bool plain = a.cap_mul <= 0.f && a.qk_scale > 0.f;

  // Tile j's K (the whole stage unless split) has landed; its V has landed (split only).
  auto wait_k = [&](int j) { ap::mbarrier_wait_parity(full + 8 * (j % S), (j / S) & 1); };
  auto wait_v = [&](int j) {
    if constexpr (C::kSplitKV) ap::mbarrier_wait_parity(bars.full_v + 8 * (j % S), (j / S) & 1);
  };
  // This warp is done with tile j's K (split only: after S = Q K^T), with its V (the whole
  // stage unless split: after P V); the wgmmas that read them have been waited for.
  auto arrive = [&](uint32_t bar, int j) {
    __syncwarp();
    if (lane == 0) ap::mbarrier_arrive(bar + 8 * (j % S));
  };
  auto release_k = [&](int j) {
    if constexpr (C::kSplitKV) arrive(empty, j);
  };
  auto release_v = [&](int j) { arrive(C::kSplitKV ? bars.empty_v : empty, j); };
  // Ping-pong turns (C::kPingPong): consumer cw waits at barrier kSm90TurnBarrier + cw
  // until the other has arrived there (256 threads: 128 wait, 128 arrive). Consumer 1's
  // first arrival gives consumer 0 the first turn; consumer 0 takes one turn more at the
  // end, which consumes consumer 1's last arrival, so no barrier is left half-arrived.
  auto turn_begin = [&]() {
    if constexpr (C::kPingPong) ap::named_barrier_sync(kSm90TurnBarrier + cw, 256);
  };
  auto turn_end = [&]() {
    if constexpr (C::kPingPong) ap::named_barrier_arrive(kSm90TurnBarrier + (cw ^ 1), 256);
  };
  if (cw == 1) turn_end();
  // Tiles this warpgroup does not compute: waited for (which orders the stage's phases)
  // and freed, and their turns taken.
  auto pass = [&](int j0, int j1) {
    for (int j = j0; j < j1; ++j) {
      wait_k(j);
      release_k(j);
      wait_v(j);
      release_v(j);
      turn_begin();
      turn_end();
    }
  };

  float o[OH][OW];
#pragma unroll
  for (int h = 0; h < OH; ++h) {
#pragma unroll
    for (int i = 0; i < OW; ++i) o[h][i] = 0.f;
  }
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float ap0 = 1.f, ap1 = 1.f;  // rescale of O before the pending P V
  uint32_t pp[PK][4];          // the pending P (register A operand of P V)
  float s[SR];

  // S = Q K_j^T (this warpgroup's 64 rows x N tokens), issued and committed; the first
  // k-step overwrites S.
  auto issue_s = [&](int j) {
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t koff = (j % S) * C::kStageBytes + (kk / 4) * C::kKvPanel + (kk % 4) * 32;
      const uint64_t db = kv_desc_k + (koff >> 4);
      if constexpr (C::kQSmem && N == 128) {
        const uint64_t da = q_desc + (((kk / 4) * 64 * 128 + (kk % 4) * 32) >> 4);
        if (kk == 0) wg::mma_ss_m64n128k16_kmajor<T, true>(s, da, db);
        else wg::mma_ss_m64n128k16_kmajor<T, false>(s, da, db);
      } else if constexpr (C::kQSmem) {
        const uint64_t da = q_desc + (((kk / 4) * 64 * 128 + (kk % 4) * 32) >> 4);
        if (kk == 0) wg::mma_ss_m64n64k16_kmajor<T, true>(s, da, db);
        else wg::mma_ss_m64n64k16_kmajor<T, false>(s, da, db);
      } else if constexpr (N == 128) {
        if (kk == 0) wg::mma_rs_m64n128k16_kmajor<T, true>(s, qf[kk], db);
        else wg::mma_rs_m64n128k16_kmajor<T, false>(s, qf[kk], db);
      } else {
        if (kk == 0) wg::mma_rs_m64n64k16_kmajor<T, true>(s, qf[kk], db);
        else wg::mma_rs_m64n64k16_kmajor<T, false>(s, qf[kk], db);
      }
    }
    wg::wgmma_commit();
  };
  // O = alpha O + P V_j (V of tile j's stage), issued and committed.
  auto issue_pv = [&](int j) {
    if (__any_sync(kFull, ap0 != 1.f || ap1 != 1.f)) {  // rare: see softmax
#pragma unroll
      for (int h = 0; h < OH; ++h) {
#pragma unroll
        for (int i = 0; i < OW / 4; ++i) {
          o[h][4 * i] *= ap0;
          o[h][4 * i + 1] *= ap0;
          o[h][4 * i + 2] *= ap1;
          o[h][4 * i + 3] *= ap1;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < OH; ++h) wg::fence_operands(o[h]);
#pragma unroll
    for (int k = 0; k < PK; ++k) wg::fence_operands(pp[k]);
    wg::wgmma_fence();
#pragma unroll
    for (int k = 0; k < PK; ++k) {
      const uint64_t db =
          kv_desc_v + (((j % S) * C::kStageBytes + C::kTileBytes + k * 16 * 128) >> 4);
      if constexpr (D == 64) {
        wg::mma_rs_m64n64k16<TV>(o[0], pp[k], db, 1);
      } else {
#pragma unroll
        for (int h = 0; h < OH; ++h) {  // columns 128 h .. : V's panels 2 h, 2 h + 1
          wg::mma_rs_m64n128k16<TV>(o[h], pp[k], db + ((2 * h * C::kKvPanel) >> 4), 1);
        }
      }
    }
    wg::wgmma_commit();
  };
  auto wait_pv = [&]() {
    wg::wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < OH; ++h) wg::fence_operands(o[h]);
#pragma unroll
    for (int k = 0; k < PK; ++k) wg::fence_operands(pp[k]);
  };
  // Online softmax of S (tile j): P = exp2(logit - m) in s, row sums, and the reference
  // maxima m with their alpha. m only moves when a row's maximum exceeds it by more than
  // kRescaleSlack (base-2 units; FlashAttention-4's conditional rescaling): below that P
  // stays <= 2^kRescaleSlack, exact enough in f32 and bf16/f16, and O and l need no
  // rescale (alpha = 1), because O / l does not depend on the reference.
  // Which tokens of a tile hold data: lane l <= N / 16 reads the block table entry of block
  // (t0 >> log2_bs) + l (every block the tile touches, t0 its first token; -1 past the
  // table), a tile ahead of its use, from global memory: a flag in the stage written by the
  // producer was read late, behind the tile's wgmmas in the shared memory queue (ncu at
  // a881c31: the top consumer stall), and racecheck saw its writes race the consumers'
  // reads at two stages (the warp's arrival on "empty" came from lane 0).
  const int32_t* bt_row = a.bt + static_cast<int64_t>(w.s) * a.max_blocks;
  auto load_block_id = [&](int j) -> int {
    const int b = ((lo + j * N) >> a.log2_bs) + lane;
    return lane <= N / 16 && b < a.max_blocks ? __ldg(bt_row + b) : -1;
  };
  auto softmax = [&](int j, int block_id) {
    const int t0 = lo + j * N;
    // Bit l: block (t0 >> log2_bs) + l of the tile has a valid id (never read otherwise).
    const int first_block = t0 >> a.log2_bs;
    const uint32_t vb = __ballot_sync(kFull, block_id >= 0 && block_id < a.num_blocks);
    const uint32_t need = (2u << (((t0 + N - 1) >> a.log2_bs) - first_block)) - 1u;
    const bool all_ok = (vb & need) == need;  // every token of the tile holds data
    const bool full_tile = all_ok && wg_whole && t0 + N - 1 <= wg_pmin &&
                           (a.window == 0 || t0 >= wg_lomax);
    float sc = 1.f;  // scale still to apply inside the exponent (plain full tiles)
    if (full_tile && plain) {
      sc = a.qk_scale;
    } else if (full_tile) {
#pragma unroll
      for (int i = 0; i < SR; ++i) s[i] = logit(s[i], a);
    } else {
      // Masked tile; the softcap test is hoisted out of the element loop (ptxas keeps a
      // branch per element otherwise). Register 4i + e: row pr0 (e < 2) or pr1, token
      // column 8i + 2 tig + (e & 1).
      auto mask = [&](auto f) {
#pragma unroll
        for (int i = 0; i < N / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = i * 8 + tig * 2 + e;
            const int t = t0 + col;
            const bool ok = (vb >> ((t >> a.log2_bs) - first_block)) & 1u;
            s[4 * i + e] = (ok && t <= pos0 && t >= lo0) ? f(s[4 * i + e]) : -INFINITY;
            s[4 * i + e + 2] = (ok && t <= pos1 && t >= lo1) ? f(s[4 * i + e + 2]) : -INFINITY;
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
    const float mn0 = fmaxf(m0, mx0 * sc), mn1 = fmaxf(m1, mx1 * sc);
    // A row whose reference moves: the first tile with a finite maximum (m = -inf), or
    // a maximum more than the slack above it.
    const bool mv0 = mn0 - m0 > kRescaleSlack, mv1 = mn1 - m1 > kRescaleSlack;
    ap0 = mv0 ? fast_exp2(m0 - safe_max(mn0)) : 1.f;
    ap1 = mv1 ? fast_exp2(m1 - safe_max(mn1)) : 1.f;
    if (mv0) m0 = mn0;
    if (mv1) m1 = mn1;
    const float b0 = safe_max(m0), b1 = safe_max(m1);
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
    l0 = l0 * ap0 + rs0;  // per-lane partial sums; the quad is summed at the end
    l1 = l1 * ap1 + rs1;
  };
  // P as the register A operand of the next P V: k-step k = token columns 16k .. 16k + 15.
  auto pack_p = [&]() {
#pragma unroll
    for (int k = 0; k < PK; ++k) {
      pp[k][0] = pack2<TV>(s[8 * k], s[8 * k + 1]);
      pp[k][1] = pack2<TV>(s[8 * k + 2], s[8 * k + 3]);
      pp[k][2] = pack2<TV>(s[8 * k + 4], s[8 * k + 5]);
      pp[k][3] = pack2<TV>(s[8 * k + 6], s[8 * k + 7]);
    }
  };

  pass(0, jlo);
  if (jhi > jlo) {
    // Prologue: S and softmax of the first tile (O is zero: its alpha is irrelevant).
    int block_id = load_block_id(jlo), next_id = -1;
    if (jlo + 1 < jhi) next_id = load_block_id(jlo + 1);
    wait_k(jlo);
    turn_begin();
    issue_s(jlo);
    turn_end();
    wg::wgmma_wait<0>();
    wg::fence_operands(s);
    release_k(jlo);
    softmax(jlo, block_id);
    pack_p();
    for (int j = jlo + 1; j < jhi; ++j) {
      block_id = next_id;
      if (j + 1 < jhi) next_id = load_block_id(j + 1);
      wait_k(j);
      turn_begin();
      issue_s(j);
      wait_v(j - 1);
      issue_pv(j - 1);
      turn_end();
      wg::wgmma_wait<1>();  // S_j done; P V of tile j - 1 may still run
      wg::fence_operands(s);
      release_k(j);
      softmax(j, block_id);
      wait_pv();
      release_v(j - 1);
      pack_p();
    }
    wait_v(jhi - 1);
    issue_pv(jhi - 1);
    wait_pv();
    release_v(jhi - 1);
  }
  pass(jhi, ntiles);
  if (cw == 0) turn_begin();  // consumer 1's last arrival

  if (!live) return;
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
  // Row pr's outputs (e = 0: this thread's row pr0, registers 4i, 4i + 1; e = 2: pr1, 4i + 2,
  // 4i + 3). Register 4i + e of half h: column 128 h + 8 i + 2 tig + (e & 1), as 32-bit
  // word 64 h + 4 i + tig of the row.
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
  if constexpr (C::kQSmem && kOStaged) {
    // O through this warpgroup's Q panels (its last S = Q K^T has been waited for), then
    // 16-byte stores of whole rows: a warp instruction writes 32 x 16 contiguous bytes of
    // 512 / (2 D) rows, where the 4-byte stores from the accumulators each wrote 16 bytes
    // of 8 rows (+1.5 % at prefill 4 x 4096, +5 % at head_dim 256: PERFORMANCE.md).
    const int r0 = wwarp * 16 + g0;  // this thread's rows pr0, pr1 within the warpgroup
#pragma unroll
    for (int h = 0; h < OH; ++h) {
#pragma unroll
      for (int i = 0; i < OW / 4; ++i) {
        const int chunk = h * (OW / 4) + i;  // 16-byte chunk (8 columns) of the row
        // q_panel_chunk's address, 4 tig added before the swizzle (written through the
        // helper, ptxas schedules these stores differently from the measured build).
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
    store_row(pr0, inv0, 0);
    store_row(pr1, inv1, 2);
  }
#else
  (void)a;  // not built for sm_90a: never launched (wgmma_kernel_usable is false)
#endif
}

}  // namespace xla_kernels::ragged_paged_attention::detail
