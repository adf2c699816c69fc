// The Hopper prefill kernel's consumer warpgroups: Q into registers or shared memory, then
// per K/V tile S = Q K^T and O = alpha O + P V on wgmma, overlapped with the softmax
// (sm90_softmax.cuh), the stages handed back to the producer, turns taken with the other
// consumer (ping-pong); sm90_epilogue.cuh stores O.
#pragma once

#include "sm90_epilogue.cuh"
#include "sm90_softmax.cuh"

namespace xla_kernels::ragged_paged_attention::detail {

// Q of this consumer warpgroup. In registers (qf): the A fragments (m16n8k16 layout) of
// this warp's 16 rows for every k-step of S = Q K^T, loaded once from global memory (zeros
// past the tile's rows). With C::kQSmem instead: the warpgroup's 64 rows staged once into
// its SW128 panels at q_s.
template <typename T, int D, int N, bool kFp8>
__device__ __forceinline__ void sm90_load_q(
    uint32_t (&qf)[Sm90Config<D, N, kFp8>::kQSmem ? 1 : D / 16][4], const Args& a,
    const Work& w, const TileRows& tr, int kvh, int cw, int wr0, int pr0, uint32_t q_s,
    int tid, int wgi, int lane) {
  using C = Sm90Config<D, N, kFp8>;
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
    const int tig = lane & 3, pr1 = pr0 + 8;
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
}

// S = Q K_j^T (this warpgroup's 64 rows x N tokens of stage j % S), issued and committed;
// the first k-step overwrites S. kv_desc_k and q_desc: SW128 descriptors of the stages'
// start and of the warpgroup's Q panels, advanced by constant offsets (the address field is
// the low 14 bits, in 16-byte units; shared addresses stay below 2^18, so it never carries).
template <typename T, int D, int N, bool kFp8>
__device__ __forceinline__ void sm90_issue_s(
    float (&s)[N / 2], const uint32_t (&qf)[Sm90Config<D, N, kFp8>::kQSmem ? 1 : D / 16][4],
    uint64_t kv_desc_k, uint64_t q_desc, int j) {
  using C = Sm90Config<D, N, kFp8>;
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t koff =
        (j % C::kStages) * C::kStageBytes + (kk / 4) * C::kKvPanel + (kk % 4) * 32;
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
}

// O = alpha O + P V_j (V of stage j % S; P the pending register operand pp), issued and
// committed. alpha is 1 for both rows unless a reference maximum moved (rare: see
// sm90_softmax_tile).
template <typename TV, int D, int N, bool kFp8>
__device__ __forceinline__ void sm90_issue_pv(
    float (&o)[Sm90Config<D, N, kFp8>::kOH][Sm90Config<D, N, kFp8>::kOW],
    uint32_t (&pp)[N / 16][4], float ap0, float ap1, uint64_t kv_desc_v, int j) {
  using C = Sm90Config<D, N, kFp8>;
  constexpr int OH = C::kOH, OW = C::kOW, PK = N / 16;
  if (__any_sync(kFull, ap0 != 1.f || ap1 != 1.f)) {
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
    const uint64_t db = kv_desc_v + (((j % C::kStages) * C::kStageBytes + C::kTileBytes +
                                      k * 16 * 128) >> 4);
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
}

// Waits for the issued P V; its registers (O, P) are then the thread's again.
template <int D, int N, bool kFp8>
__device__ __forceinline__ void sm90_wait_pv(
    float (&o)[Sm90Config<D, N, kFp8>::kOH][Sm90Config<D, N, kFp8>::kOW],
    uint32_t (&pp)[N / 16][4]) {
  wg::wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < Sm90Config<D, N, kFp8>::kOH; ++h) wg::fence_operands(o[h]);
#pragma unroll
  for (int k = 0; k < N / 16; ++k) wg::fence_operands(pp[k]);
}

// Consumer warpgroup cw (threads 128 (cw + 1) ..): its 64 rows of the CTA's tile against
// the tiles [jlo, jhi) they attend, out of the ntiles the producer fills from token lo;
// the tiles it does not compute are only waited for and freed (which orders the stages'
// phases), and their turns taken.
template <typename T, int D, int N, bool kFp8>
__device__ __forceinline__ void sm90_consume(const Args& a, const Work& w, const TileRows& tr,
                                             int kvh, int lo, int ntiles, uint32_t q_base,
                                             uint32_t kv_s, const StageBarriers& bars, int tid,
                                             int wgi) {
  using C = Sm90Config<D, N, kFp8>;
  constexpr int S = C::kStages;
  // P and V: f16 on fp8 caches (the producer converts V to f16 whatever the query dtype),
  // the query dtype otherwise.
  using TV = std::conditional_t<kFp8, __half, T>;
  const int lane = tid & 31;
  const uint32_t full = bars.full, empty = bars.empty;

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
  Sm90Rows rows;
  rows.whole = wr0 + 64 <= tr.r_end;
  rows.pmin = tr.p0 + wr0 / a.G;                        // position of row wr0
  rows.lomax = tr.p0 + (wr0 + 63) / a.G - a.window + 1;  // with a window
  const int g0 = lane >> 2;
  rows.tig = lane & 3;
  const int pr0 = wr0 + wwarp * 16 + g0, pr1 = pr0 + 8;
  row_range(a, tr, pr0, &rows.pos0, &rows.lo0);
  row_range(a, tr, pr1, &rows.pos1, &rows.lo1);
  rows.plain = a.cap_mul <= 0.f && a.qk_scale > 0.f;

  uint32_t qf[C::kQSmem ? 1 : D / 16][4];
  const uint32_t q_s = q_base + cw * C::kQWgBytes;
  sm90_load_q<T, D, N, kFp8>(qf, a, w, tr, kvh, cw, wr0, pr0, q_s, tid, wgi, lane);

  const uint64_t kv_desc_k = wg::sw128_desc(kv_s, 16, 1024);
  const uint64_t kv_desc_v = wg::sw128_desc(kv_s, C::kKvPanel, 1024);
  const uint64_t q_desc = wg::sw128_desc(q_s, 16, 1024);

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

  float o[C::kOH][C::kOW];
#pragma unroll
  for (int h = 0; h < C::kOH; ++h) {
#pragma unroll
    for (int i = 0; i < C::kOW; ++i) o[h][i] = 0.f;
  }
  Sm90Stats st;
  uint32_t pp[N / 16][4];  // the pending P (register A operand of P V)
  float s[N / 2];

  // Which tokens of a tile hold data: lane l <= N / 16 reads the block table entry of block
  // (t0 >> log2_bs) + l (every block the tile touches, t0 its first token; -1 past the
  // table), a tile ahead of its use, from global memory: a flag in the stage written by the
  // producer was read late, behind the tile's wgmmas in the shared memory queue (Nsight
  // Compute: the top consumer stall), and racecheck saw its writes race the consumers'
  // reads at two stages (the warp's arrival on "empty" came from lane 0).
  const int32_t* bt_row = a.cache.table(w.s);
  auto load_block_id = [&](int j) -> int {
    const int b = a.cache.block_index(lo + j * N) + lane;
    return lane <= N / 16 ? a.cache.entry_or_none(bt_row, b) : -1;
  };

  pass(0, jlo);
  if (jhi > jlo) {
    // Prologue: S and softmax of the first tile (O is zero: its alpha is irrelevant).
    int block_id = load_block_id(jlo), next_id = -1;
    if (jlo + 1 < jhi) next_id = load_block_id(jlo + 1);
    wait_k(jlo);
    turn_begin();
    sm90_issue_s<T, D, N, kFp8>(s, qf, kv_desc_k, q_desc, jlo);
    turn_end();
    wg::wgmma_wait<0>();
    wg::fence_operands(s);
    release_k(jlo);
    sm90_softmax_tile<N>(s, st, rows, a, lo + jlo * N, block_id);
    sm90_pack_p<TV, N>(pp, s);
    for (int j = jlo + 1; j < jhi; ++j) {
      block_id = next_id;
      if (j + 1 < jhi) next_id = load_block_id(j + 1);
      wait_k(j);
      turn_begin();
      sm90_issue_s<T, D, N, kFp8>(s, qf, kv_desc_k, q_desc, j);
      wait_v(j - 1);
      sm90_issue_pv<TV, D, N, kFp8>(o, pp, st.ap0, st.ap1, kv_desc_v, j - 1);
      turn_end();
      wg::wgmma_wait<1>();  // S_j done; P V of tile j - 1 may still run
      wg::fence_operands(s);
      release_k(j);
      sm90_softmax_tile<N>(s, st, rows, a, lo + j * N, block_id);
      sm90_wait_pv<D, N, kFp8>(o, pp);
      release_v(j - 1);
      sm90_pack_p<TV, N>(pp, s);
    }
    wait_v(jhi - 1);
    sm90_issue_pv<TV, D, N, kFp8>(o, pp, st.ap0, st.ap1, kv_desc_v, jhi - 1);
    sm90_wait_pv<D, N, kFp8>(o, pp);
    release_v(jhi - 1);
  }
  pass(jhi, ntiles);
  if (cw == 0) turn_begin();  // consumer 1's last arrival

  if (!live) return;
  sm90_store_output<T, D, N, kFp8>(o, st, a, w, tr, kvh, cw, wr0, pr0, q_s, tid, wgi, wwarp,
                                   lane);
}

}  // namespace xla_kernels::ragged_paged_attention::detail
