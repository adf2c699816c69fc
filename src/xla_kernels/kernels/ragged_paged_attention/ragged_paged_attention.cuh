// Ragged paged attention (mixed prefill chunks and decode tokens) for NVIDIA GPUs: the kernel
// core. Plain CUDA templates and one entry point, launch_ragged_paged_attention(stream,
// params); no XLA types (the binding is ragged_paged_attention.cu).
//
// Semantics (the rules for inconsistent device data are SeqView's, ragged_paged_attention_ffi.h):
//   n     = clamp(num_seqs[0], 0, max_seqs)
//   c_j   = clamp(max(cu_q_lens[0..j]), 0, num_tokens), j <= n; sequence s owns rows [c_s, c_s+1)
//   L_s   = clamp(kv_lens[s], 0, max_blocks_per_seq * block_size)
//   row i of s (global row c_s + i) sits at p = L_s - q_len_s + i and attends
//           t in [max(0, p - window + 1), p]   (t in [0, p] without a window; none if p < 0)
//   token t of s is slot t % block_size of block block_tables[s, t / block_size]; it is masked
//           (never read) when that id is outside [0, num_blocks)
//   out   = softmax over the attended tokens of (scale * q.k, softcapped) times V; zeros for
//           rows that attend nothing and for rows no sequence owns (padding).
//
// Design (FlashAttention-2 style, one pass, no split over the context):
//  * Packed rows: for kv head kvh with G = num_q_heads / num_kv_heads q heads, a sequence has
//    q_len * G packed rows; packed row r is (query row r / G, q head kvh * G + r % G). GQA
//    groups and query rows thus share one M dimension, so a decode token with G >= 2 still
//    fills several MMA rows, and K/V are read once per kv head.
//  * Grid: x = an upper bound of the number of row tiles (MaxTiles in the limits header),
//    y = kv head. A CTA (4 warps) takes one tile of BM packed rows of one sequence. Which
//    (sequence, tile) is decided on the device: warp 0 scans cu_q_lens in chunks of 32 with
//    warp prefix sums (find_work); CTAs past the last tile exit.
//  * The CTA's token range [lo, hi) is the union of its rows' ranges; it is streamed in
//    32-token K/V tiles with 16-byte cp.async into shared memory (double-buffered; the f32
//    d=256 kernel single-buffers to fit sm_80's shared memory). Tokens outside [lo, hi) or
//    with an invalid block id are zero-filled with shared stores, never read from memory.
//  * bf16/f16: each warp owns 16 packed rows (one m16 slab). S = Q K^T and O += P V with
//    mma.sync m16n8k16 (f32 accumulate), operands via ldmatrix (.trans for V), P taken from
//    the S accumulators. f32: each warp owns 8 packed rows; lane j computes token j's logits
//    for the 8 rows with f32 FMAs, then O += P V with lanes over head_dim.
//  * Per-element mask (causal, window, valid token); online softmax in base 2 with f32
//    statistics; a warp skips tiles outside its own rows' range. Warps own disjoint rows, so
//    each normalizes and writes its own rows: no cross-warp merge.
//  * A small kernel writes zeros to the rows no sequence owns; every owned row is written by
//    exactly one CTA of the main kernel.
//  * Hopper: on a compute capability 9.0 device, with the library built for sm_90a (the op's
//    Kernel has arch_specific=True), bf16/f16 (head_dim 64, 128, 256) run the wgmma kernel
//    of ragged_paged_attention_sm90.cuh instead of the mma.sync kernel (128 packed rows per
//    CTA in two consumer warpgroups fed by a producer warpgroup; design there).
//    XLA_KERNELS_RAGGED_WGMMA=0 in the environment switches it off ("require": fail where it
//    cannot run; read at every launch).
//  * Decode-only batches (every q_len <= 1; known only on the device) take paged_attention's
//    flash-decoding kernels instead, which split long contexts over several CTAs (this
//    kernel does not). With a workspace (Params::workspace), a one-CTA kernel first decides
//    on the device whether the batch is decode-only and writes, per query row, the context
//    length its row attends (p + 1) and a copy of its block-table row; the decode kernels
//    then run over those rows (every row has length 0, i.e. writes zeros, when the batch is
//    not decode-only), and the kernels of this file exit at once when it is. Only for calls
//    with num_tokens <= max_seqs (has_decode_path). See decode_workspace_elems() for the
//    workspace's layout.
//  * fp8 caches (f8e4m3fn, bf16/f16 queries): on an sm_90a build and a compute capability
//    9.0 device, the wgmma kernel (its producer converts the e4m3 tiles: produce_kv_fp8);
//    otherwise (or with XLA_KERNELS_RAGGED_WGMMA=0) the mma.sync kernel (kFp8) streams the
//    e4m3 bytes with cp.async into raw double-buffered staging tiles (rows of D bytes), and
//    after the stage has landed all threads convert it (cvt e4m3x2 -> f16x2, bf16 through
//    f32; exact) into one padded bf16/f16 K/V tile pair, which the unchanged
//    ldmatrix/mma.sync path then reads: one more barrier and a shared-memory round trip per
//    tile, no new fragment layouts. k_scale is folded into the logit scale and v_scale into
//    the final 1/l, so the math is that of the bf16/f16 kernel on the dequantized cache. The
//    decode path passes the fp8 caches and scales to paged_attention's Fp8MmaCore.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "../paged_attention/paged_attention.cuh"
#include "ragged_paged_attention_limits.h"
#include "xla_kernels/cuda_mma.cuh"

namespace xla_kernels::ragged_paged_attention {

// ------------------------------------------------------------------ public interface

enum class DType { kF32, kF16, kBF16 };

// Everything the kernels need; element strides describe either cache layout:
//   vllm   [num_blocks, block_size, num_kv_heads, head_dim]
//   pallas [num_kv_heads, num_blocks, block_size, head_dim]
struct Params {
  DType dtype = DType::kF32;              // queries and output
  bool fp8_cache = false;                 // caches are f8e4m3fn (dtype is kBF16 or kF16)
  const void* queries = nullptr;          // [num_tokens, num_q_heads, head_dim]
  const void* key_cache = nullptr;        // layout above
  const void* value_cache = nullptr;      // same shape and layout as key_cache
  const int32_t* kv_lens = nullptr;       // [max_seqs]
  const int32_t* block_tables = nullptr;  // [max_seqs, max_blocks_per_seq]
  const int32_t* cu_q_lens = nullptr;     // [max_seqs + 1]
  const int32_t* num_seqs = nullptr;      // [1]
  void* out = nullptr;                    // [num_tokens, num_q_heads, head_dim]
  int64_t num_tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0, max_seqs = 0, max_blocks_per_seq = 0;
  int64_t stride_block = 0, stride_slot = 0, stride_head = 0;  // elements
  float scale = 1.f, softcap = 0.f;
  float k_scale = 1.f, v_scale = 1.f;  // fp8 caches: key = stored * k_scale, value likewise
  int64_t sliding_window = 0;
  float* workspace = nullptr;  // null: no decode path; else decode_workspace_elems() floats
  int64_t workspace_elems = 0;
};

// Launches the kernels on `stream`; returns "" on success, else an error message.
inline std::string launch_ragged_paged_attention(cudaStream_t stream, const Params& p);

// f32 elements of workspace the decode path needs: paged_attention's flash-decoding
// partials for num_tokens rows, then int32 areas: block-table rows [num_tokens,
// max_blocks_per_seq], row lengths [num_tokens], row sequences [num_tokens], the flag [1].
// The path exists only when num_tokens <= max_seqs (a decode batch needs no more rows than
// sequence slots; otherwise the decode kernels' launch over every row would cost more than
// it saves on prefill-sized calls); then 1 element (unused) is enough.
inline bool has_decode_path(int64_t num_tokens, int64_t max_seqs) {
  return num_tokens <= max_seqs;
}

inline int64_t decode_workspace_elems(int64_t num_tokens, int64_t max_seqs, int64_t num_q_heads,
                                      int64_t head_dim, int64_t max_blocks_per_seq,
                                      int64_t block_size) {
  if (!has_decode_path(num_tokens, max_seqs)) return 1;
  return paged_attention::WorkspaceElems(num_tokens, num_q_heads, head_dim,
                                         max_blocks_per_seq * block_size) +
         num_tokens * (max_blocks_per_seq + 2) + 1;
}

// ------------------------------------------------------------------ device helpers

namespace detail {

using namespace ::xla_kernels::cuda_mma;  // the shared mma/cp.async helpers

constexpr int kW = static_cast<int>(kWarps);
constexpr int kThreads = kW * 32;
constexpr int NK = static_cast<int>(kKvTile);
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kDead = INT_MIN / 2;  // position of a row that attends nothing
static_assert(NK == 32, "the f32 path maps one token per lane");

struct Args {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* kv_lens;
  const int32_t* bt;
  const int32_t* cu;
  const int32_t* num_seqs;
  void* out;
  const int32_t* skip;  // non-null and non-zero on the device: the decode path did the work
  int T, Hq, Hkv, G;
  int max_seqs, num_blocks, max_blocks, log2_bs, capacity;
  int window;          // 0: none
  int64_t sb, ss, sh;  // element strides: block, slot, kv head
  float qk_scale;      // scale*log2e, or scale/softcap with a softcap
  float cap_mul;       // softcap*log2e, or 0 without a softcap
  float out_scale;     // fp8 caches: v_scale, applied with the final 1/l
};

// The (sequence, tile) a CTA works on.
struct Work {
  int s;       // sequence, or -1: no work
  int tile;    // tile index within the sequence
  int start;   // first query row of the sequence
  int q_len;
  int kv_len;  // clamped
};

__device__ __forceinline__ int clampi(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Row tiles of a sequence of q_len query tokens: its q_len * G packed rows, tile_rows per
// tile.
__device__ __forceinline__ int row_tiles(const Args& a, int q_len, int tile_rows) {
  return static_cast<int>((static_cast<int64_t>(q_len) * a.G + tile_rows - 1) / tile_rows);
}

// Warp 0 of a CTA: the (sequence, tile) of tile number b, with tile_rows packed rows per
// tile. Walks the sequences 32 at a time: lane l takes sequence base + l; warp prefix max of
// the clamped row ends (SeqView's running maximum) and prefix sum of the tile counts.
__device__ __forceinline__ void find_work(const Args& a, int b, int tile_rows, Work* w,
                                          int lane) {
  const int n = clampi(__ldg(a.num_seqs), 0, a.max_seqs);
  int carry_end = clampi(__ldg(a.cu), 0, a.T);
  int carry_tiles = 0;
  if (lane == 0) w->s = -1;
  __syncwarp();
  for (int base = 0; base < n; base += 32) {
    const int s = base + lane;
    // s < n <= max_seqs: cu[s + 1] and kv_lens[s] are in bounds.
    int end = s < n ? clampi(__ldg(a.cu + s + 1), 0, a.T) : 0;
    end = max(end, carry_end);
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int o = __shfl_up_sync(kFull, end, off);
      if (lane >= off) end = max(end, o);
    }
    int start = __shfl_up_sync(kFull, end, 1);
    if (lane == 0) start = carry_end;
    const int q_len = end - start;
    const int tiles = s < n ? row_tiles(a, q_len, tile_rows) : 0;
    int incl = tiles;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int o = __shfl_up_sync(kFull, incl, off);
      if (lane >= off) incl += o;
    }
    const int first = carry_tiles + incl - tiles;
    const bool hit = tiles > 0 && b >= first && b < first + tiles;
    if (__ballot_sync(kFull, hit) != 0u) {
      if (hit) {
        w->s = s;
        w->tile = b - first;
        w->start = start;
        w->q_len = q_len;
        w->kv_len = clampi(__ldg(a.kv_lens + s), 0, a.capacity);
      }
      return;
    }
    carry_end = __shfl_sync(kFull, end, 31);
    carry_tiles += __shfl_sync(kFull, incl, 31);
  }
}

// Scale, optional softcap, base-2 units.
__device__ __forceinline__ float logit(float dot, const Args& a) {
  return a.cap_mul > 0.f ? a.cap_mul * tanhf(dot * a.qk_scale) : dot * a.qk_scale;
}


// The rows of a tile, as positions.
struct TileRows {
  int r0, r_end;  // packed rows [r0, r_end) of the sequence
  int p0;         // position of query row 0 (kv_len - q_len; may be negative)
};

// The rows of work w's tile, `rows` packed rows per tile (every kernel's CTA tile).
__device__ __forceinline__ TileRows tile_rows(const Args& a, const Work& w, int rows) {
  TileRows tr;
  tr.r0 = w.tile * rows;
  tr.r_end = min(w.q_len * a.G, tr.r0 + rows);
  tr.p0 = w.kv_len - w.q_len;
  return tr;
}

// Position of packed row pr (kDead past the tile's rows) and the first token it attends.
__device__ __forceinline__ void row_range(const Args& a, const TileRows& tr, int pr, int* pos,
                                          int* lo) {
  if (pr >= tr.r_end) {
    *pos = kDead;
    *lo = 0;
    return;
  }
  *pos = tr.p0 + pr / a.G;
  *lo = a.window > 0 ? *pos - a.window + 1 : 0;
}

// Token range [lo, hi) attended by packed rows [ra, rb) (rb > ra, rows all in the tile).
__device__ __forceinline__ void token_range(const Args& a, const TileRows& tr, int ra, int rb,
                                            int* lo, int* hi) {
  const int p_first = tr.p0 + ra / a.G, p_last = tr.p0 + (rb - 1) / a.G;
  *hi = p_last + 1;  // <= kv_len
  *lo = a.window > 0 ? max(0, p_first - a.window + 1) : 0;
}

// Streams tokens [t0, t0 + NK) of sequence s, kv head kvh, into shared memory (rows of D
// elements, RS apart). Tokens outside [lo, hi) or with an invalid block id are zero-filled and
// never read; ok[j] records which rows hold a token. All threads of the CTA take part.
template <typename T, int D, int RS>
__device__ __forceinline__ void load_kv_tile(T* ks, T* vs, int* ok, const Args& a, int s,
                                             int kvh, int t0, int lo, int hi, int tid) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kCpr = D / kVec;           // 16-byte chunks per row
  constexpr int kTpt = kThreads / NK;      // threads per token (4)
  static_assert(kCpr % kTpt == 0, "row does not split over the token's threads");
  const int j = tid / kTpt, part = tid % kTpt;
  const int pos = t0 + j;
  bool valid = pos >= lo && pos < hi;
  int64_t off = 0;
  if (valid) {
    // pos < hi <= kv_len <= capacity: the block_tables read is in bounds.
    const int blk = __ldg(a.bt + static_cast<int64_t>(s) * a.max_blocks + (pos >> a.log2_bs));
    valid = blk >= 0 && blk < a.num_blocks;  // checked before any address is formed
    if (valid) {
      off = static_cast<int64_t>(blk) * a.sb +
            static_cast<int64_t>(pos & ((1 << a.log2_bs) - 1)) * a.ss +
            static_cast<int64_t>(kvh) * a.sh;
    }
  }
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
#pragma unroll
  for (int i = 0; i < kCpr / kTpt; ++i) {
    const int col = (part + kTpt * i) * kVec;
    T* kd = ks + j * RS + col;
    T* vd = vs + j * RS + col;
    if (valid) {
      cp_async16(kd, kc + off + col);
      cp_async16(vd, vc + off + col);
    } else {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
    }
  }
  if (part == 0) ok[j] = valid ? 1 : 0;
}

// Copies the tile's query rows (packed rows r0 .. r0 + BM - 1 of kv head kvh) to shared
// memory as T (QT = T) or f32 (QT = float); rows past the tile are zeros.
template <typename T, typename QT, int D, int RS, int BM>
__device__ __forceinline__ void stage_q(QT* qs, const Args& a, const Work& w, const TileRows& tr,
                                        int kvh, int tid) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kCpr = D / kVec;
  static_assert(std::is_same_v<QT, T>, "queries are staged in their own dtype");
  const T* qg = static_cast<const T*>(a.q);
  for (int c = tid; c < BM * kCpr; c += kThreads) {
    const int r = c / kCpr, col = (c % kCpr) * kVec;
    const int pr = tr.r0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (pr < tr.r_end) {
      const int64_t row = static_cast<int64_t>(w.start) + pr / a.G;
      const int64_t head = static_cast<int64_t>(kvh) * a.G + pr % a.G;
      v = *reinterpret_cast<const uint4*>(qg + (row * a.Hq + head) * D + col);
    }
    *reinterpret_cast<uint4*>(qs + r * RS + col) = v;
  }
}

// Element offset of packed row pr's output row.
__device__ __forceinline__ int64_t out_offset(const Args& a, const Work& w, int kvh, int pr,
                                              int D) {
  const int64_t row = static_cast<int64_t>(w.start) + pr / a.G;
  const int64_t head = static_cast<int64_t>(kvh) * a.G + pr % a.G;
  return (row * a.Hq + head) * D;
}

// ------------------------------------------------------------------ bf16/f16: tensor cores

// Shared memory: Q, then kStages (K, V) tile pairs of T (bf16/f16 caches); with fp8 caches
// (kFp8) Q, one converted (K, V) pair of T, then kStages raw (K, V) pairs of e4m3 bytes.
template <typename T, int D, bool kFp8 = false>
struct MmaConfig {
  static constexpr int RW = static_cast<int>(kRowsPerWarpMma);  // packed rows per warp (16)
  static constexpr int BM = kW * RW;                            // packed rows per CTA
  static constexpr int RS = D + 8;                              // +16 bytes: conflict-free ldmatrix
  static constexpr int kStages = 2;
  static constexpr int kQElems = BM * RS;
  static constexpr int kTileElems = NK * RS;
  static constexpr int kRawTileBytes = NK * D;  // fp8: a raw e4m3 tile, rows of D bytes
  static constexpr int kBytes =
      kFp8 ? (kQElems + 2 * kTileElems) * static_cast<int>(sizeof(T)) +
                 kStages * 2 * kRawTileBytes
           : (kQElems + kStages * 2 * kTileElems) * static_cast<int>(sizeof(T));
};

// fp8: 16 e4m3 values (16 bytes of shared memory) -> 16 T values at dst (32 bytes). Exact.
template <typename T>
__device__ __forceinline__ void e4m3x16_to(T* dst, const uint8_t* src) {
  using ::xla_kernels::paged_attention::detail::e4m3x2_to;
  const uint4 x = *reinterpret_cast<const uint4*>(src);
  const uint4 lo = make_uint4(e4m3x2_to<T>(x.x), e4m3x2_to<T>(x.x >> 16), e4m3x2_to<T>(x.y),
                              e4m3x2_to<T>(x.y >> 16));
  const uint4 hi = make_uint4(e4m3x2_to<T>(x.z), e4m3x2_to<T>(x.z >> 16), e4m3x2_to<T>(x.w),
                              e4m3x2_to<T>(x.w >> 16));
  *reinterpret_cast<uint4*>(dst) = lo;
  *reinterpret_cast<uint4*>(dst + 8) = hi;
}

// fp8: a staged raw (K, V) tile pair (NK rows of D bytes each) -> the padded T pair (rows RS
// elements apart) that the MMA loop reads. All threads of the CTA take part; zero-filled
// (masked) rows convert to zeros.
template <typename T, int D, int RS>
__device__ __forceinline__ void convert_kv_tile(T* ks, T* vs, const uint8_t* kr,
                                                const uint8_t* vr, int tid) {
  constexpr int kCpr = D / 16;  // 16-byte e4m3 chunks per row
  constexpr int kChunks = NK * kCpr;
  static_assert(kChunks % kThreads == 0, "a tile's chunks do not split over the CTA");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kCpr, col = (c % kCpr) * 16;
    e4m3x16_to<T>(ks + r * RS + col, kr + r * D + col);
    e4m3x16_to<T>(vs + r * RS + col, vr + r * D + col);
  }
}

template <typename T, int D, bool kFp8 = false>
__global__ void __launch_bounds__(kThreads) ragged_mma_kernel(const Args a) {
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  using C = MmaConfig<T, D, kFp8>;
  constexpr int RW = C::RW, BM = C::BM, RS = C::RS, KT = D / 16, DT = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Work work;
  __shared__ int tok_ok[C::kStages][NK];
  T* qs = reinterpret_cast<T*>(smem);
  // bf16/f16: stage st has K at tile 2*st, V at 2*st + 1. fp8: K at tile 0, V at tile 1
  // (converted), raw stage st at raw + 2*st*kRawTileBytes (K), + kRawTileBytes (V).
  T* kv_base = qs + C::kQElems;
  uint8_t* raw = reinterpret_cast<uint8_t*>(kv_base + 2 * C::kTileElems);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y;
  if (warp == 0) find_work(a, blockIdx.x, BM, &work, lane);
  __syncthreads();
  const Work w = work;
  if (w.s < 0) return;  // uniform over the CTA

  const TileRows tr = tile_rows(a, w, BM);
  int lo, hi;
  token_range(a, tr, tr.r0, tr.r_end, &lo, &hi);
  const int ntiles = hi > lo ? (hi - lo + NK - 1) / NK : 0;

  if (ntiles > 0) {
    if constexpr (kFp8) {
      load_kv_tile<uint8_t, D, D>(raw, raw + C::kRawTileBytes, tok_ok[0], a, w.s, kvh, lo, lo,
                                  hi, tid);
    } else {
      load_kv_tile<T, D, RS>(kv_base, kv_base + C::kTileElems, tok_ok[0], a, w.s, kvh, lo, lo,
                             hi, tid);
    }
  }
  cp_async_commit();
  stage_q<T, T, D, RS, BM>(qs, a, w, tr, kvh, tid);

  // This warp's rows and token range.
  const int wr0 = tr.r0 + warp * RW;
  const bool live = wr0 < tr.r_end;
  int wlo = 0, whi = 0;
  if (live) token_range(a, tr, wr0, min(tr.r_end, wr0 + RW), &wlo, &whi);
  const int g0 = lane >> 2, tig = lane & 3, mtx = lane >> 3, r8 = lane & 7;
  int pos0, lo0, pos1, lo1;
  row_range(a, tr, wr0 + g0, &pos0, &lo0);
  row_range(a, tr, wr0 + g0 + 8, &pos1, &lo1);

  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    // Prefetch the next tile into the other stage (last read in iteration it - 1, which
    // ended with a barrier).
    if (it + 1 < ntiles) {
      if constexpr (kFp8) {
        uint8_t* kn = raw + 2 * ((it + 1) & 1) * C::kRawTileBytes;
        load_kv_tile<uint8_t, D, D>(kn, kn + C::kRawTileBytes, tok_ok[(it + 1) & 1], a, w.s,
                                    kvh, lo + (it + 1) * NK, lo, hi, tid);
      } else {
        T* kn = kv_base + 2 * ((it + 1) & 1) * C::kTileElems;
        load_kv_tile<T, D, RS>(kn, kn + C::kTileElems, tok_ok[(it + 1) & 1], a, w.s, kvh,
                               lo + (it + 1) * NK, lo, hi, tid);
      }
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int st = it & 1;
    const int t0 = lo + it * NK;
    if constexpr (kFp8) {
      // The converted pair was last read in iteration it - 1 (which ended with a barrier);
      // this raw stage is overwritten by the prefetch of iteration it + 1, after the barrier
      // that ends this one.
      const uint8_t* kr = raw + 2 * st * C::kRawTileBytes;
      convert_kv_tile<T, D, RS>(kv_base, kv_base + C::kTileElems, kr, kr + C::kRawTileBytes,
                                tid);
      __syncthreads();
    }
    if (live && t0 < whi && t0 + NK > wlo) {
      const T* ks = kv_base + (kFp8 ? 0 : 2 * st * C::kTileElems);
      const T* vs = ks + C::kTileElems;
      // S = Q K^T: rows = this warp's 16 packed rows, columns = the tile's 32 tokens.
      float sc[NK / 8][4];
#pragma unroll
      for (int i = 0; i < NK / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        uint32_t af[4];
        ldsm_x4(af, qs + (warp * RW + (mtx & 1) * 8 + r8) * RS + kk * 16 + (mtx >> 1) * 8);
#pragma unroll
        for (int j = 0; j < NK / 16; ++j) {
          uint32_t b[4];
          ldsm_x4(b, ks + (j * 16 + (mtx >> 1) * 8 + r8) * RS + kk * 16 + (mtx & 1) * 8);
          mma16816<T>(sc[2 * j], af, b[0], b[1]);
          mma16816<T>(sc[2 * j + 1], af, b[2], b[3]);
        }
      }
      // Logits and mask: accumulator (i, e) is row g0 (e < 2) or g0 + 8 (e >= 2), token
      // column i * 8 + tig * 2 + (e & 1).
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int i = 0; i < NK / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = i * 8 + tig * 2 + e;
          const int t = t0 + col;
          const bool ok = tok_ok[st][col] != 0;
          sc[i][e] = (ok && t <= pos0 && t >= lo0) ? logit(sc[i][e], a) : -INFINITY;
          sc[i][e + 2] = (ok && t <= pos1 && t >= lo1) ? logit(sc[i][e + 2], a) : -INFINITY;
          mx0 = fmaxf(mx0, sc[i][e]);
          mx1 = fmaxf(mx1, sc[i][e + 2]);
        }
      }
      // A row's 32 columns live in the 4 lanes of its quad.
      mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float b0 = safe_max(mn0), b1 = safe_max(mn1);
      const float al0 = exp2f(m0 - b0), al1 = exp2f(m1 - b1);
      m0 = mn0;
      m1 = mn1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int i = 0; i < NK / 8; ++i) {
        sc[i][0] = exp2f(sc[i][0] - b0);
        sc[i][1] = exp2f(sc[i][1] - b0);
        sc[i][2] = exp2f(sc[i][2] - b1);
        sc[i][3] = exp2f(sc[i][3] - b1);
        rs0 += sc[i][0] + sc[i][1];
        rs1 += sc[i][2] + sc[i][3];
      }
      l0 = l0 * al0 + rs0;  // per-lane partial sums; the quad is summed at the end
      l1 = l1 * al1 + rs1;
#pragma unroll
      for (int i = 0; i < DT; ++i) {
        o[i][0] *= al0;
        o[i][1] *= al0;
        o[i][2] *= al1;
        o[i][3] *= al1;
      }
      // O += P V: P (A operand, 16 rows x 16 tokens per k-step) from the S accumulators.
#pragma unroll
      for (int j = 0; j < NK / 16; ++j) {
        uint32_t pa[4];
        accumulators_to_a<T>(sc[2 * j], sc[2 * j + 1], pa);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldsm_x4_trans(b, vs + (j * 16 + (mtx & 1) * 8 + r8) * RS + dp * 16 + (mtx >> 1) * 8);
          mma16816<T>(o[2 * dp], pa, b[0], b[1]);
          mma16816<T>(o[2 * dp + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the stage is overwritten by the prefetch of iteration it + 1
  }
  cp_async_wait<0>();

  if (!live) return;
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  if constexpr (kFp8) {  // v_scale
    inv0 *= a.out_scale;
    inv1 *= a.out_scale;
  }
  const int pr0 = wr0 + g0, pr1 = wr0 + g0 + 8;
  T* out = static_cast<T*>(a.out);
  if (pr0 < tr.r_end) {
    uint32_t* o32 = reinterpret_cast<uint32_t*>(out + out_offset(a, w, kvh, pr0, D));
#pragma unroll
    for (int i = 0; i < DT; ++i) o32[(i * 8 + tig * 2) / 2] = pack2<T>(o[i][0] * inv0, o[i][1] * inv0);
  }
  if (pr1 < tr.r_end) {
    uint32_t* o32 = reinterpret_cast<uint32_t*>(out + out_offset(a, w, kvh, pr1, D));
#pragma unroll
    for (int i = 0; i < DT; ++i) o32[(i * 8 + tig * 2) / 2] = pack2<T>(o[i][2] * inv1, o[i][3] * inv1);
  }
}

// ------------------------------------------------------------------ f32: CUDA cores

template <int D>
struct SimtConfig {
  static constexpr int RW = static_cast<int>(kRowsPerWarpSimt);  // packed rows per warp (8)
  static constexpr int BM = kW * RW;
  static constexpr int RS = D + 4;  // 16-byte aligned rows; lanes' float4 reads hit distinct banks
  static constexpr int kStages = D <= 128 ? 2 : 1;  // d 256 single-buffers (sm_80: 163 KB)
  static constexpr int DPL = D / 32;                // output dims per lane
  static constexpr int kQElems = BM * RS;
  static constexpr int kTileElems = NK * RS;
  static constexpr int kPElems = kW * RW * NK;      // per warp: [RW][NK] probabilities
  static constexpr int kBytes = (kQElems + kStages * 2 * kTileElems + kPElems) * 4;
};

template <int D>
__global__ void __launch_bounds__(kThreads) ragged_simt_kernel(const Args a) {
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  using C = SimtConfig<D>;
  constexpr int RW = C::RW, BM = C::BM, RS = C::RS, DPL = C::DPL, kStages = C::kStages;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Work work;
  __shared__ int tok_ok[kStages][NK];
  float* qs = reinterpret_cast<float*>(smem);
  float* kv_base = qs + C::kQElems;
  float* ps = kv_base + kStages * 2 * C::kTileElems;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y;
  if (warp == 0) find_work(a, blockIdx.x, BM, &work, lane);
  __syncthreads();
  const Work w = work;
  if (w.s < 0) return;

  const TileRows tr = tile_rows(a, w, BM);
  int lo, hi;
  token_range(a, tr, tr.r0, tr.r_end, &lo, &hi);
  const int ntiles = hi > lo ? (hi - lo + NK - 1) / NK : 0;

  if constexpr (kStages == 2) {
    if (ntiles > 0)
      load_kv_tile<float, D, RS>(kv_base, kv_base + C::kTileElems, tok_ok[0], a, w.s, kvh, lo,
                                 lo, hi, tid);
  }
  cp_async_commit();
  stage_q<float, float, D, RS, BM>(qs, a, w, tr, kvh, tid);

  const int wr0 = tr.r0 + warp * RW;
  const bool live = wr0 < tr.r_end;
  int wlo = 0, whi = 0;
  if (live) token_range(a, tr, wr0, min(tr.r_end, wr0 + RW), &wlo, &whi);
  int pos[RW], rlo[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) row_range(a, tr, wr0 + r, &pos[r], &rlo[r]);
  float* pw = ps + warp * RW * NK;

  float o[RW][DPL], m[RW], lp[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    m[r] = -INFINITY;
    lp[r] = 0.f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) o[r][e] = 0.f;
  }

  for (int it = 0; it < ntiles; ++it) {
    const int st = kStages == 2 ? (it & 1) : 0;
    if constexpr (kStages == 2) {
      if (it + 1 < ntiles) {
        float* kn = kv_base + 2 * ((it + 1) & 1) * C::kTileElems;
        load_kv_tile<float, D, RS>(kn, kn + C::kTileElems, tok_ok[(it + 1) % kStages], a, w.s, kvh,
                                   lo + (it + 1) * NK, lo, hi, tid);
      }
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      load_kv_tile<float, D, RS>(kv_base, kv_base + C::kTileElems, tok_ok[0], a, w.s, kvh,
                                 lo + it * NK, lo, hi, tid);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();
    const int t0 = lo + it * NK;
    if (live && t0 < whi && t0 + NK > wlo) {
      const float* ks = kv_base + 2 * st * C::kTileElems;
      const float* vs = ks + C::kTileElems;
      // Lane j: logits of token t0 + j for the warp's RW rows.
      float s[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) s[r] = 0.f;
#pragma unroll 4
      for (int d = 0; d < D; d += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(ks + lane * RS + d);
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const float4 q4 = *reinterpret_cast<const float4*>(qs + (warp * RW + r) * RS + d);
          s[r] = fmaf(q4.x, k4.x, s[r]);
          s[r] = fmaf(q4.y, k4.y, s[r]);
          s[r] = fmaf(q4.z, k4.z, s[r]);
          s[r] = fmaf(q4.w, k4.w, s[r]);
        }
      }
      const int t = t0 + lane;
      const bool ok = tok_ok[st][lane] != 0;
      float al[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        const float x = (ok && t <= pos[r] && t >= rlo[r]) ? logit(s[r], a) : -INFINITY;
        float mx = x;
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
        const float mn = fmaxf(m[r], mx);
        const float b = safe_max(mn);
        al[r] = exp2f(m[r] - b);
        m[r] = mn;
        const float p = exp2f(x - b);
        lp[r] = lp[r] * al[r] + p;
        pw[r * NK + lane] = p;
      }
      __syncwarp();
#pragma unroll
      for (int r = 0; r < RW; ++r) {
#pragma unroll
        for (int e = 0; e < DPL; ++e) o[r][e] *= al[r];
      }
#pragma unroll 4
      for (int j = 0; j < NK; ++j) {
        float vf[DPL];
#pragma unroll
        for (int e = 0; e < DPL; e += 2) {
          const float2 v2 = *reinterpret_cast<const float2*>(vs + j * RS + lane * DPL + e);
          vf[e] = v2.x;
          vf[e + 1] = v2.y;
        }
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const float p = pw[r * NK + j];
#pragma unroll
          for (int e = 0; e < DPL; ++e) o[r][e] = fmaf(p, vf[e], o[r][e]);
        }
      }
      __syncwarp();  // pw is rewritten by the next tile
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  if (!live) return;
  float* out = static_cast<float*>(a.out);
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    float l = lp[r];
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) l += __shfl_xor_sync(kFull, l, off);
    const int pr = wr0 + r;
    if (pr >= tr.r_end) continue;  // uniform over the warp
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float* orow = out + out_offset(a, w, kvh, pr, D) + lane * DPL;
#pragma unroll
    for (int e = 0; e < DPL; ++e) orow[e] = o[r][e] * inv;
  }
}

// ------------------------------------------------------------------ padding rows

constexpr int kZeroRows = 16;  // output rows per CTA of the zero kernel

// Zeros every row no sequence owns: rows < c_0 and rows >= c_n.
__global__ void __launch_bounds__(kThreads) ragged_zero_kernel(const Args a, int row_bytes) {
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  __shared__ int red[kW];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n = clampi(__ldg(a.num_seqs), 0, a.max_seqs);
  int mx = INT_MIN;
  for (int j = tid; j <= n; j += kThreads) mx = max(mx, __ldg(a.cu + j));  // j <= n <= max_seqs
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) mx = max(mx, __shfl_xor_sync(kFull, mx, off));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
#pragma unroll
  for (int i = 1; i < kW; ++i) mx = max(mx, red[i]);
  const int c0 = clampi(__ldg(a.cu), 0, a.T);
  const int cn = clampi(mx, 0, a.T);  // the running maximum at j = n
  const int row0 = blockIdx.x * kZeroRows;
  const int chunks = row_bytes / 16;
  unsigned char* out = static_cast<unsigned char*>(a.out);
  for (int r = row0; r < min(row0 + kZeroRows, a.T); ++r) {
    if (r >= c0 && r < cn) continue;
    uint4* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(r) * row_bytes);
    for (int c = tid; c < chunks; c += kThreads) dst[c] = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace detail
}  // namespace xla_kernels::ragged_paged_attention

// The Hopper (sm_90a, wgmma) prefill kernel; it uses the helpers above.
#include "ragged_paged_attention_sm90.cuh"

namespace xla_kernels::ragged_paged_attention {
namespace detail {

// ------------------------------------------------------------------ host side

inline std::string cuda_error(const char* what, cudaError_t e) {
  return std::string("ragged_paged_attention: ") + what + ": " + cudaGetErrorName(e) + " (" +
         cudaGetErrorString(e) + ")";
}

// Raises a kernel's dynamic shared-memory limit once per (kernel, device): function
// attributes are per device context.
inline std::string prepare_kernel(const void* kernel, int smem, int device,
                                  int threads = kThreads) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> done;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  if (done.count(key)) return "";
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return cuda_error("cudaFuncSetAttribute", e);
  int occ = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem);
  if (e != cudaSuccess) return cuda_error("cudaOccupancyMaxActiveBlocksPerMultiprocessor", e);
  if (occ < 1) {
    return "ragged_paged_attention: the kernel does not fit on this GPU (" +
           std::to_string(smem) + " bytes of shared memory per CTA)";
  }
  done[key] = true;
  return "";
}

// ------------------------------------------------------------------ the decode path

constexpr int kPrepThreads = 1024;

// One CTA. *decode = 1 when every used sequence has q_len <= 1 (SeqView's rules); then row
// c_s of a sequence with q_len 1 gets length L_s (it sits at p = L_s - 1) and sequence s, and
// every other row length 0. When the batch is not decode-only every row gets length 0.
__global__ void __launch_bounds__(kPrepThreads) decode_prep_kernel(const Args a, int32_t* lens,
                                                                   int32_t* row_seq,
                                                                   int32_t* decode) {
  __shared__ int scan[kPrepThreads];
  __shared__ int carry_end;
  const int tid = threadIdx.x;
  for (int r = tid; r < a.T; r += kPrepThreads) lens[r] = 0;
  const int n = clampi(__ldg(a.num_seqs), 0, a.max_seqs);
  if (tid == 0) carry_end = clampi(__ldg(a.cu), 0, a.T);
  __syncthreads();
  int ok = 1;
  for (int base = 0; base < n; base += kPrepThreads) {
    const int s = base + tid;
    // s < n <= max_seqs: cu[s + 1] and kv_lens[s] are in bounds.
    scan[tid] = s < n ? clampi(__ldg(a.cu + s + 1), 0, a.T) : 0;
    __syncthreads();
    for (int off = 1; off < kPrepThreads; off <<= 1) {  // inclusive prefix maximum
      const int v = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] = max(scan[tid], v);
      __syncthreads();
    }
    const int carry = carry_end;
    const int start = tid == 0 ? carry : max(carry, scan[tid - 1]);
    const int end = max(carry, scan[tid]);
    __syncthreads();  // every thread has read carry_end
    if (s < n) {
      const int q_len = end - start;
      if (q_len > 1) ok = 0;
      if (q_len == 1) {
        lens[start] = clampi(__ldg(a.kv_lens + s), 0, a.capacity);
        row_seq[start] = s;
      }
    }
    if (tid == kPrepThreads - 1) carry_end = end;
    __syncthreads();
  }
  const int all = __syncthreads_and(ok);
  if (!all) {
    for (int r = tid; r < a.T; r += kPrepThreads) lens[r] = 0;
  }
  if (tid == 0) *decode = all;
}

// Copies each attending row's block-table row (only the blocks its length covers: the decode
// kernel reads no other entry).
__global__ void __launch_bounds__(kThreads) decode_tables_kernel(const Args a,
                                                                 const int32_t* lens,
                                                                 const int32_t* row_seq,
                                                                 int32_t* tables) {
  for (int r = blockIdx.x; r < a.T; r += gridDim.x) {
    const int len = __ldg(lens + r);
    if (len <= 0) continue;
    const int s = __ldg(row_seq + r);
    const int blocks = min((len + (1 << a.log2_bs) - 1) >> a.log2_bs, a.max_blocks);
    const int32_t* from = a.bt + static_cast<int64_t>(s) * a.max_blocks;
    int32_t* to = tables + static_cast<int64_t>(r) * a.max_blocks;
    for (int j = threadIdx.x; j < blocks; j += kThreads) to[j] = __ldg(from + j);
  }
}

// Launches the decode path (prep, tables, paged_attention's kernels) and points a.skip at
// the flag, so that the kernels launched after it exit when it did the work.
inline std::string launch_decode_path(cudaStream_t stream, const Params& p, Args* a) {
  const int64_t partials = paged_attention::WorkspaceElems(
      p.num_tokens, p.num_q_heads, p.head_dim, p.max_blocks_per_seq * p.block_size);
  const int64_t need = decode_workspace_elems(p.num_tokens, p.max_seqs, p.num_q_heads,
                                              p.head_dim, p.max_blocks_per_seq, p.block_size);
  if (p.workspace_elems < need)
    return "ragged_paged_attention: the workspace has " + std::to_string(p.workspace_elems) +
           " elements, the decode path needs " + std::to_string(need);
  int32_t* tables = reinterpret_cast<int32_t*>(p.workspace + partials);
  int32_t* lens = tables + p.num_tokens * p.max_blocks_per_seq;
  int32_t* row_seq = lens + p.num_tokens;
  int32_t* decode = row_seq + p.num_tokens;
  decode_prep_kernel<<<1, kPrepThreads, 0, stream>>>(*a, lens, row_seq, decode);
  const int64_t grid = p.num_tokens < 1024 ? p.num_tokens : 1024;
  decode_tables_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(*a, lens, row_seq,
                                                                              tables);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_error("launching the decode-path kernels", e);
  paged_attention::Params d;
  d.dtype = p.dtype == DType::kBF16  ? paged_attention::DType::kBF16
            : p.dtype == DType::kF16 ? paged_attention::DType::kF16
                                     : paged_attention::DType::kF32;
  d.fp8_cache = p.fp8_cache;
  d.k_scale = p.k_scale;
  d.v_scale = p.v_scale;
  d.query = p.queries;
  d.key_cache = p.key_cache;
  d.value_cache = p.value_cache;
  d.block_tables = tables;
  d.seq_lens = lens;
  d.out = p.out;
  d.workspace = p.workspace;
  d.workspace_elems = partials;
  d.num_seqs = p.num_tokens;
  d.num_q_heads = p.num_q_heads;
  d.num_kv_heads = p.num_kv_heads;
  d.head_dim = p.head_dim;
  d.num_blocks = p.num_blocks;
  d.block_size = p.block_size;
  d.max_blocks_per_seq = p.max_blocks_per_seq;
  d.stride_block = p.stride_block;
  d.stride_slot = p.stride_slot;
  d.stride_head = p.stride_head;
  d.scale = p.scale;
  d.softcap = p.softcap;
  d.sliding_window = p.sliding_window;
  const std::string err = paged_attention::launch_paged_attention(stream, d);
  if (!err.empty()) return "ragged_paged_attention's decode path: " + err;
  a->skip = decode;
  return "";
}

template <typename Kernel>
inline std::string launch_main(cudaStream_t stream, const Params& p, const Args& a, Kernel kernel,
                               int smem, int tile_rows, int threads = kThreads) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  std::string err =
      prepare_kernel(reinterpret_cast<const void*>(kernel), smem, device, threads);
  if (!err.empty()) return err;
  const int64_t tiles = MaxTiles(p.num_tokens, p.num_q_heads / p.num_kv_heads, p.max_seqs,
                                 tile_rows);
  if (tiles > INT_MAX || p.num_kv_heads > 65535)
    return "ragged_paged_attention: problem too large for one launch";
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.num_kv_heads));
  kernel<<<grid, threads, smem, stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_error("launching the main kernel", e);
  return "";
}

// XLA_KERNELS_RAGGED_WGMMA in the environment, read at every launch: "0" never takes the
// wgmma kernel (A/B checks against the mma.sync kernel); "require" makes a call that the
// wgmma kernel should serve (bf16/f16, any head_dim) fail when it cannot (not an sm_90a
// build, not a 9.0 device), so tests know which kernel ran; unset or anything else: use it
// when possible.
enum class WgmmaMode { kOff, kAuto, kRequire };
inline WgmmaMode wgmma_mode_from_env() {
  const char* v = std::getenv("XLA_KERNELS_RAGGED_WGMMA");
  if (v == nullptr) return WgmmaMode::kAuto;
  const std::string s(v);
  return s == "0" ? WgmmaMode::kOff : s == "require" ? WgmmaMode::kRequire : WgmmaMode::kAuto;
}

// Whether `kernel` (a ragged_wgmma_kernel) can run on `device`: compute capability 9.0 and
// the loaded binary is the sm_90a build, which alone has static shared memory (the other
// builds compile the kernel to an empty body). Cached per (kernel, device).
inline bool wgmma_kernel_usable(const void* kernel, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  int major = 0, minor = 0;
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) ==
                cudaSuccess &&
            major == 9 && minor == 0;
  if (ok) {
    cudaFuncAttributes attr{};
    ok = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
         attr.sharedSizeBytes >= sizeof(Work);
  }
  cudaGetLastError();  // a failed query is "not usable", not a launch error
  known[key] = ok;
  return ok;
}

// K/V tile length of the wgmma kernel at head_dim D on bf16/f16 caches: 128 tokens at 64
// and 128, 64 at 256 (O leaves no registers for 128). Measured on the H200 with ping-pong
// (PERFORMANCE.md), TFLOP/s at prefill 4 x 4096: d 64 310 vs 282, d 128 415-426 (with 240
// consumer registers) vs 401-410 (64-token tiles without ping-pong, the faster there).
// XLA_KERNELS_RAGGED_WGMMA_TILE=64 or =128 in the environment picks one at head_dim 64 and
// 128 (read at every launch; for A/B checks).
template <int D>
inline int wgmma_tile() {
  if constexpr (D == 256) return 64;
  const char* v = std::getenv("XLA_KERNELS_RAGGED_WGMMA_TILE");
  if (v != nullptr && std::string(v) == "64") return 64;
  return 128;
}

// The wgmma kernel with N-token tiles when it applies (see ragged_paged_attention_sm90.cuh);
// *used = false leaves the choice to the caller.
template <typename T, int D, int N, bool kFp8 = false>
inline std::string try_launch_wgmma_tile(cudaStream_t stream, const Params& p, const Args& a,
                                         WgmmaMode mode, bool* used) {
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  const auto kernel = ragged_wgmma_kernel<T, D, N, kFp8>;
  if (!wgmma_kernel_usable(reinterpret_cast<const void*>(kernel), device)) {
    return mode == WgmmaMode::kRequire
               ? "ragged_paged_attention: XLA_KERNELS_RAGGED_WGMMA=require, but the wgmma "
                 "kernel cannot run here (needs a compute capability 9.0 device and an "
                 "sm_90a build)"
               : "";
  }
  *used = true;
  return launch_main(stream, p, a, kernel, Sm90Config<D, N, kFp8>::kBytes, kSm90Rows,
                     kSm90Threads);
}

// The wgmma kernel when it applies, with wgmma_tile's tiles (fp8 caches: the default tiles
// only). *used = false leaves the choice to the caller.
template <typename T, int D, bool kFp8 = false>
inline std::string try_launch_wgmma(cudaStream_t stream, const Params& p, const Args& a,
                                    bool* used) {
  *used = false;
  const WgmmaMode mode = wgmma_mode_from_env();
  if (mode == WgmmaMode::kOff) return "";
  if constexpr (kFp8) {
    return try_launch_wgmma_tile<T, D, D == 64 ? 128 : 64, true>(stream, p, a, mode, used);
  } else if constexpr (D != 256) {
    if (wgmma_tile<D>() == 128) return try_launch_wgmma_tile<T, D, 128>(stream, p, a, mode, used);
  }
  return try_launch_wgmma_tile<T, D, 64>(stream, p, a, mode, used);
}

// One cache dtype's dispatch (kFp8: f8e4m3fn caches, else the query dtype): bf16/f16
// queries take the wgmma kernel when it can serve the call (an sm_90a build on a compute
// capability 9.0 device), else the mma.sync kernel; f32 queries take the SIMT kernel, and
// are refused on fp8 caches.
template <int D, bool kFp8>
inline std::string launch_cache_dtype(cudaStream_t stream, const Params& p, const Args& a) {
  bool used = false;
  std::string err;
  if (p.dtype == DType::kBF16) {
    err = try_launch_wgmma<__nv_bfloat16, D, kFp8>(stream, p, a, &used);
  }
  if (p.dtype == DType::kF16) err = try_launch_wgmma<__half, D, kFp8>(stream, p, a, &used);
  if (used || !err.empty()) return err;
  switch (p.dtype) {
    case DType::kBF16:
      return launch_main(stream, p, a, ragged_mma_kernel<__nv_bfloat16, D, kFp8>,
                         MmaConfig<__nv_bfloat16, D, kFp8>::kBytes,
                         MmaConfig<__nv_bfloat16, D, kFp8>::BM);
    case DType::kF16:
      return launch_main(stream, p, a, ragged_mma_kernel<__half, D, kFp8>,
                         MmaConfig<__half, D, kFp8>::kBytes, MmaConfig<__half, D, kFp8>::BM);
    case DType::kF32:
      if constexpr (kFp8) {
        return "ragged_paged_attention: f8e4m3fn caches need bf16 or f16 queries";
      } else {
        return launch_main(stream, p, a, ragged_simt_kernel<D>, SimtConfig<D>::kBytes,
                           SimtConfig<D>::BM);
      }
  }
  return "ragged_paged_attention: unknown dtype";
}

template <int D>
inline std::string launch_head_dim(cudaStream_t stream, const Params& p, const Args& a) {
  return p.fp8_cache ? launch_cache_dtype<D, true>(stream, p, a)
                     : launch_cache_dtype<D, false>(stream, p, a);
}

}  // namespace detail

inline std::string launch_ragged_paged_attention(cudaStream_t stream, const Params& p) {
  using detail::Args;
  if (p.num_tokens == 0 || p.num_q_heads == 0) return "";
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0)
    return "ragged_paged_attention: num_q_heads must be a multiple of num_kv_heads";
  if (!IsSupportedBlockSize(p.block_size))
    return "ragged_paged_attention: block_size must be 16, 32, 64, 128 or 256";
  const int64_t capacity = p.max_blocks_per_seq * p.block_size;
  if (capacity > kMaxCapacity || p.num_tokens * p.num_q_heads > kMaxPackedRows ||
      p.num_blocks > INT_MAX || p.max_seqs < 1 || p.max_seqs >= INT_MAX)
    return "ragged_paged_attention: sizes out of range";
  Args a{};
  a.q = p.queries;
  a.k = p.key_cache;
  a.v = p.value_cache;
  a.kv_lens = p.kv_lens;
  a.bt = p.block_tables;
  a.cu = p.cu_q_lens;
  a.num_seqs = p.num_seqs;
  a.out = p.out;
  a.T = static_cast<int>(p.num_tokens);
  a.Hq = static_cast<int>(p.num_q_heads);
  a.Hkv = static_cast<int>(p.num_kv_heads);
  a.G = static_cast<int>(p.num_q_heads / p.num_kv_heads);
  a.max_seqs = static_cast<int>(p.max_seqs);
  a.num_blocks = static_cast<int>(p.num_blocks);
  a.max_blocks = static_cast<int>(p.max_blocks_per_seq);
  a.log2_bs = Log2BlockSize(p.block_size);
  a.capacity = static_cast<int>(capacity);
  a.window = p.sliding_window <= 0 ? 0
             : (p.sliding_window >= INT_MAX / 2 ? INT_MAX / 2 : static_cast<int>(p.sliding_window));
  a.sb = p.stride_block;
  a.ss = p.stride_slot;
  a.sh = p.stride_head;
  const float scale = p.scale * p.k_scale;  // k_scale: 1 unless the caches are fp8
  if (p.softcap > 0.f) {
    a.qk_scale = scale / p.softcap;
    a.cap_mul = p.softcap * detail::kLog2e;
  } else {
    a.qk_scale = scale * detail::kLog2e;
    a.cap_mul = 0.f;
  }
  a.out_scale = p.v_scale;
  const int64_t elem = p.dtype == DType::kF32 ? 4 : 2;
  const int64_t row_bytes = p.num_q_heads * p.head_dim * elem;
  if (row_bytes > INT_MAX) return "ragged_paged_attention: sizes out of range";
  a.skip = nullptr;
  if (p.workspace != nullptr && has_decode_path(p.num_tokens, p.max_seqs)) {
    const std::string err = detail::launch_decode_path(stream, p, &a);
    if (!err.empty()) return err;
  }
  const int64_t zgrid = (p.num_tokens + detail::kZeroRows - 1) / detail::kZeroRows;
  detail::ragged_zero_kernel<<<static_cast<unsigned>(zgrid), detail::kThreads, 0, stream>>>(
      a, static_cast<int>(row_bytes));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return detail::cuda_error("launching the zero kernel", e);
  switch (p.head_dim) {
    case 64: return detail::launch_head_dim<64>(stream, p, a);
    case 128: return detail::launch_head_dim<128>(stream, p, a);
    case 256: return detail::launch_head_dim<256>(stream, p, a);
    default: return "ragged_paged_attention: head_dim must be 64, 128 or 256";
  }
}

}  // namespace xla_kernels::ragged_paged_attention
