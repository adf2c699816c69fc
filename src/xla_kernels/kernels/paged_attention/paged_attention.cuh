// Decode paged attention (one query token per sequence) for NVIDIA GPUs: the kernel core.
//
// Plain CUDA templates and one entry point, launch_paged_attention(stream, params); no XLA
// types (the binding is paged_attention.cu). Semantics, for sequence s and query head h
// (kv head kvh = h / (num_q_heads / num_kv_heads)):
//
//   L      = min(seq_lens[s], max_blocks_per_seq * block_size)     (capacity clamp)
//   tokens = { t : max(0, L - sliding_window) <= t < L }            (all of [0, L) if window 0)
//   phys   = block_tables[s, t / block_size];  token t is skipped (masked) when phys is not
//            in [0, num_blocks): no address is formed from an out-of-range id
//   x_t    = scale * (q[s, h] . K[phys, t % block_size, kvh]);  softcap > 0: softcap*tanh(x/softcap)
//   out    = sum_t softmax(x)_t V[phys, t % block_size, kvh]     (all zeros when no token is left)
//
// Design (flash-decoding):
//  * Main kernel: one CTA of 4 warps per (sequence, partition, kv head, head chunk). A CTA
//    serves every query head of its kv head (up to 16 with tensor cores, 8 on the f32 path),
//    so K/V are read from memory once per kv head (GQA/MQA).
//  * Partitions: the active token range of a sequence (known only on the device) is cut into
//    n <= T partitions of P tokens (P a multiple of the CTA tile, at least kPartMin tokens);
//    T is picked on the host so that the grid fills the GPU once (slots = SMs x CTAs per SM,
//    at most kPartitionCtasPerSm = 3 of them).
//    CTAs past a sequence's n exit at once. With n == 1 the CTA writes the output directly;
//    otherwise it writes (acc, m, l) partials to the workspace and a small reduce kernel
//    (one CTA per (sequence, q head), its loads batched) combines them. The reduce kernel
//    is not launched at all when T == 1.
//  * Programmatic dependent launch (sm_90+, cuda_pdl.cuh): both kernels are launched with
//    PDL and wait (griddepcontrol.wait) before touching global memory, so the reduce kernel
//    is already resident when the main kernel's last CTAs finish, and a call overlaps the
//    previous kernel's tail; results are those of plain stream order.
//  * Loads: each warp streams its own tiles (NW tokens of K and V) into shared memory with
//    16-byte cp.async, kStages deep, so ~2 tiles per warp are in flight while it computes.
//    Staged rows are unpadded, their 16-byte chunks XOR-swizzled (swz_chunk), so each row
//    starts on a 128-byte line of shared memory: a cp.async whose destination straddles
//    lines is split, and L2 then served 1.5x the sectors (PERFORMANCE.md).
//    Rows of masked tokens (beyond L, outside the window, invalid block id) are zero-filled
//    with plain shared stores and never read from global memory.
//  * Math: bf16/f16 use mma.sync m16n8k16 (f32 accumulate): S = Q K^T with the q heads as the
//    M dimension (padded to 16), then O += P V with P taken straight from the S accumulators
//    (FlashAttention-2 register layout). f32 uses CUDA cores (exact f32 FMAs).
//  * Online softmax in base 2 with f32 statistics; the 4 warps of a CTA each keep their own
//    (m, l, O) and are merged through shared memory at the end.
//  * fp8 caches (f8e4m3fn, bf16/f16 queries; Fp8MmaCore): the same pipeline with 32-token
//    tiles (the bytes of a 16-token bf16 tile, so as many bytes stay in flight), staged as
//    e4m3 in shared memory with an XOR swizzle of the 16-byte chunks instead of padding.
//    Lanes read their K and V bytes straight into registers (K: 16-byte loads, the head
//    dimension permuted so one lane's 4 values per k-step are adjacent, Q permuted alike;
//    V: 4-byte loads of 4 dims of 4 tokens, byte-permuted into (token, token+1) pairs) and
//    convert them with cvt e4m3x2 -> f16x2 (bf16 through f32; every e4m3 value is exact in
//    both) for the same m16n8k16 MMAs. k_scale is folded into the logit scale and v_scale
//    into the final normalization, so the math is that of the bf16/f16 kernel on the
//    dequantized cache. At up to 8 q heads per kv head (Fp8MmaCoreT) the MMA operands are
//    swapped (S^T = K Q^T, O^T = V^T P^T): tokens and head dims fill the 16 MMA rows and the
//    8 q heads the columns, so half as many MMAs run; at most 2 of its CTAs share an SM
//    (cap_ctas_per_sm), the occupancy of Fp8MmaCore, which measured faster than 3.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "paged_attention_limits.h"
#include "xla_kernels/cuda_mma.cuh"
#include "xla_kernels/cuda_pdl.cuh"

namespace xla_kernels::paged_attention {

// ------------------------------------------------------------------ public interface

enum class DType { kF32, kF16, kBF16 };

// Everything the kernels need; element strides describe either cache layout:
//   vllm   [num_blocks, block_size, num_kv_heads, head_dim]
//   pallas [num_kv_heads, num_blocks, block_size, head_dim]
struct Params {
  DType dtype = DType::kF32;          // query and output
  bool fp8_cache = false;             // caches are f8e4m3fn (dtype is kBF16 or kF16)
  const void* query = nullptr;        // [num_seqs, num_q_heads, head_dim]
  const void* key_cache = nullptr;    // layout above
  const void* value_cache = nullptr;  // same shape and layout as key_cache
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;      // [num_seqs]
  void* out = nullptr;                // [num_seqs, num_q_heads, head_dim]
  float* workspace = nullptr;         // flash-decoding partials
  int64_t workspace_elems = 0;
  int64_t num_seqs = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0, max_blocks_per_seq = 0;
  int64_t stride_block = 0, stride_slot = 0, stride_head = 0;  // elements
  float scale = 1.f, softcap = 0.f;
  int64_t sliding_window = 0;
  float k_scale = 1.f, v_scale = 1.f;  // fp8 caches: key = stored * k_scale, value likewise
};

// Launches the kernels on `stream`; returns "" on success, else an error message.
inline std::string launch_paged_attention(cudaStream_t stream, const Params& p);

// ------------------------------------------------------------------ device helpers

namespace detail {

using namespace ::xla_kernels::cuda_mma;  // the shared mma/cp.async helpers
using namespace ::xla_kernels::cuda_pdl;  // programmatic dependent launch

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;
// L2 prefetch size of the K/V tile loads (cp_async16_l2): 0 (none), 64, 128 or 256 bytes.
// -DXK_DECODE_L2_PREFETCH=N (e.g. NVCC_APPEND_FLAGS) overrides it for A/B runs.
#ifndef XK_DECODE_L2_PREFETCH
#define XK_DECODE_L2_PREFETCH 128
#endif
constexpr int kL2Prefetch = XK_DECODE_L2_PREFETCH;
// Pipeline depth of Fp8MmaCore's K/V staging: 64 KB of shared memory per CTA at d 128 with
// 2 stages, 96 KB with 3. Either way 2 CTAs (8 warps) run per SM at d 128: ptxas gives the
// 2-stage loop 190-193 registers (168 with 3 stages). With block ids 2 tiles ahead, 2
// stages measured 0.5-4.1 % faster on the H200 at 5 of 6 configurations and level (0.2 %)
// at the sixth, d 256 (PERFORMANCE.md, "Block ids further ahead"); -DXK_DECODE_FP8_STAGES=3
// is the old depth. Fp8MmaCoreT takes the same depth and tiles (3 stages, measured again
// with Fp8MmaCore before it existed, were slower at one-wave sizes: "fp8 at many waves, and
// tokens on the MMA rows"; not measured with Fp8MmaCoreT).
#ifndef XK_DECODE_FP8_STAGES
#define XK_DECODE_FP8_STAGES 2
#endif
// Tiles of block ids loaded ahead of the copies that use them. Under a saturated memory
// system a block-table load waits behind the warp's own K/V copies; one tile ahead (the
// value 1, the kernel before 2026-11-26) left the compare after it as the top stall of the
// fp8 kernel on the H200 (PERFORMANCE.md, "Block ids further ahead"). -DXK_DECODE_BT_AHEAD=1
// restores the old loop and the old prologue for A/B runs.
#ifndef XK_DECODE_BT_AHEAD
#define XK_DECODE_BT_AHEAD 2
#endif
constexpr int kBtAhead = XK_DECODE_BT_AHEAD;
static_assert(kBtAhead >= 1, "block ids must be loaded at least one tile ahead");
// Tokens per warp tile of Fp8MmaCore at head_dim 256. At 32 (the tile of d 64 and 128) two
// stages of 4 warps take 128 KB, so one CTA (4 warps) fits an SM; at 16 they take 64 KB and
// the registers (2 CTAs) bound the SM instead: 8 warps; measured 7-11 % faster on the H200
// (PERFORMANCE.md, "Block ids further ahead, 2 fp8 stages, 16-token fp8 tiles at d 256").
// -DXK_DECODE_FP8_D256_TOKENS=32 is the old tile, for A/B runs.
#ifndef XK_DECODE_FP8_D256_TOKENS
#define XK_DECODE_FP8_D256_TOKENS 16
#endif
// fp8 caches at up to 8 q heads per kv head run Fp8MmaCoreT (tokens on the MMA rows);
// -DXK_DECODE_FP8_TOKENS_ON_ROWS=0 runs Fp8MmaCore for every ratio, for A/B runs.
#ifndef XK_DECODE_FP8_TOKENS_ON_ROWS
#define XK_DECODE_FP8_TOKENS_ON_ROWS 1
#endif
constexpr bool kFp8TokensOnRows = XK_DECODE_FP8_TOKENS_ON_ROWS;
constexpr int kPartitionCtasPerSm = 3;  // see launch_typed
constexpr float kLog2e = 1.4426950408889634f;

struct KernelArgs {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* bt;
  const int32_t* lens;
  void* out;
  float* ws;
  int S, Hq, Hkv, G;     // G = q heads per kv head
  int chunks;            // head chunks per kv head (ceil(G / GC))
  int T;                 // partitions per sequence in the grid (>= 1)
  int cta_tile;          // tokens per CTA tile (partition sizes are multiples of it)
  int log2_bs;           // log2(block_size)
  int num_blocks, max_blocks;
  int window;            // 0: none
  int64_t sb, ss, sh;    // element strides: block, slot, kv head
  float qk_scale;        // scale*log2e, or scale/softcap with a softcap
  float cap_mul;         // softcap*log2e, or 0 without a softcap
  float out_scale;       // fp8 caches: v_scale, applied with the final 1/l
};

struct SeqPart {
  int lo, hi;  // active tokens [lo, hi)
  int P;       // tokens per partition
  int n;       // partitions (1 also for an empty sequence)
};

// The partitioning of a sequence of `L` tokens (its seq_lens entry); the main and the reduce
// kernel must agree on it.
__device__ __forceinline__ SeqPart seq_partition_of(const KernelArgs& a, int L) {
  SeqPart r;
  const int cap = a.max_blocks << a.log2_bs;
  L = L < cap ? L : cap;
  if (L <= 0) {
    r.lo = r.hi = 0;
    r.P = 0;
    r.n = 1;
    return r;
  }
  r.hi = L;
  r.lo = (a.window > 0 && L > a.window) ? L - a.window : 0;
  const int len = r.hi - r.lo;
  int n = (len + kPartMin - 1) / kPartMin;
  n = n < a.T ? n : a.T;
  int P = (len + n - 1) / n;
  P = (P + a.cta_tile - 1) / a.cta_tile * a.cta_tile;
  r.P = P;
  r.n = (len + P - 1) / P;
  return r;
}

// The partitioning of sequence s.
__device__ __forceinline__ SeqPart seq_partition(const KernelArgs& a, int s) {
  return seq_partition_of(a, __ldg(a.lens + s));
}

// 16 bytes of T -> floats.
template <typename T>
__device__ __forceinline__ void cvt16(const uint4& u, float* f) {
  if constexpr (std::is_same_v<T, float>) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
}

// N (1, 2, 4 or 8) elements of T in shared memory -> floats.
template <typename T, int N>
__device__ __forceinline__ void lds_cvt(const T* p, float* f) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes % 4 == 0 || kBytes == 2, "unsupported vector");
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[i];
      cvt16<T>(u, f + i * (16 / sizeof(T)));
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        f[i] = p[i];
      } else {
        f[i] = static_cast<float>(p[i]);
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// Logit transform of N dot products, in place: scale, optional softcap, base-2 units. The
// softcap branch is taken once per tile, outside the loops.
template <int N>
__device__ __forceinline__ void logits(float* x, const KernelArgs& a) {
  if (a.cap_mul > 0.f) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = a.cap_mul * tanhf(x[i] * a.qk_scale);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] *= a.qk_scale;
  }
}


// ------------------------------------------------------------------ tile loader

// Physical block of token pos0 + lane (lanes < NW), or -1 past the partition's end. Issued
// kBtAhead iterations before the copies that use it, so its latency hides behind that many
// tiles' math.
template <int NW>
__device__ __forceinline__ int lookup_block(const KernelArgs& a, const int32_t* bt_row, int pos0,
                                            int p_hi, int lane) {
  const int pos = pos0 + lane;
  // pos < p_hi <= L <= capacity: the block_tables read is in bounds.
  return (lane < NW && pos < p_hi) ? __ldg(bt_row + (pos >> a.log2_bs)) : -1;
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
  const bool valid = blk >= 0 && blk < a.num_blocks;  // checked before any address is formed
  if (valid) {
    const int pos = pos0 + lane;
    off = static_cast<int64_t>(blk) * a.sb +
          static_cast<int64_t>(pos & ((1 << a.log2_bs) - 1)) * a.ss +
          static_cast<int64_t>(kvh) * a.sh;
  }
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
      cp_async16_l2<kL2Prefetch>(kd, kc + roff + col);
      cp_async16_l2<kL2Prefetch>(vd, vc + roff + col);
    } else {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
    }
  }
  return mask;
}

// ------------------------------------------------------------------ tensor-core softmax

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
  // (Each case keeps the shuffle order it had before this step was shared: the row case's
  // SASS is then byte-identical to the measured builds'.)
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

// ------------------------------------------------------------------ tensor-core core

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

// bf16/f16: mma.sync m16n8k16; up to 16 q heads per CTA (rows of the MMA).
template <typename T, int D>
struct MmaCore {
  using Cache = T;                             // staging (cache) element type
  static constexpr int GC = 16;                // q heads per CTA
  static constexpr int kMaxCtasPerSm = 0;      // no cap: as many as fit
  // Tokens per warp tile: 16, or 32 at head_dim 64 so that a tile is 8 KB of K+V as at d 128
  // (16-token d 64 tiles paid the tile's fixed work per 4 KB: 1060 SASS instructions per
  // 8 KB against 923; 1-2 % faster on an H100, PERFORMANCE.md).
  static constexpr int NW = D == 64 ? 32 : 16;
  static constexpr int kStages = 3;
  // K/V rows unpadded, 16-byte chunks swizzled (swz_chunk): conflict-free ldmatrix, and
  // every row starts on a 128-byte line of shared memory. (Rows padded to D + 8 elements
  // made the cp.async of a row straddle shared-memory lines, and the hardware then asked
  // L2 for 1.5x the row's sectors; PERFORMANCE.md.)
  static constexpr bool kSwizzle = true;
  static constexpr int RS = D;
  static constexpr int QRS = D + 8;            // Q rows in shared memory (padded)
  static constexpr bool kQRegs = D <= 128;     // Q fragments kept in registers
  static constexpr int KT = D / 16;            // k-steps of S = Q K^T
  static constexpr int NT = NW / 8;            // n-tiles of S (8 tokens each)
  static constexpr int DT = D / 8;             // n-tiles of O (8 dims each)
  static constexpr int kExtraBytes = GC * QRS * static_cast<int>(sizeof(T));  // Q in smem

  // Element offset of 8-element (16-byte) chunk q of row r of a staged K/V tile.
  __device__ __forceinline__ static int tile_off(int r, int q) {
    return r * RS + swz_chunk<D / 8>(q, r) * 8;
  }

  uint32_t qf[kQRegs ? KT : 1][4];
  float o[DT][4];
  float m[2], l[2];
  const T* qsm;
  int lane;

  // Cooperative (whole CTA) copy of the chunk's query rows into shared memory; rows >= nh are 0.
  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    constexpr int kCpr = D / kVec;
    T* q = reinterpret_cast<T*>(extra);
    for (int c = tid; c < GC * kCpr; c += kThreads) {
      const int r = c / kCpr, col = (c % kCpr) * kVec;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < nh) v = *reinterpret_cast<const uint4*>(qg + static_cast<int64_t>(r) * D + col);
      *reinterpret_cast<uint4*>(q + r * QRS + col) = v;
    }
  }

  __device__ __forceinline__ const T* q_addr(int kk) const {
    const int mtx = lane >> 3, r = lane & 7;
    return qsm + ((mtx & 1) * 8 + r) * QRS + kk * 16 + (mtx >> 1) * 8;
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    (void)warp;
    qsm = reinterpret_cast<const T*>(extra);
    lane = lane_;
    if constexpr (kQRegs) {
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) ldsm_x4(qf[kk], q_addr(kk));
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  __device__ __forceinline__ void step(const T* ks, const T* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int mtx = lane >> 3, r8 = lane & 7, tig = lane & 3;
    // S[head][token] = Q K^T; K tile rows are the MMA's n (tokens), d is k.
    float sc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t af[4];
      if constexpr (kQRegs) {
        af[0] = qf[kk][0];
        af[1] = qf[kk][1];
        af[2] = qf[kk][2];
        af[3] = qf[kk][3];
      } else {
        ldsm_x4(af, q_addr(kk));
      }
#pragma unroll
      for (int j = 0; j < NW / 16; ++j) {
        uint32_t b[4];
        ldsm_x4(b, ks + tile_off(j * 16 + (mtx >> 1) * 8 + r8, kk * 2 + (mtx & 1)));
        mma16816<T>(sc[2 * j], af, b[0], b[1]);
        mma16816<T>(sc[2 * j + 1], af, b[2], b[3]);
      }
    }
    online_softmax(sc, mask, m, l, o, tig, a);
    // O += P V: P (A operand) comes from the S accumulators, V via ldmatrix.trans.
#pragma unroll
    for (int j = 0; j < NW / 16; ++j) {
      uint32_t pa[4];
      accumulators_to_a<T>(sc[2 * j], sc[2 * j + 1], pa);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, vs + tile_off(j * 16 + (mtx & 1) * 8 + r8, dp * 2 + (mtx >> 1)));
        mma16816<T>(o[2 * dp], pa, b[0], b[1]);
        mma16816<T>(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
  }

  // This warp's unnormalized O rows, m and l (rows < nh) -> shared memory.
  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
    store_row_stats(m, l, ml, nh, lane);
    const int g0 = lane >> 2, g1 = g0 + 8, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      const int d = i * 8 + tig * 2;
      if (g0 < nh) *reinterpret_cast<float2*>(ow + g0 * D + d) = make_float2(o[i][0], o[i][1]);
      if (g1 < nh) *reinterpret_cast<float2*>(ow + g1 * D + d) = make_float2(o[i][2], o[i][3]);
    }
  }
};

// ------------------------------------------------------------------ fp8 tensor-core core

// The power of two 2^e that brings the largest finite |q| of a row (`amax`) into [2^14,
// 2^15): f16's largest finite value is 65504, so no scaled element overflows, and e is kept
// in [-126, 126] so that 2^e and 2^-e are normal floats (an all-zero row gets 2^126).
__device__ __forceinline__ float q_row_scale(float amax) {
  const int biased = (__float_as_int(amax) >> 23) & 0xff;  // amax in [2^(b-127), 2^(b-126))
  int e = 15 - (biased - 126);
  e = e < -126 ? -126 : (e > 126 ? 126 : e);
  return __int_as_float((127 + e) << 23);
}

// Two e4m3 values (low byte first) -> the MMA operand register of T (f16x2 or bf16x2). Exact:
// every e4m3fn value is a normal f16 (or zero, or NaN) and fits bf16's 8 significant bits.
template <typename T>
__device__ __forceinline__ uint32_t e4m3x2_to(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  } else {
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// Both e4m3 pairs of a 32-bit word -> two f16x2 registers (the low pair in lo). On sm_89+
// one cvt reads each 16-bit half of the word in place, so the high pair needs no shift.
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
#else
  lo = e4m3x2_to<__half>(word);
  hi = e4m3x2_to<__half>(word >> 16);
#endif
}

// The query rows of an fp8 core (GC rows from qg, rows >= nh zero) -> f16 in shared memory,
// head-dim permuted and fragment-ordered ([kk][row][tig][4]: lane tig's 4 values of k-step
// kk, see Fp8MmaCore), then with bf16 queries each row's scale (q_row_scale) after the GC
// rows. Called by every thread of the CTA; with bf16 queries it synchronizes them.
template <typename T, int D, int GC>
__device__ __forceinline__ void stage_q_fp8(const T* qg, int nh, unsigned char* extra, int tid) {
  using M = __half;
  constexpr bool kQScaled = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kSeg = D / 4;
  constexpr int kQBytes = GC * D * static_cast<int>(sizeof(M));
  M* q = reinterpret_cast<M*>(extra);
  float* row_scale = reinterpret_cast<float*>(extra + kQBytes);
  if constexpr (kQScaled) {
    // One warp per row: the largest finite |q| -> the row's scale.
    for (int r = tid >> 5; r < GC; r += kWarps) {
      float amax = 0.f;
      if (r < nh) {
        for (int d = tid & 31; d < D; d += 32) {
          const float x = fabsf(static_cast<float>(qg[static_cast<int64_t>(r) * D + d]));
          if (x <= FLT_MAX) amax = fmaxf(amax, x);  // skips inf and NaN
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
      }
      if ((tid & 31) == 0) row_scale[r] = q_row_scale(amax);
    }
    __syncthreads();
  }
  for (int c = tid; c < GC * D / 4; c += kThreads) {
    const int r = c / (D / 4), col = (c % (D / 4)) * 4;
    const int tig = col / kSeg, kk = (col % kSeg) / 4;
    uint2 v = make_uint2(0, 0);
    if (r < nh) v = *reinterpret_cast<const uint2*>(qg + static_cast<int64_t>(r) * D + col);
    if constexpr (kQScaled) {
      // 4 bf16 -> f32 (exact), times 2^e (exact), -> f16 (exact unless subnormal).
      const float sc = row_scale[r];
      const __half2 lo = __floats2half2_rn(__uint_as_float(v.x << 16) * sc,
                                           __uint_as_float(v.x & 0xffff0000u) * sc);
      const __half2 hi = __floats2half2_rn(__uint_as_float(v.y << 16) * sc,
                                           __uint_as_float(v.y & 0xffff0000u) * sc);
      v = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                     *reinterpret_cast<const uint32_t*>(&hi));
    }
    *reinterpret_cast<uint2*>(q + ((kk * GC + r) * 4 + tig) * 4) = v;
  }
}

// f8e4m3fn caches, bf16/f16 queries: mma.sync m16n8k16 on K/V converted in registers. Tiles of
// 32 tokens (16 at head_dim 256: XK_DECODE_FP8_D256_TOKENS); rows of D bytes, chunks
// swizzled (swz_chunk), no padding.
//
// Every MMA runs in f16, for bf16 queries too: e4m3 -> f16 is exact and one cvt per pair of
// values (e4m3x4_to_f16x2 converts both pairs of a 32-bit word in place), where e4m3 -> bf16
// costs three more instructions per pair (f16 -> 2 x f32 -> bf16x2: 512 of the 1631 loop
// instructions of a d 128 tile in the SASS; fp8 decode 1.46x -> 1.81x the bf16 kernel at
// d 256, PERFORMANCE.md). bf16 query rows are staged as f16 times a power of two per row
// (q_row_scale), exact for every element at least 2^-28 times the row's largest |q|
// (smaller ones fall into f16's subnormals), and S is scaled back (exactly) before the
// softmax; P in [0, 1] is rounded to f16 rather than bf16 (3 more bits).
//  * S = Q K^T: the k index (head dim) is permuted so that lane (r8 = lane/4, tig = lane%4)
//    finds the 4 values of its B fragment (k = 2tig, 2tig+1, 2tig+8, 2tig+9) of k-step kk at
//    bytes tig*D/4 + 4kk .. +3 of its K row: 16-byte loads, one cvt per register. Q is
//    staged in the same permutation, fragment-ordered ([kk][head][tig][4]).
//  * O += P V: output column n of n-tile i is head dim (i/4)*32 + 4n + i%4, so a lane's
//    B fragments of 4 n-tiles are 4 adjacent bytes of each of its 4 token rows; a byte
//    permute pairs tokens (2tig, 2tig+1) and (2tig+8, 2tig+9). The epilogue un-permutes.
template <typename T, int D>
struct Fp8MmaCore {
  using Cache = uint8_t;
  using M = __half;                            // MMA operand type
  static constexpr bool kQScaled = std::is_same_v<T, __nv_bfloat16>;  // bf16 q as scaled f16
  static_assert(kQScaled || std::is_same_v<T, __half>, "bf16 or f16 queries");
  static constexpr bool kSwizzle = true;
  static constexpr int GC = 16;
  static constexpr int kMaxCtasPerSm = 0;  // no cap: as many as fit
  static constexpr int NW = D == 256 ? XK_DECODE_FP8_D256_TOKENS : 32;
  static_assert(NW == 16 || NW == 32, "fp8 warp tiles of 16 or 32 tokens");
  static constexpr int kStages = XK_DECODE_FP8_STAGES;
  static_assert(kStages >= 2, "the tile loop needs at least 2 stages");
  static constexpr int RS = D;                 // bytes per staged row
  static constexpr int kCpr = D / 16;          // 16-byte chunks per row
  static constexpr bool kQRegs = D <= 128;
  static constexpr int KT = D / 16;
  static constexpr int NT = NW / 8;
  static constexpr int DT = D / 8;
  static constexpr int kSeg = D / 4;           // bytes of a K row one lane reads
  static constexpr int kQBytes = GC * D * static_cast<int>(sizeof(M));
  // The staged (permuted) query, then with kQScaled each row's scale (q_row_scale).
  static constexpr int kExtraBytes = kQBytes + (kQScaled ? GC * 4 : 0);

  uint32_t qf[kQRegs ? KT : 1][4];
  float o[DT][4];
  float m[2], l[2];
  float qinv[2];  // kQScaled: 1 / the scales of rows g0 and g0 + 8
  const M* qsm;
  int lane;

  // Called by every thread of the CTA (with kQScaled it synchronizes them).
  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    stage_q_fp8<T, D, GC>(qg, nh, extra, tid);
  }

  __device__ __forceinline__ void q_frag(uint32_t (&af)[4], int kk) const {
    const int g0 = lane >> 2, tig = lane & 3;
    const uint2 lo = *reinterpret_cast<const uint2*>(qsm + ((kk * GC + g0) * 4 + tig) * 4);
    const uint2 hi = *reinterpret_cast<const uint2*>(qsm + ((kk * GC + g0 + 8) * 4 + tig) * 4);
    af[0] = lo.x;
    af[1] = hi.x;
    af[2] = lo.y;
    af[3] = hi.y;
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    (void)warp;
    qsm = reinterpret_cast<const M*>(extra);
    lane = lane_;
    if constexpr (kQScaled) {
      const float* row_scale = reinterpret_cast<const float*>(extra + kQBytes);
      qinv[0] = 1.f / row_scale[lane >> 2];  // exact: powers of two
      qinv[1] = 1.f / row_scale[(lane >> 2) + 8];
    }
    if constexpr (kQRegs) {
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) q_frag(qf[kk], kk);
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  __device__ __forceinline__ void step(const uint8_t* ks, const uint8_t* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int r8 = lane >> 2, tig = lane & 3;
    float sc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
    // S = Q K^T, one 16-byte chunk (4 k-steps) of every n-tile's K row at a time.
#pragma unroll
    for (int c = 0; c < kSeg / 16; ++c) {
      uint4 kw[NT];
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const int row = i * 8 + r8;
        kw[i] = *reinterpret_cast<const uint4*>(
            ks + row * RS + swz_chunk<kCpr>(tig * (kSeg / 16) + c, row) * 16);
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int kk = c * 4 + w;
        uint32_t af[4];
        if constexpr (kQRegs) {
          af[0] = qf[kk][0];
          af[1] = qf[kk][1];
          af[2] = qf[kk][2];
          af[3] = qf[kk][3];
        } else {
          q_frag(af, kk);
        }
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          const uint32_t word = w == 0 ? kw[i].x : w == 1 ? kw[i].y : w == 2 ? kw[i].z : kw[i].w;
          uint32_t b0, b1;
          e4m3x4_to_f16x2(word, b0, b1);
          mma16816<M>(sc[i], af, b0, b1);
        }
      }
    }
    if constexpr (kQScaled) {  // back to Q K^T (exact: powers of two)
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        sc[i][0] *= qinv[0];
        sc[i][1] *= qinv[0];
        sc[i][2] *= qinv[1];
        sc[i][3] *= qinv[1];
      }
    }
    online_softmax(sc, mask, m, l, o, tig, a);
    // O += P V.
#pragma unroll
    for (int j = 0; j < NW / 16; ++j) {
      uint32_t pa[4];
      accumulators_to_a<M>(sc[2 * j], sc[2 * j + 1], pa);
      const int row0 = j * 16 + 2 * tig;
      const int rows[4] = {row0, row0 + 1, row0 + 8, row0 + 9};
#pragma unroll
      for (int i4 = 0; i4 < DT / 4; ++i4) {
        const int q = 2 * i4 + (r8 >> 2), within = (r8 & 3) * 4;
        uint32_t w[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          w[x] = *reinterpret_cast<const uint32_t*>(
              vs + rows[x] * RS + swz_chunk<kCpr>(q, rows[x]) * 16 + within);
        }
        const uint32_t lo0 = __byte_perm(w[0], w[1], 0x5140), hi0 = __byte_perm(w[0], w[1], 0x7362);
        const uint32_t lo8 = __byte_perm(w[2], w[3], 0x5140), hi8 = __byte_perm(w[2], w[3], 0x7362);
        uint32_t b[4][2];  // B operands: tokens (row0, row0 + 1) in [x][0], (+8, +9) in [x][1]
        e4m3x4_to_f16x2(lo0, b[0][0], b[1][0]);
        e4m3x4_to_f16x2(lo8, b[0][1], b[1][1]);
        e4m3x4_to_f16x2(hi0, b[2][0], b[3][0]);
        e4m3x4_to_f16x2(hi8, b[2][1], b[3][1]);
#pragma unroll
        for (int x = 0; x < 4; ++x) mma16816<M>(o[4 * i4 + x], pa, b[x][0], b[x][1]);
      }
    }
  }

  // As MmaCore::store, undoing the output-column permutation.
  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
    store_row_stats(m, l, ml, nh, lane);
    const int g0 = lane >> 2, g1 = g0 + 8, tig = lane & 3;
#pragma unroll
    for (int i4 = 0; i4 < DT / 4; ++i4) {
      const int d = i4 * 32 + 8 * tig;  // columns 2tig (d .. d+3) and 2tig+1 (d+4 .. d+7)
      const float(&x)[4] = o[4 * i4];
      const float(&y)[4] = o[4 * i4 + 1];
      const float(&z)[4] = o[4 * i4 + 2];
      const float(&u)[4] = o[4 * i4 + 3];
      if (g0 < nh) {
        *reinterpret_cast<float4*>(ow + g0 * D + d) = make_float4(x[0], y[0], z[0], u[0]);
        *reinterpret_cast<float4*>(ow + g0 * D + d + 4) = make_float4(x[1], y[1], z[1], u[1]);
      }
      if (g1 < nh) {
        *reinterpret_cast<float4*>(ow + g1 * D + d) = make_float4(x[2], y[2], z[2], u[2]);
        *reinterpret_cast<float4*>(ow + g1 * D + d + 4) = make_float4(x[3], y[3], z[3], u[3]);
      }
    }
  }
};

// f8e4m3fn caches at up to 8 q heads per kv head (GQA up to 8, and MHA): Fp8MmaCore's math
// with the MMA operands swapped, S^T = K Q^T and O^T = V^T P^T, so that a warp tile's tokens
// (and the head dims) fill the MMA's 16 rows and the CTA's 8 q heads its 8 columns. With
// the heads on the rows (Fp8MmaCore) at least half of every MMA computes rows that are not
// there (12 of 16 at GQA 4); here half as many MMAs do the same work, the softmax handles 8
// values per lane instead of 16, and O takes half the registers. The conversions (one cvt
// per two e4m3 values) and the shared-memory reads are the same as Fp8MmaCore's.
//  * S^T = K Q^T: the head dim is permuted as in Fp8MmaCore (Q staged by stage_q_fp8 with 8
//    rows); lane (g = lane/4, tig = lane%4) reads its A fragments of k-step kk from bytes
//    tig*D/4 + 4kk .. +3 of token rows g and g + 8 of each 16-token m-tile, and its B
//    fragment (Q) from registers.
//  * The softmax runs per column (head): a lane holds heads 2tig and 2tig + 1 of its tokens,
//    reduced over the 8 lanes of a column (shuffles over lane bits 2-4).
//  * P^T as B: the two f16-packed accumulator halves of an m-tile, transposed by movmatrix,
//    are the B fragments of one P V k-step.
//  * O^T += V^T P^T: A row r of head-dim m-tile 4i + x is head dim 4 (16i + r) + x (r < 8 for
//    lane rows g, r >= 8 for g + 8), so a lane's A fragments of 4 m-tiles are 4 adjacent
//    bytes of each of its 4 token rows (2tig, 2tig + 1, 2tig + 8, 2tig + 9), paired by a byte
//    permute as in Fp8MmaCore. The epilogue un-permutes.
template <typename T, int D>
struct Fp8MmaCoreT {
  using Cache = uint8_t;
  using M = __half;  // MMA operand type
  static constexpr bool kQScaled = std::is_same_v<T, __nv_bfloat16>;  // bf16 q as scaled f16
  static_assert(kQScaled || std::is_same_v<T, __half>, "bf16 or f16 queries");
  static constexpr bool kSwizzle = true;
  static constexpr int GC = 8;
  // With half the registers of Fp8MmaCore, 3 CTAs would fit an SM at head_dim 128 and 256
  // (146-168 registers); 2 measured faster (PERFORMANCE.md, "fp8 at many waves, and tokens
  // on the MMA rows").
  static constexpr int kMaxCtasPerSm = D == 64 ? 0 : 2;
  static constexpr int NW = Fp8MmaCore<T, D>::NW;
  static constexpr int kStages = Fp8MmaCore<T, D>::kStages;
  static constexpr int RS = D;         // bytes per staged row
  static constexpr int kCpr = D / 16;  // 16-byte chunks per row
  static constexpr int KT = D / 16;    // k-steps of S^T (head dim)
  static constexpr int MT = NW / 16;   // token m-tiles of S^T (k-steps of O^T)
  static constexpr int DT = D / 16;    // head-dim m-tiles of O^T
  static constexpr int kSeg = D / 4;   // bytes of a K row one lane reads
  static constexpr int kQBytes = GC * D * static_cast<int>(sizeof(M));
  static constexpr int kExtraBytes = kQBytes + (kQScaled ? GC * 4 : 0);
  static_assert(DT % 4 == 0, "head-dim m-tiles in groups of 4");

  uint32_t qf[KT][2];  // B fragments of Q (head g) per k-step
  float o[DT][4];      // O^T: rows g / g + 8 of each m-tile, columns (heads) 2tig, 2tig + 1
  float m[2], l[2];    // heads 2tig and 2tig + 1 (l: this lane's tokens only)
  float qinv[2];       // kQScaled: 1 / the scales of heads 2tig and 2tig + 1
  int lane;

  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    stage_q_fp8<T, D, GC>(qg, nh, extra, tid);
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    (void)warp;
    lane = lane_;
    const int g = lane >> 2, tig = lane & 3;
    if constexpr (kQScaled) {
      const float* row_scale = reinterpret_cast<const float*>(extra + kQBytes);
      qinv[0] = 1.f / row_scale[2 * tig];  // exact: powers of two
      qinv[1] = 1.f / row_scale[2 * tig + 1];
    }
    const M* qsm = reinterpret_cast<const M*>(extra);
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      const uint2 q = *reinterpret_cast<const uint2*>(qsm + ((kk * GC + g) * 4 + tig) * 4);
      qf[kk][0] = q.x;  // k = 2tig, 2tig + 1
      qf[kk][1] = q.y;  // k = 2tig + 8, 2tig + 9
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  __device__ __forceinline__ void step(const uint8_t* ks, const uint8_t* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int g = lane >> 2, tig = lane & 3;
    float sc[MT][4];  // S^T: tokens 16 i + g (0, 1) and + 8 (2, 3); heads 2tig (0, 2), + 1
#pragma unroll
    for (int i = 0; i < MT; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
    // S^T = K Q^T, one 16-byte chunk (4 k-steps) of the lane's two K rows per m-tile at a time.
#pragma unroll
    for (int c = 0; c < kSeg / 16; ++c) {
      uint4 kw[MT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = i * 16 + h * 8 + g;
          kw[i][h] = *reinterpret_cast<const uint4*>(
              ks + row * RS + swz_chunk<kCpr>(tig * (kSeg / 16) + c, row) * 16);
        }
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int kk = c * 4 + w;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          auto word = [&](const uint4& x) {
            return w == 0 ? x.x : w == 1 ? x.y : w == 2 ? x.z : x.w;
          };
          uint32_t af[4];
          e4m3x4_to_f16x2(word(kw[i][0]), af[0], af[2]);
          e4m3x4_to_f16x2(word(kw[i][1]), af[1], af[3]);
          mma16816<M>(sc[i], af, qf[kk][0], qf[kk][1]);
        }
      }
    }
    if constexpr (kQScaled) {  // back to K Q^T (exact: powers of two)
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        sc[i][0] *= qinv[0];
        sc[i][1] *= qinv[1];
        sc[i][2] *= qinv[0];
        sc[i][3] *= qinv[1];
      }
    }
    softmax(sc, mask, a);
    // O^T += V^T P^T, one token k-step (m-tile i of S^T) at a time.
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const uint32_t pb0 = movmatrix_trans(pack2<M>(sc[i][0], sc[i][1]));  // tokens 2tig, +1
      const uint32_t pb1 = movmatrix_trans(pack2<M>(sc[i][2], sc[i][3]));  // tokens 2tig + 8, +9
      const int row0 = i * 16 + 2 * tig;
      const int rows[4] = {row0, row0 + 1, row0 + 8, row0 + 9};
#pragma unroll
      for (int i4 = 0; i4 < DT / 4; ++i4) {
        uint32_t af[4][4];  // A fragments of m-tiles 4 i4 + x
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // A row g (head dims of quad 16 i4 + g), then g + 8
          const int quad = i4 * 16 + h * 8 + g;
          uint32_t w[4];
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            w[x] = *reinterpret_cast<const uint32_t*>(
                vs + rows[x] * RS + swz_chunk<kCpr>(quad >> 2, rows[x]) * 16 + (quad & 3) * 4);
          }
          const uint32_t lo0 = __byte_perm(w[0], w[1], 0x5140), hi0 = __byte_perm(w[0], w[1], 0x7362);
          const uint32_t lo8 = __byte_perm(w[2], w[3], 0x5140), hi8 = __byte_perm(w[2], w[3], 0x7362);
          // Head dim 4 quad + x: tokens (2tig, 2tig + 1) to register h, (+8, +9) to h + 2.
          e4m3x4_to_f16x2(lo0, af[0][h], af[1][h]);
          e4m3x4_to_f16x2(lo8, af[0][h + 2], af[1][h + 2]);
          e4m3x4_to_f16x2(hi0, af[2][h], af[3][h]);
          e4m3x4_to_f16x2(hi8, af[2][h + 2], af[3][h + 2]);
        }
#pragma unroll
        for (int x = 0; x < 4; ++x) mma16816<M>(o[4 * i4 + x], af[x], pb0, pb1);
      }
    }
  }

  // Scale / softcap / mask per token (row) of S^T, then the online softmax per head
  // (column): S becomes P, (m, l) are updated and O rescaled (online_softmax_update).
  __device__ __forceinline__ void softmax(float (&sc)[MT][4], uint32_t mask,
                                          const KernelArgs& a) {
    const int g = lane >> 2;
    logits<MT * 4>(&sc[0][0], a);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int t = i * 16 + g;
      if (!((mask >> t) & 1u)) sc[i][0] = sc[i][1] = -INFINITY;
      if (!((mask >> (t + 8)) & 1u)) sc[i][2] = sc[i][3] = -INFINITY;
      mx0 = fmaxf(mx0, fmaxf(sc[i][0], sc[i][2]));
      mx1 = fmaxf(mx1, fmaxf(sc[i][1], sc[i][3]));
    }
    online_softmax_update<true>(sc, mx0, mx1, m, l, o);
  }

  // (m, l) of heads < nh to ml (l summed over the column's 8 lanes) and O to ow ([head][D]),
  // undoing the head-dim permutation.
  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
    const int g = lane >> 2, tig = lane & 3;
    float ls[2] = {l[0], l[1]};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) ls[e] += __shfl_xor_sync(kFull, ls[e], off);
      const int h = 2 * tig + e;
      if (g == 0 && h < nh) {
        ml[h * 2] = m[e];
        ml[h * 2 + 1] = ls[e];
      }
    }
#pragma unroll
    for (int i4 = 0; i4 < DT / 4; ++i4) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // A row g (registers 0, 1), g + 8 (registers 2, 3)
        const int quad = i4 * 16 + h * 8 + g;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int head = 2 * tig + e;
          if (head < nh) {
            *reinterpret_cast<float4*>(ow + head * D + quad * 4) =
                make_float4(o[4 * i4][2 * h + e], o[4 * i4 + 1][2 * h + e],
                            o[4 * i4 + 2][2 * h + e], o[4 * i4 + 3][2 * h + e]);
          }
        }
      }
    }
  }
};

// ------------------------------------------------------------------ CUDA-core core

// Any T (used for f32): exact f32 FMAs. GC q heads per CTA.
template <typename T, int D, int GC_>
struct SimtCore {
  using Cache = T;
  static constexpr int GC = GC_;
  static constexpr int kMaxCtasPerSm = 0;  // no cap: as many as fit
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(T));
  static constexpr int NW = 4096 / kRowBytes > 32 ? 32 : (4096 / kRowBytes < 4 ? 4 : 4096 / kRowBytes);
  static constexpr int TG = 32 / NW;        // lanes per token in S = Q K^T
  static constexpr int kCpr = D / kVec;     // 16-byte chunks per row
  static constexpr int kCpl = kCpr / TG;    // chunks per lane
  static constexpr int kStages = 3;
  static constexpr bool kSwizzle = false;
  // Row padding keeps the 8 lanes of a 16-byte shared-load phase on distinct banks.
  static constexpr int RS = D + 16 * (TG < 4 ? TG : 4) / static_cast<int>(sizeof(T));
  static constexpr int DPL = D / 32;        // output dims per lane in O += P V
  static constexpr int kQBytes = GC * D * 4;
  static constexpr int kPBytes = kWarps * NW * GC * 4;
  static constexpr int kExtraBytes = kQBytes + kPBytes;
  static_assert(kCpr % TG == 0 && NW * TG == 32, "bad SIMT tiling");
  static_assert(GC % 4 == 0 || GC == 1 || GC == 2, "GC");

  float o[GC][DPL];
  float m[GC], lp[GC];
  const float* qsm;
  float* psm;  // this warp's [NW][GC] probabilities
  int lane;

  __device__ __forceinline__ static void stage_q(const T* qg, int nh, unsigned char* extra,
                                                 int tid) {
    float* q = reinterpret_cast<float*>(extra);
    for (int e = tid; e < GC * D; e += kThreads) {
      const int r = e / D;
      float x = 0.f;
      if (r < nh) {
        if constexpr (std::is_same_v<T, float>) {
          x = qg[e];
        } else {
          x = static_cast<float>(qg[e]);
        }
      }
      q[e] = x;
    }
  }

  __device__ __forceinline__ void init(unsigned char* extra, int warp, int lane_) {
    qsm = reinterpret_cast<const float*>(extra);
    psm = reinterpret_cast<float*>(extra + kQBytes) + warp * NW * GC;
    lane = lane_;
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      m[g] = -INFINITY;
      lp[g] = 0.f;
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[g][e] = 0.f;
    }
  }

  __device__ __forceinline__ void step(const T* ks, const T* vs, uint32_t mask,
                                       const KernelArgs& a) {
    const int t = lane / TG, sub = lane % TG;
    float s[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) s[g] = 0.f;
#pragma unroll
    for (int j = 0; j < kCpl; ++j) {
      const int c = (sub + TG * j) * kVec;
      float kf[kVec];
      lds_cvt<T, kVec>(ks + t * RS + c, kf);
#pragma unroll
      for (int g = 0; g < GC; ++g) {
#pragma unroll
        for (int e = 0; e < kVec; e += 4) {
          const float4 q4 = *reinterpret_cast<const float4*>(qsm + g * D + c + e);
          s[g] = fmaf(q4.x, kf[e], s[g]);
          s[g] = fmaf(q4.y, kf[e + 1], s[g]);
          s[g] = fmaf(q4.z, kf[e + 2], s[g]);
          s[g] = fmaf(q4.w, kf[e + 3], s[g]);
        }
      }
    }
#pragma unroll
    for (int off = TG / 2; off >= 1; off >>= 1) {
#pragma unroll
      for (int g = 0; g < GC; ++g) s[g] += __shfl_xor_sync(kFull, s[g], off);
    }
    const bool valid = (mask >> t) & 1u;
    logits<GC>(s, a);
    float al[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      const float x = valid ? s[g] : -INFINITY;
      float mx = x;
#pragma unroll
      for (int off = TG; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
      const float mn = fmaxf(m[g], mx);
      const float b = safe_max(mn);
      al[g] = exp2f(m[g] - b);
      m[g] = mn;
      const float p = exp2f(x - b);
      lp[g] = lp[g] * al[g] + (sub == 0 ? p : 0.f);
      s[g] = p;
    }
    if (sub == 0) {
#pragma unroll
      for (int g = 0; g < GC; ++g) psm[t * GC + g] = s[g];
    }
    __syncwarp();
#pragma unroll
    for (int g = 0; g < GC; ++g) {
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[g][e] *= al[g];
    }
#pragma unroll 4
    for (int tt = 0; tt < NW; ++tt) {
      float vf[DPL];
      lds_cvt<T, DPL>(vs + tt * RS + lane * DPL, vf);
      float pv[GC];
      if constexpr (GC % 4 == 0) {
#pragma unroll
        for (int g = 0; g < GC; g += 4) {
          const float4 p4 = *reinterpret_cast<const float4*>(psm + tt * GC + g);
          pv[g] = p4.x;
          pv[g + 1] = p4.y;
          pv[g + 2] = p4.z;
          pv[g + 3] = p4.w;
        }
      } else {
#pragma unroll
        for (int g = 0; g < GC; ++g) pv[g] = psm[tt * GC + g];
      }
#pragma unroll
      for (int g = 0; g < GC; ++g) {
#pragma unroll
        for (int e = 0; e < DPL; ++e) o[g][e] = fmaf(pv[g], vf[e], o[g][e]);
      }
    }
  }

  __device__ __forceinline__ void store(float* ow, float* ml, int nh) const {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float l = lp[g];
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) l += __shfl_xor_sync(kFull, l, off);
      if (g < nh) {
        if (lane == 0) {
          ml[g * 2] = m[g];
          ml[g * 2 + 1] = l;
        }
#pragma unroll
        for (int e = 0; e < DPL; ++e) ow[g * D + lane * DPL + e] = o[g][e];
      }
    }
  }
};

// ------------------------------------------------------------------ kernels

// Shared-memory layout of the main kernel (bytes).
template <typename T, int D, class Core>
struct Smem {
  static constexpr int kTileElems = Core::NW * Core::RS;  // of Core::Cache
  static constexpr int kStaging =
      kWarps * Core::kStages * 2 * kTileElems * static_cast<int>(sizeof(typename Core::Cache));
  static constexpr int kEpilogue = kWarps * Core::GC * D * 4;  // reuses the staging area
  static constexpr int kMain = kStaging > kEpilogue ? kStaging : kEpilogue;
  static constexpr int kExtraOff = kMain;
  static constexpr int kMlOff = kExtraOff + ((Core::kExtraBytes + 15) / 16) * 16;
  static constexpr int kMaskOff = kMlOff + kWarps * Core::GC * 2 * 4;
  static constexpr int kBytes = kMaskOff + kWarps * Core::kStages * 4;
};

// At head_dim 64, at most 128 registers per thread (4 CTAs per SM by registers): block ids 2
// tiles ahead had raised the bf16/f16 kernel to 168 without this bound. The A/B builds of
// 2026-11-26 were compiled with it (their d 64 SASS differs from the kernel before them).
template <typename T, int D, class Core>
__global__ void __launch_bounds__(kThreads, D == 64 ? 4 : 1)
    paged_attention_main(const KernelArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  using L = Smem<T, D, Core>;
  using C = typename Core::Cache;  // T, or uint8_t (e4m3) for fp8 caches
  constexpr bool kFp8 = !std::is_same_v<C, T>;
  constexpr int NW = Core::NW, RS = Core::RS, kStages = Core::kStages, GC = Core::GC;
  constexpr bool kSwz = Core::kSwizzle;
  // Block ids kBtAhead tiles ahead, except for bf16/f16/f32 caches at head_dim 64, where the
  // loop with 2 measured 1.5 % slower than with 1 on the H200 (PERFORMANCE.md, "Block ids
  // further ahead"); with 1, their SASS is that of the measured -DXK_DECODE_BT_AHEAD=1 build.
  constexpr int kAhead = !kFp8 && D == 64 ? 1 : kBtAhead;

  // Launched with PDL: nothing global is touched before the previous kernel has finished.
  // The reduce kernel (PDL too) may then be scheduled; it waits for this grid to finish.
  pdl_wait();
  pdl_launch_dependents();
  const int HC = a.Hkv * a.chunks;
  int idx = blockIdx.x;
  const int hc = idx % HC;
  idx /= HC;
  const int part = idx % a.T;
  const int s = idx / a.T;
  const int kvh = hc / a.chunks, chunk = hc % a.chunks;
  const int h0 = kvh * a.G + chunk * GC;  // first q head of this CTA
  const int nh = min(GC, a.G - chunk * GC);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int32_t* bt_row = a.bt + static_cast<int64_t>(s) * a.max_blocks;
  // Partition 0 of a sequence without a window starts at token 0, so the block ids of its
  // first tiles are known before the length: their loads overlap the length's instead of
  // following it (one dependent memory round trip less before the first copy).
  constexpr int kFirst = kStages - 1;  // the prologue's copies
  const bool early_ids = kAhead > 1 && part == 0 && a.window == 0;
  int first_ids[kFirst];
#pragma unroll
  for (int i = 0; i < kFirst; ++i) {
    const int b = ((warp + i * kWarps) * NW + lane) >> a.log2_bs;
    first_ids[i] = (early_ids && lane < NW && b < a.max_blocks) ? __ldg(bt_row + b) : -1;
  }
  const SeqPart sp = seq_partition(a, s);
  if (part >= sp.n) return;

  T* out = static_cast<T*>(a.out) + (static_cast<int64_t>(s) * a.Hq + h0) * D;
  if (sp.hi <= sp.lo) {  // empty sequence: zeros
    for (int e = tid; e < nh * D; e += kThreads) out[e] = from_float<T>(0.f);
    return;
  }
  const int p_lo = sp.lo + part * sp.P;
  const int p_hi = min(sp.hi, p_lo + sp.P);

  C* staging = reinterpret_cast<C*>(smem) + warp * kStages * 2 * L::kTileElems;
  uint32_t* masks = reinterpret_cast<uint32_t*>(smem + L::kMaskOff) + warp * kStages;
  const int ntile = (p_hi - p_lo + NW - 1) / NW;
  const int my_n = warp < ntile ? (ntile - warp + kWarps - 1) / kWarps : 0;

  auto tile_pos = [&](int i) { return p_lo + (warp + i * kWarps) * NW; };
  // Block id of this lane's token in the warp's tile i < kFirst (lookup_block's value).
  auto first_id = [&](int i) {
    return early_ids ? (tile_pos(i) + lane < p_hi ? first_ids[i] : -1)
                     : lookup_block<NW>(a, bt_row, tile_pos(i), p_hi, lane);
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < my_n) {
      C* kb = staging + (2 * st) * L::kTileElems;
      const uint32_t mk = load_tile<C, D, NW, RS, kSwz>(kb, kb + L::kTileElems, a, first_id(st),
                                                        tile_pos(st), kvh, lane);
      if (lane == 0) masks[st] = mk;
    }
    cp_async_commit();
  }
  int ahead[kAhead];  // block ids of the warp's tiles nx, nx + 1, ... (nx: the next copy)
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    ahead[i] = lookup_block<NW>(a, bt_row, tile_pos(kStages - 1 + i), p_hi, lane);
  }

  // The query goes to shared memory while the first K/V tiles are in flight.
  const T* qg = static_cast<const T*>(a.q) + (static_cast<int64_t>(s) * a.Hq + h0) * D;
  Core::stage_q(qg, nh, smem + L::kExtraOff, tid);
  __syncthreads();
  Core core;
  core.init(smem + L::kExtraOff, warp, lane);
  for (int it = 0; it < my_n; ++it) {
    const int nx = it + kStages - 1;
    if (nx < my_n) {
      const int st = nx % kStages;
      C* kb = staging + (2 * st) * L::kTileElems;
      const uint32_t mk = load_tile<C, D, NW, RS, kSwz>(kb, kb + L::kTileElems, a, ahead[0],
                                                        tile_pos(nx), kvh, lane);
      if (lane == 0) masks[st] = mk;
#pragma unroll
      for (int i = 0; i + 1 < kAhead; ++i) ahead[i] = ahead[i + 1];
      ahead[kAhead - 1] = lookup_block<NW>(a, bt_row, tile_pos(nx + kAhead), p_hi, lane);
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int st = it % kStages;
    const C* kb = staging + (2 * st) * L::kTileElems;
    core.step(kb, kb + L::kTileElems, masks[st], a);
    __syncwarp();
  }
  cp_async_wait<0>();
  __syncthreads();  // staging area is reused below

  float* ow = reinterpret_cast<float*>(smem);
  float* ml = reinterpret_cast<float*>(smem + L::kMlOff);
  core.store(ow + warp * GC * D, ml + warp * GC * 2, nh);
  __syncthreads();

  // Merge the warps; write the output (one partition) or the partial (several).
  const bool single = sp.n == 1;
  float* ws_acc = a.ws;
  float* ws_ml = a.ws + static_cast<int64_t>(a.S) * a.Hq * a.T * D;
  for (int e = tid; e < nh * (D / 4); e += kThreads) {
    const int g = e / (D / 4), d = (e % (D / 4)) * 4;
    float mw[kWarps];
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      mw[w] = ml[(w * GC + g) * 2];
      mx = fmaxf(mx, mw[w]);
    }
    const float b = safe_max(mx);
    float lsum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float c = exp2f(mw[w] - b);
      lsum = fmaf(c, ml[(w * GC + g) * 2 + 1], lsum);
      const float4 x = *reinterpret_cast<const float4*>(ow + (w * GC + g) * D + d);
      acc.x = fmaf(c, x.x, acc.x);
      acc.y = fmaf(c, x.y, acc.y);
      acc.z = fmaf(c, x.z, acc.z);
      acc.w = fmaf(c, x.w, acc.w);
    }
    if (single) {
      float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      if constexpr (kFp8) inv *= a.out_scale;
      T* o = out + g * D + d;
      o[0] = from_float<T>(acc.x * inv);
      o[1] = from_float<T>(acc.y * inv);
      o[2] = from_float<T>(acc.z * inv);
      o[3] = from_float<T>(acc.w * inv);
    } else {
      const int64_t row = (static_cast<int64_t>(s) * a.Hq + h0 + g) * a.T + part;
      *reinterpret_cast<float4*>(ws_acc + row * D + d) = acc;
      if (d == 0) {
        ws_ml[row * 2] = mx;
        ws_ml[row * 2 + 1] = lsum;
      }
    }
  }
}

// Combines the partitions of each (sequence, q head); sequences with one partition were
// finished by the main kernel. One CTA of kReduceWarps warps per (sequence, q head): every
// warp reads the (m, l) of all partitions (lanes hold two each) and finds the common
// maximum; warp w sums partitions w, w + kReduceWarps, ... (lanes over D); the warps' sums
// are added through shared memory. Everything the sum needs is loaded in one round trip
// after the main kernel: the (m, l) of every partition slot (a.T of them), the warp's first
// kReduceBatch accumulators and the sequence's length are all in flight together, and the
// slots past the partitions the main kernel used (never written) are dropped once they
// arrive. (Loading the length first, then (m, l), then the accumulators, as before, put
// three dependent round trips between the main kernel's end and the output.)
constexpr int kReduceWarps = 4;
static_assert(kMaxParts <= 64, "the reduce kernel holds two partitions per lane");

// Accumulators per warp in flight at once: every partition slot in one round up to head_dim
// 128 (64 registers of them per lane), half of them at 256.
template <int D>
constexpr int kReduceBatch = (D <= 128 ? kMaxParts : kMaxParts / 2) / kReduceWarps;

template <typename T, int D, bool kScaled = false>
__global__ void __launch_bounds__(32 * kReduceWarps) paged_attention_reduce(const KernelArgs a) {
  constexpr int kDpl = D / 32;
  constexpr int kBatch = kReduceBatch<D>;
  __shared__ __align__(16) float sums[kReduceWarps][D];
  pdl_wait();  // the main kernel's partials are complete and visible
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = blockIdx.x / a.Hq, h = blockIdx.x % a.Hq;
  const int len = __ldg(a.lens + s);
  const int64_t row = (static_cast<int64_t>(s) * a.Hq + h) * a.T;
  const float* ws_acc = a.ws + row * D;
  const float* ws_ml = a.ws + static_cast<int64_t>(a.S) * a.Hq * a.T * D + row * 2;
  // The loads are volatile asm so that the compiler issues them here, before the length is
  // used: with plain loads it had sunk most of them below the (then early) return for
  // one-partition sequences, behind the length's round trip. ptxas still places two of the
  // accumulator loads after the length's division at head_dim 128, four at 256 (none at 64).
  auto ld2 = [](const float* src, float* x) {
    asm volatile("ld.global.v2.f32 {%0, %1}, [%2];" : "=f"(x[0]), "=f"(x[1]) : "l"(src));
  };
  auto ld4 = [](const float* src, float* x) {
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                 : "l"(src));
  };
  // Partition slot p's accumulator: this lane's kDpl values (any slot < a.T is inside the
  // workspace, written or not).
  auto load_acc = [&](int p, float (&x)[kDpl]) {
    const float* src = ws_acc + static_cast<int64_t>(p) * D + lane * kDpl;
    if constexpr (kDpl % 4 == 0) {
#pragma unroll
      for (int e = 0; e < kDpl; e += 4) ld4(src + e, x + e);
    } else {
      ld2(src, x);
    }
  };
  float ml0[2] = {-INFINITY, 0.f}, ml1[2] = {-INFINITY, 0.f};
  if (lane < a.T) ld2(ws_ml + 2 * lane, ml0);
  if (lane + 32 < a.T) ld2(ws_ml + 2 * (lane + 32), ml1);
  float x[kBatch][kDpl];
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    const int p = warp + j * kReduceWarps;
    if (p < a.T) load_acc(p, x[j]);
  }
  // A sequence with one partition (finished by the main kernel) is not stored below; no
  // early return here, which let ptxas sink loads below it.
  const SeqPart sp = seq_partition_of(a, len);
  const float m0 = lane < sp.n ? ml0[0] : -INFINITY, l0 = lane < sp.n ? ml0[1] : 0.f;
  const float m1 = lane + 32 < sp.n ? ml1[0] : -INFINITY, l1 = lane + 32 < sp.n ? ml1[1] : 0.f;
  float mx = fmaxf(m0, m1);
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
  const float b = safe_max(mx);
  const float w0 = exp2f(m0 - b), w1 = exp2f(m1 - b);  // 0 for absent partitions
  float acc[kDpl];
#pragma unroll
  for (int e = 0; e < kDpl; ++e) acc[e] = 0.f;
  // Adds partition p's accumulator (x, loaded before) with its weight; the values of a slot
  // past sp.n are garbage and are never used (a select, not a product with weight 0).
  auto add = [&](int p, const float (&xp)[kDpl]) {  // p warp-uniform
    const float w = __shfl_sync(kFull, p < 32 ? w0 : w1, p & 31);
    if (p < sp.n) {
#pragma unroll
      for (int e = 0; e < kDpl; ++e) acc[e] = fmaf(w, xp[e], acc[e]);
    }
  };
#pragma unroll
  for (int j = 0; j < kBatch; ++j) add(warp + j * kReduceWarps, x[j]);
  // Slots beyond the first round (head_dim 256 with more than 32 partitions).
  for (int p = warp + kBatch * kReduceWarps; p < sp.n; p += kReduceWarps) {
    float xp[kDpl];
    load_acc(p, xp);
    add(p, xp);
  }
#pragma unroll
  for (int e = 0; e < kDpl; ++e) sums[warp][lane * kDpl + e] = acc[e];
  float lsum = w0 * l0 + w1 * l1;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) lsum += __shfl_xor_sync(kFull, lsum, off);
  __syncthreads();
  float inv = lsum > 0.f ? 1.f / lsum : 0.f;
  if constexpr (kScaled) inv *= a.out_scale;  // fp8 caches: v_scale
  if (sp.n <= 1) return;
  T* o = static_cast<T*>(a.out) + (static_cast<int64_t>(s) * a.Hq + h) * D;
  for (int d = threadIdx.x; d < D; d += 32 * kReduceWarps) {
    float x = 0.f;
#pragma unroll
    for (int w = 0; w < kReduceWarps; ++w) x += sums[w][d];
    o[d] = from_float<T>(x * inv);
  }
}

// ------------------------------------------------------------------ host side

inline std::string cuda_error(const char* what, cudaError_t e) {
  return std::string("paged_attention: ") + what + ": " + cudaGetErrorName(e) + " (" +
         cudaGetErrorString(e) + ")";
}

// Raises the kernel's dynamic shared-memory limit and returns its CTAs per SM, once per
// (kernel, device): function attributes are per device context.
inline std::string prepare_kernel(const void* kernel, int smem, int device, int* ctas_per_sm) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  auto it = cache.find(key);
  if (it != cache.end()) {
    *ctas_per_sm = it->second;
    return "";
  }
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return cuda_error("cudaFuncSetAttribute", e);
  int occ = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem);
  if (e != cudaSuccess) return cuda_error("cudaOccupancyMaxActiveBlocksPerMultiprocessor", e);
  if (occ < 1) {
    return "paged_attention: the kernel does not fit on this GPU (" + std::to_string(smem) +
           " bytes of shared memory per CTA)";
  }
  cache[key] = occ;
  *ctas_per_sm = occ;
  return "";
}

// Raises *smem (dynamic shared memory per CTA) so that at most `cap` CTAs fit an SM: one more
// would need more than the SM has, counting each CTA's reserved shared memory.
inline std::string cap_ctas_per_sm(int cap, int device, int* smem) {
  int per_sm = 0, reserved = 0;
  cudaError_t e =
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", e);
  e = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", e);
  const int floor = per_sm / (cap + 1) - reserved + 16;
  if (*smem < floor) *smem = floor;
  return "";
}

template <typename T, int D, class Core>
inline std::string launch_typed(cudaStream_t stream, const Params& p, KernelArgs a) {
  using L = Smem<T, D, Core>;
  auto main_kernel = paged_attention_main<T, D, Core>;
  int device = 0, sms = 0, ctas_per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", e);
  std::string err;
  int smem = L::kBytes;
  if constexpr (Core::kMaxCtasPerSm > 0) {
    err = cap_ctas_per_sm(Core::kMaxCtasPerSm, device, &smem);
    if (!err.empty()) return err;
  }
  err = prepare_kernel(reinterpret_cast<const void*>(main_kernel), smem, device, &ctas_per_sm);
  if (!err.empty()) return err;

  a.chunks = (a.G + Core::GC - 1) / Core::GC;
  a.cta_tile = kWarps * Core::NW;
  const int64_t pairs = p.num_seqs * p.num_kv_heads * a.chunks;
  // Partitions fill at most kPartitionCtasPerSm CTAs per SM: more resident CTAs add
  // partials and a reduce kernel without adding bandwidth (PERFORMANCE.md: d 64 at 4 CTAs/SM).
  const int64_t slots =
      static_cast<int64_t>(sms) * (ctas_per_sm < kPartitionCtasPerSm ? ctas_per_sm
                                                                     : kPartitionCtasPerSm);
  int64_t parts = slots / pairs;
  const int64_t max_parts = MaxPartitions(p.num_seqs, p.max_blocks_per_seq * p.block_size);
  if (parts > max_parts) parts = max_parts;
  if (parts < 1) parts = 1;
  a.T = static_cast<int>(parts);
  if (parts > 1) {
    const int64_t need = p.num_seqs * p.num_q_heads * parts * (p.head_dim + 2);
    if (p.workspace == nullptr || p.workspace_elems < need) {
      return "paged_attention: workspace has " + std::to_string(p.workspace_elems) +
             " f32 elements, the kernel needs " + std::to_string(need) +
             " (size it with workspace_size())";
    }
  }
  const int64_t grid = p.num_seqs * parts * p.num_kv_heads * a.chunks;
  if (grid > INT_MAX) return "paged_attention: problem too large for one launch";
  const bool pdl = pdl_enabled(device);
  e = launch_kernel(main_kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem,
                    stream, pdl, a);
  if (e != cudaSuccess) return cuda_error("launching the main kernel", e);
  if (parts > 1) {
    const int64_t rgrid = p.num_seqs * p.num_q_heads;
    if (rgrid > INT_MAX) return "paged_attention: problem too large for one launch";
    e = launch_kernel(paged_attention_reduce<T, D, !std::is_same_v<typename Core::Cache, T>>,
                      dim3(static_cast<unsigned>(rgrid)), dim3(32 * kReduceWarps), 0, stream,
                      pdl, a);
    if (e != cudaSuccess) return cuda_error("launching the reduce kernel", e);
  }
  return "";
}

template <int D>
inline std::string launch_head_dim(cudaStream_t stream, const Params& p, const KernelArgs& a) {
  if (p.fp8_cache) {
    // Up to 8 q heads per kv head: tokens on the MMA rows (Fp8MmaCoreT); more: heads.
    const bool tokens_on_rows = kFp8TokensOnRows && a.G <= Fp8MmaCoreT<__half, D>::GC;
    switch (p.dtype) {
      case DType::kBF16:
        if (tokens_on_rows) {
          return launch_typed<__nv_bfloat16, D, Fp8MmaCoreT<__nv_bfloat16, D>>(stream, p, a);
        }
        return launch_typed<__nv_bfloat16, D, Fp8MmaCore<__nv_bfloat16, D>>(stream, p, a);
      case DType::kF16:
        if (tokens_on_rows) return launch_typed<__half, D, Fp8MmaCoreT<__half, D>>(stream, p, a);
        return launch_typed<__half, D, Fp8MmaCore<__half, D>>(stream, p, a);
      case DType::kF32:
        return "paged_attention: f8e4m3fn caches need bf16 or f16 queries";
    }
  }
  switch (p.dtype) {
    case DType::kBF16:
      return launch_typed<__nv_bfloat16, D, MmaCore<__nv_bfloat16, D>>(stream, p, a);
    case DType::kF16:
      return launch_typed<__half, D, MmaCore<__half, D>>(stream, p, a);
    case DType::kF32:
      if (a.G == 1) return launch_typed<float, D, SimtCore<float, D, 1>>(stream, p, a);
      if (a.G <= 4) return launch_typed<float, D, SimtCore<float, D, 4>>(stream, p, a);
      return launch_typed<float, D, SimtCore<float, D, 8>>(stream, p, a);
  }
  return "paged_attention: unknown dtype";
}

}  // namespace detail

inline std::string launch_paged_attention(cudaStream_t stream, const Params& p) {
  using detail::KernelArgs;
  if (p.num_seqs == 0 || p.num_q_heads == 0) return "";
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0)
    return "paged_attention: num_q_heads must be a multiple of num_kv_heads";
  if (!IsSupportedBlockSize(p.block_size))
    return "paged_attention: block_size must be 16, 32, 64, 128 or 256";
  const int64_t capacity = p.max_blocks_per_seq * p.block_size;
  if (capacity >= (int64_t{1} << 30) || p.num_blocks > INT_MAX || p.num_seqs > INT_MAX ||
      p.num_q_heads > INT_MAX)
    return "paged_attention: sizes out of range (context capacity must be < 2^30 tokens)";
  KernelArgs a{};
  a.q = p.query;
  a.k = p.key_cache;
  a.v = p.value_cache;
  a.bt = p.block_tables;
  a.lens = p.seq_lens;
  a.out = p.out;
  a.ws = p.workspace;
  a.S = static_cast<int>(p.num_seqs);
  a.Hq = static_cast<int>(p.num_q_heads);
  a.Hkv = static_cast<int>(p.num_kv_heads);
  a.G = static_cast<int>(p.num_q_heads / p.num_kv_heads);
  a.log2_bs = Log2BlockSize(p.block_size);
  a.num_blocks = static_cast<int>(p.num_blocks);
  a.max_blocks = static_cast<int>(p.max_blocks_per_seq);
  a.window = p.sliding_window <= 0 ? 0
             : (p.sliding_window >= INT_MAX ? INT_MAX : static_cast<int>(p.sliding_window));
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
  switch (p.head_dim) {
    case 64: return detail::launch_head_dim<64>(stream, p, a);
    case 128: return detail::launch_head_dim<128>(stream, p, a);
    case 256: return detail::launch_head_dim<256>(stream, p, a);
    default: return "paged_attention: head_dim must be 64, 128 or 256";
  }
}

}  // namespace xla_kernels::paged_attention
