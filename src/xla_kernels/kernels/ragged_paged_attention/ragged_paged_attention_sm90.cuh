// Ragged paged attention, Hopper prefill kernel: wgmma (sm_90a) for bf16/f16 with head_dim
// 64 or 128. Same semantics as the kernels of ragged_paged_attention.cuh (its header
// comment); this file is included by that header after its device helpers (Args, Work,
// find_work, token_range, row_range, logit...) and is not usable on its own.
//
// Design (FlashAttention-3 "lite": intra-warpgroup overlap, but no producer warps, no TMA,
// no ping-pong between the warpgroups):
//  * CTA = 2 warpgroups (256 threads), 128 packed rows of one (sequence, kv head): 64 rows
//    per warpgroup = one wgmma M. Grid and work search as the mma.sync kernel (find_work
//    with 128-row tiles).
//  * K/V: 64-token tiles, gathered through the block table with 16-byte cp.async (4 threads
//    per token, offsets fixed per thread: TileCopyPlan) into 128-byte-swizzled shared memory
//    (cuda_wgmma.cuh's SW128 panels), 4 stages, 2 tiles in flight; a tile's block ids are
//    loaded an iteration before its copy, and the copy is issued after that iteration's
//    wgmmas. Masked tokens (outside the CTA's range, invalid block id) are zero-filled,
//    never read. One CTA barrier per tile (its data landed; the stage of tile j - 2 is free).
//  * Q (128 rows) is staged once, then held in registers as the A operand of every k-step.
//  * Iteration j of a warpgroup: issue S_j = Q K_j^T (register-A wgmma m64n64k16, K-major
//    K from shared memory), then O = alpha_{j-1} O + P_{j-1} V_{j-1} (register-A P,
//    MN-major V: transpose bit; m64n{D}k16), wait for S_j only, run the online softmax of
//    S_j (base 2, f32 statistics, a row's statistics reduced over the 4 lanes of a quad)
//    while the tensor cores work on P_{j-1} V_{j-1}, then wait for it and pack P_j. Without
//    a pending P the same P V runs on zeros (a zero V block), so no wgmma sits in a
//    divergent path (ptxas would serialize them all).
//  * The per-element mask (causal, window, valid token, rows past the tile) runs only on
//    tiles that need it: a warpgroup's tile is "full" when every token is valid and every
//    one of its 64 rows attends every token of the tile. Full tiles without softcap take
//    exp2(s * scale - max) as one FFMA + ex2.approx.ftz per element.
//  * A warpgroup skips tiles outside its own rows' token range (finishing its pending P V
//    first, while that stage is intact); both warpgroups pass every CTA barrier.
// Dispatch (launch_ragged_paged_attention): bf16/f16, head_dim 64/128, a device of compute
// capability 9.0, the library built for sm_90a (the kernel then has static shared memory;
// the sm_80 / plain sm_90 builds compile it to an empty body without any), and the
// environment variable XLA_KERNELS_RAGGED_WGMMA not "0" (the switch back to the mma.sync
// kernel, for A/B checks). Decode-only batches keep the decode path.
#pragma once

#include "xla_kernels/cuda_wgmma.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

namespace wg = ::xla_kernels::cuda_wgmma;

constexpr int kSm90Threads = 256;  // two warpgroups
constexpr int kSm90Rows = 128;     // packed rows per CTA (64 per warpgroup)
constexpr int kSm90Kv = 64;        // tokens per K/V tile

template <int D>
struct Sm90Config {
  static_assert(D == 64 || D == 128, "the wgmma kernel covers head_dim 64 and 128");
  // Stages of K/V tiles: tile j + 2 loads while tile j's K and tile j - 1's V are read.
  static constexpr int kStages = 4;
  static constexpr int kAhead = 2;  // tiles in flight ahead of the one computed
  static constexpr int kQPanel = kSm90Rows * 128;  // bytes of one 64-column panel of Q
  static constexpr int kKvPanel = kSm90Kv * 128;   // of K or V
  static constexpr int kQBytes = kSm90Rows * D * 2;
  static constexpr int kTileBytes = kSm90Kv * D * 2;
  static constexpr int kZeroBytes = 2 * 16 * 128;  // zero V rows (issue_pv with no tile)
  static constexpr int kBytes =
      kQBytes + kStages * 2 * kTileBytes + kZeroBytes + 1024;  // + alignment
};

// Block id of this thread's token (t0 + tid / 4) of sequence s, or -1 where the token is
// outside [lo, hi) or its block id is invalid (never used to form an address). Split from
// the copy so that the block-table load of a tile is issued an iteration before its copy.
__device__ __forceinline__ int tile_block(const Args& a, int s, int t0, int lo, int hi,
                                          int tid) {
  const int pos = t0 + tid / (kSm90Threads / kSm90Kv);
  if (pos < lo || pos >= hi) return -1;
  const int blk = __ldg(a.bt + static_cast<int64_t>(s) * a.max_blocks + (pos >> a.log2_bs));
  return blk >= 0 && blk < a.num_blocks ? blk : -1;
}

// What a thread copies of every K/V tile, fixed for the whole kernel: its token row j and
// the swizzled byte offsets of its chunks (chunk c = part + 4 i of the row; SW128 puts chunk
// c % 8 of row j at 16 ((c % 8) ^ (j % 8)), in the panel of columns 64 (c / 8) ..).
template <int D>
struct TileCopyPlan {
  static constexpr int kTpt = kSm90Threads / kSm90Kv;  // threads per token
  static constexpr int kChunks = D / 8 / kTpt;         // 16-byte chunks per thread
  int j;                                               // token row of the tile
  int elem;                                            // first element of the thread's chunks
  uint32_t dst[kChunks];                               // byte offsets in a K (or V) tile

  __device__ __forceinline__ explicit TileCopyPlan(int tid) {
    static_assert((D / 8) % kTpt == 0, "row does not split over the token's threads");
    j = tid / kTpt;
    const int part = tid % kTpt;
    elem = part * 8;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = part + kTpt * i;
      dst[i] = (c / 8) * Sm90Config<D>::kKvPanel + wg::sw128_offset(j, c % 8);
    }
  }
};

// 16-byte copy global -> shared (shared-space address), and a 16-byte zero store.
__device__ __forceinline__ void cp_async16_s(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void st_zero16_s(uint32_t smem) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(smem), "r"(0) : "memory");
}

// The thread's token of the tile starting at t0 (block blk from tile_block; -1: zero-filled,
// never read) into the SW128 K and V tiles at shared addresses ks and vs; returns whether it
// holds data.
template <typename T, int D>
__device__ __forceinline__ bool load_kv_tile_sw128(uint32_t ks, uint32_t vs, int* ok,
                                                   const Args& a, const T* kc, const T* vc,
                                                   const TileCopyPlan<D>& plan, int t0,
                                                   int blk) {
  const bool valid = blk >= 0;
  if (valid) {
    const int64_t off = static_cast<int64_t>(blk) * a.sb +
                        static_cast<int64_t>((t0 + plan.j) & ((1 << a.log2_bs) - 1)) * a.ss;
    const T* kp = kc + off;
    const T* vp = vc + off;
#pragma unroll
    for (int i = 0; i < TileCopyPlan<D>::kChunks; ++i) {
      cp_async16_s(ks + plan.dst[i], kp + TileCopyPlan<D>::kTpt * 8 * i);
      cp_async16_s(vs + plan.dst[i], vp + TileCopyPlan<D>::kTpt * 8 * i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < TileCopyPlan<D>::kChunks; ++i) {
      st_zero16_s(ks + plan.dst[i]);
      st_zero16_s(vs + plan.dst[i]);
    }
  }
  if (plan.elem == 0) ok[plan.j] = valid ? 1 : 0;
  return valid;
}

// 2^x with ex2.approx.ftz: exp2f without its subnormal fix-up (a result below 2^-126 becomes
// 0; softmax weights are taken relative to the row maximum, so nothing of weight is lost).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T, int D>
__global__ void __launch_bounds__(kSm90Threads, 1) ragged_wgmma_kernel(const Args a) {
#if XK_HAS_WGMMA
  if (a.skip != nullptr && __ldg(a.skip) != 0) return;
  using C = Sm90Config<D>;
  constexpr int S = C::kStages, kAhead = C::kAhead;
  constexpr int OR = D / 2;  // O accumulator registers per thread
  extern __shared__ unsigned char smem_raw[];
  // Static shared memory exists only in this (sm_90a) body: the host reads it as "built
  // with wgmma" (wgmma_kernel_usable).
  __shared__ Work work;
  __shared__ int tok_ok[S][kSm90Kv];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  unsigned char* qs = smem;
  unsigned char* kv = smem + C::kQBytes;  // stage st: K at 2 st tiles, V at 2 st + 1
  unsigned char* zero_v = kv + 2 * S * C::kTileBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wgi = tid >> 7, wwarp = warp & 3;
  const int kvh = blockIdx.y;
  static_assert(C::kZeroBytes == kSm90Threads * 16, "one 16-byte store per thread");
  *reinterpret_cast<uint4*>(zero_v + tid * 16) = make_uint4(0, 0, 0, 0);
  if (warp == 0) find_work(a, blockIdx.x, kSm90Rows, &work, lane);
  __syncthreads();
  const Work w = work;
  if (w.s < 0) return;  // uniform over the CTA

  const TileRows tr = tile_rows(a, w, kSm90Rows);
  int lo, hi;
  token_range(a, tr, tr.r0, tr.r_end, &lo, &hi);
  const int ntiles = hi > lo ? (hi - lo + kSm90Kv - 1) / kSm90Kv : 0;

  // This thread's part of every K/V tile copy; the caches at this kv head and its chunks.
  const TileCopyPlan<D> plan(tid);
  const uint32_t kv_s = wg::smem_u32(kv);
  const T* kc = static_cast<const T*>(a.k) + static_cast<int64_t>(kvh) * a.sh + plan.elem;
  const T* vc = static_cast<const T*>(a.v) + static_cast<int64_t>(kvh) * a.sh + plan.elem;
  // Prologue: tiles 0 .. kAhead - 1 in flight (one commit group each, empty or not), and
  // the block ids of tile kAhead (blk_next: the copy of tile it + kAhead in iteration it
  // uses the ids loaded one iteration earlier).
  uint32_t okbits = 0;  // bit st: this thread's token of the tile in stage st holds data
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < ntiles) {
      const uint32_t kd = kv_s + 2 * i * C::kTileBytes;
      const int blk = tile_block(a, w.s, lo + i * kSm90Kv, lo, hi, tid);
      const bool v = load_kv_tile_sw128<T, D>(kd, kd + C::kTileBytes, tok_ok[i], a, kc, vc,
                                              plan, lo + i * kSm90Kv, blk);
      okbits |= static_cast<uint32_t>(v) << i;
    }
    cp_async_commit();
  }
  int blk_next = tile_block(a, w.s, lo + kAhead * kSm90Kv, lo, hi, tid);
  // Q: packed rows r0 .. r0 + 127 (zeros past the tile) into SW128 panels.
  {
    constexpr int kCpr = D / 8;
    const T* qg = static_cast<const T*>(a.q);
    for (int c = tid; c < kSm90Rows * kCpr; c += kSm90Threads) {
      const int r = c / kCpr, ch = c % kCpr;
      const int pr = tr.r0 + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (pr < tr.r_end) {
        const int64_t row = static_cast<int64_t>(w.start) + pr / a.G;
        const int64_t head = static_cast<int64_t>(kvh) * a.G + pr % a.G;
        v = *reinterpret_cast<const uint4*>(qg + (row * a.Hq + head) * D + ch * 8);
      }
      *reinterpret_cast<uint4*>(qs + (ch / 8) * C::kQPanel + wg::sw128_offset(r, ch % 8)) = v;
    }
  }

  // This warpgroup's rows and token range; this thread's two rows.
  const int wr0 = tr.r0 + wgi * 64;
  const bool live = wr0 < tr.r_end;
  int wlo = 0, whi = 0;
  if (live) token_range(a, tr, wr0, min(tr.r_end, wr0 + 64), &wlo, &whi);
  const bool wg_whole = wr0 + 64 <= tr.r_end;
  const int wg_pmin = tr.p0 + wr0 / a.G;                        // position of row wr0
  const int wg_lomax = tr.p0 + (wr0 + 63) / a.G - a.window + 1;  // with a window
  const int g0 = lane >> 2, tig = lane & 3;
  const int pr0 = wr0 + wwarp * 16 + g0, pr1 = pr0 + 8;
  int pos0, lo0, pos1, lo1;
  row_range(a, tr, pr0, &pos0, &lo0);
  row_range(a, tr, pr1, &pos1, &lo1);
  // Q in registers: the A fragments (m16n8k16 layout) of this warp's 16 rows for every
  // k-step of S = Q K^T, read once from the staged panels. With Q in shared memory each
  // m64n64k16 would read 2 KB of Q besides 2 KB of K: 128 bytes per clock at the tensor
  // cores' rate, all of the shared-memory bandwidth (and the K/V copies land there too).
  __syncthreads();  // the staged Q
  uint32_t qf[D / 16][4];
  {
    const int r = wgi * 64 + wwarp * 16 + g0;  // this thread's row in the CTA's 128
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // columns 16kk + 2tig (+ 8h), two values each
        const int c = kk * 16 + 2 * tig + 8 * h;
        const unsigned char* p0 = qs + (c / 64) * C::kQPanel + (c % 8) * 2;
        qf[kk][2 * h] = *reinterpret_cast<const uint32_t*>(
            p0 + wg::sw128_offset(r, (c % 64) / 8));
        qf[kk][2 * h + 1] = *reinterpret_cast<const uint32_t*>(
            p0 + wg::sw128_offset(r + 8, (c % 64) / 8));
      }
    }
  }

  // Descriptors: built once, then advanced by constant offsets (the address field is the
  // low 14 bits, in 16-byte units; shared addresses stay below 2^18, so it never carries).
  const uint64_t kv_desc_k = wg::sw128_desc(wg::smem_u32(kv), 16, 1024);
  const uint64_t kv_desc_v = wg::sw128_desc(wg::smem_u32(kv), C::kKvPanel, 1024);
  // 16 zero rows of V (two 64-column panels of 16 rows) for the P V with no pending tile.
  const uint64_t zero_desc = wg::sw128_desc(wg::smem_u32(zero_v), C::kZeroBytes / 2, 1024);
  // Logits without softcap and with a positive scale: the row maximum of the raw dot
  // products times the scale is the maximum of the logits, and exp2(dot * scale - max) is
  // one FFMA + MUFU per element.
  const bool plain = a.cap_mul <= 0.f && a.qk_scale > 0.f;

  float o[OR];
#pragma unroll
  for (int i = 0; i < OR; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // Software pipeline inside the warpgroup (FlashAttention-3's intra-warpgroup overlap):
  // iteration j issues S_j = Q K_j^T, then O += P_{j-1} V_{j-1}, and runs the softmax of S_j
  // while the tensor cores work on P_{j-1} V_{j-1}. pp / ap0 / ap1 / pst hold the previous
  // tile's P (register A operand), its rescale factors and its stage while has_p.
  uint32_t pp[4][4] = {};
  float ap0 = 1.f, ap1 = 1.f;
  int pst = 0;
  bool has_p = false;

  // O *= alpha of the pending tile; O += P V of it (issued and committed, not waited for).
  // Without a pending tile (has_p false) the same instructions run on zeros: P is 0, V is
  // the zero block and alpha 1, so the wgmma needs no divergent path (ptxas would
  // serialize every wgmma of the kernel otherwise).
  auto issue_pv = [&]() {
#pragma unroll
    for (int i = 0; i < OR / 4; ++i) {
      o[4 * i] *= ap0;
      o[4 * i + 1] *= ap0;
      o[4 * i + 2] *= ap1;
      o[4 * i + 3] *= ap1;
    }
    wg::fence_operands(o);
#pragma unroll
    for (int j = 0; j < 4; ++j) wg::fence_operands(pp[j]);
    wg::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t db =
          has_p ? kv_desc_v + (((2 * pst + 1) * C::kTileBytes + j * 16 * 128) >> 4) : zero_desc;
      if constexpr (D == 128) {
        wg::mma_rs_m64n128k16<T>(o, pp[j], db, 1);
      } else {
        wg::mma_rs_m64n64k16<T>(o, pp[j], db, 1);
      }
    }
    wg::wgmma_commit();
  };
  auto wait_pv = [&]() {
    wg::wgmma_wait<0>();
    wg::fence_operands(o);
#pragma unroll
    for (int j = 0; j < 4; ++j) wg::fence_operands(pp[j]);
  };

  for (int it = 0; it < ntiles; ++it) {
    // Tile it has landed (this thread's copies; tile it + 1 may still be in flight); the
    // barrier makes every thread's copies visible and means every warp has finished
    // iteration it - 1, whose last reads were tile it - 1's V: the stage of tile it - 2
    // is free for tile it + 2.
    cp_async_wait<kAhead - 1>();
    wg::fence_proxy_async();  // cp.async / st.shared data -> wgmma (async proxy)
    const int st = it % S;
    const bool all_ok = __syncthreads_and((okbits >> st) & 1u) != 0;
    // Copies of tile it + kAhead (after the wgmmas of this iteration are issued, so that
    // the tensor cores start first), then the block ids of the tile after it.
    auto issue_loads = [&]() {
      const int nx = it + kAhead;
      if (nx < ntiles) {
        const int sn = nx % S;
        const uint32_t kd = kv_s + 2 * sn * C::kTileBytes;
        const bool v = load_kv_tile_sw128<T, D>(kd, kd + C::kTileBytes, tok_ok[sn], a, kc, vc,
                                                plan, lo + nx * kSm90Kv, blk_next);
        okbits = (okbits & ~(1u << sn)) | (static_cast<uint32_t>(v) << sn);
        blk_next = tile_block(a, w.s, lo + (nx + 1) * kSm90Kv, lo, hi, tid);
      }
      cp_async_commit();
    };
    const int t0 = lo + it * kSm90Kv;
    if (!(live && t0 < whi && t0 + kSm90Kv > wlo)) {
      issue_loads();
      // Not this warpgroup's tile: finish the pending P V while its stage is still intact.
      if (has_p) {
        issue_pv();
        wait_pv();
        has_p = false;
        ap0 = ap1 = 1.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) pp[j][0] = pp[j][1] = pp[j][2] = pp[j][3] = 0u;
      }
      continue;
    }
    // S = Q K^T (this warpgroup's 64 rows x 64 tokens); the first k-step overwrites.
    float s[32];
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t koff = 2 * st * C::kTileBytes + (kk / 4) * C::kKvPanel + (kk % 4) * 32;
      if (kk == 0) {
        wg::mma_rs_m64n64k16_kmajor<T, true>(s, qf[kk], kv_desc_k + (koff >> 4));
      } else {
        wg::mma_rs_m64n64k16_kmajor<T, false>(s, qf[kk], kv_desc_k + (koff >> 4));
      }
    }
    wg::wgmma_commit();
    issue_pv();
    issue_loads();
    wg::wgmma_wait<1>();  // S done; P V of the previous tile may still run
    wg::fence_operands(s);

    // Logits and row maxima. Register 4i + e: row pr0 (e < 2) or pr1, token column
    // 8i + 2 tig + (e & 1). The per-element mask runs only on tiles that need it.
    const bool full = all_ok && wg_whole && t0 + kSm90Kv - 1 <= wg_pmin &&
                      (a.window == 0 || t0 >= wg_lomax);
    float mx0 = -INFINITY, mx1 = -INFINITY;
    float sc = 1.f;  // scale still to apply inside the exponent (plain full tiles)
    if (full && plain) {
      sc = a.qk_scale;
    } else if (full) {
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = logit(s[i], a);
    } else {
      // Masked tile; the softcap test is hoisted out of the element loop (ptxas keeps a
      // branch per element otherwise).
      const int* okr = tok_ok[st];
      auto mask = [&](auto f) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = i * 8 + tig * 2 + e;
            const int t = t0 + col;
            const bool ok = okr[col] != 0;
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
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
    const float mn0 = fmaxf(m0, mx0 * sc), mn1 = fmaxf(m1, mx1 * sc);
    const float b0 = safe_max(mn0), b1 = safe_max(mn1);
    const float al0 = fast_exp2(m0 - b0), al1 = fast_exp2(m1 - b1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s[4 * i] = fast_exp2(fmaf(s[4 * i], sc, -b0));
      s[4 * i + 1] = fast_exp2(fmaf(s[4 * i + 1], sc, -b0));
      s[4 * i + 2] = fast_exp2(fmaf(s[4 * i + 2], sc, -b1));
      s[4 * i + 3] = fast_exp2(fmaf(s[4 * i + 3], sc, -b1));
      rs0 += s[4 * i] + s[4 * i + 1];
      rs1 += s[4 * i + 2] + s[4 * i + 3];
    }
    l0 = l0 * al0 + rs0;  // per-lane partial sums; the quad is summed at the end
    l1 = l1 * al1 + rs1;
    wait_pv();
    // P as the register A operand of the next P V: k-step j = token columns 16j .. 16j + 15.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pp[j][0] = pack2<T>(s[8 * j], s[8 * j + 1]);
      pp[j][1] = pack2<T>(s[8 * j + 2], s[8 * j + 3]);
      pp[j][2] = pack2<T>(s[8 * j + 4], s[8 * j + 5]);
      pp[j][3] = pack2<T>(s[8 * j + 6], s[8 * j + 7]);
    }
    ap0 = al0;
    ap1 = al1;
    pst = st;
    has_p = true;
  }
  if (has_p) {  // the last tile's P V (no load was issued after it: its stage is intact)
    issue_pv();
    wait_pv();
  }
  cp_async_wait<0>();

  if (!live) return;
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  T* out = static_cast<T*>(a.out);
  if (pr0 < tr.r_end) {
    uint32_t* o32 = reinterpret_cast<uint32_t*>(out + out_offset(a, w, kvh, pr0, D));
#pragma unroll
    for (int i = 0; i < OR / 4; ++i) o32[i * 4 + tig] = pack2<T>(o[4 * i] * inv0, o[4 * i + 1] * inv0);
  }
  if (pr1 < tr.r_end) {
    uint32_t* o32 = reinterpret_cast<uint32_t*>(out + out_offset(a, w, kvh, pr1, D));
#pragma unroll
    for (int i = 0; i < OR / 4; ++i)
      o32[i * 4 + tig] = pack2<T>(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
  }
#else
  (void)a;  // not built for sm_90a: never launched (wgmma_kernel_usable is false)
#endif
}

}  // namespace xla_kernels::ragged_paged_attention::detail
