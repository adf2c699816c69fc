// ragged_paged_attention, shared by its kernels: the arguments, the (sequence, row tile) a
// CTA works on (find_work), the rows' and tiles' token ranges, the K/V tile load through the
// paged cache view, Q staging and output offsets; on the host, CUDA errors as text and the
// kernels' shared-memory attribute.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "../paged_attention/paged_attention.cuh"
#include "ragged_paged_attention_limits.h"
#include "ragged_params.h"
#include "xla_kernels/cuda_mma.cuh"
#include "xla_kernels/paged_cache.cuh"

namespace xla_kernels::ragged_paged_attention {
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
  paged_cache::View cache;  // block tables and the K/V rows' addressing
  const int32_t* cu;
  const int32_t* num_seqs;
  void* out;
  const int32_t* skip;  // non-null and non-zero on the device: the decode path did the work
  int T, Hq, Hkv, G;
  int max_seqs, capacity;
  int window;          // 0: none
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
    const int blk = a.cache.block_id(a.cache.table(s), pos);
    valid = a.cache.valid(blk);  // checked before any address is formed
    if (valid) off = a.cache.offset(blk, pos, kvh);
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

}  // namespace detail
}  // namespace xla_kernels::ragged_paged_attention
