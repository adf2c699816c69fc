// The all-reduce protocol between the ranks (GPUs) of one host: the workspace layout, how the
// work is cut into units, shares and blocks, and the epoch barrier. One header for the CPU
// simulation (protocol_cpu.cc) and the CUDA kernel: each supplies a Flags policy
//
//   static void store_release(uint32_t* flag, uint32_t value);   // a peer's flag
//   static uint32_t load_acquire(const uint32_t* flag);          // this rank's flag
//   static int64_t now_ns();                                     // a monotonic clock
//   static void pause();                                         // between two polls
//
// (CPU: std::atomic_ref with memory_order_release/acquire; CUDA: st.release.sys /
// ld.acquire.sys, %globaltimer, __nanosleep). docs/design/allreduce.md is the specification.
#pragma once

#include <cstddef>
#include <cstdint>

// The protocol's functions run on the host (the simulation) and in the CUDA kernel.
#if defined(__CUDACC__)
#define XK_ALLREDUCE_HD __host__ __device__
#else
#define XK_ALLREDUCE_HD
#endif

namespace xk::allreduce {

inline constexpr int kMaxRanks = 8;
// Every block must be resident at once on CUDA (a block spins on its peers' block of the same
// index), so the grid never exceeds the SM count; 64 bounds the flag arrays.
inline constexpr int kMaxBlocks = 64;
inline constexpr size_t kAlign = 128;

enum Mode : int32_t { kOneShot = 0, kTwoShot = 1 };

// The head of each rank's workspace. Counters start at 0 (the workspace is zeroed once, when
// it is created) and are never reset: every barrier has a new epoch.
struct Signal {
  // Written by this rank's block b only (no atomics): the epoch of its last barrier with
  // each peer.
  uint32_t self_counter[kMaxBlocks][kMaxRanks];
  // Written by the peers: peer p's block b stores the epoch e of its barrier to
  // peer_counter[e & 1][b][p] (release); this rank's block b waits for it (acquire). Two
  // slots by parity: a peer can be one barrier ahead (it passed e, this block has not read
  // e yet) and never two (it cannot pass e + 1 before this block arrives at e + 1).
  uint32_t peer_counter[2][kMaxBlocks][kMaxRanks];
  // This rank's calls so far: their parity picks the input region (one-shot has a single
  // barrier per call, so a call must not overwrite what peers may still read of the one
  // before). Every block reads it when the call starts; the call's last block to finish
  // (`done` is its ticket) advances it, and the next call starts after this one ended.
  uint32_t calls;
  uint32_t done;
};

XK_ALLREDUCE_HD constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

inline constexpr size_t kSignalBytes = round_up(sizeof(Signal), kAlign);

// Byte offsets in one rank's workspace: the Signal, two input regions (by call parity) that
// peers read, and one scratch region (two-shot's reduced share) that peers read.
struct Layout {
  size_t capacity;  // bytes per region: the largest message this workspace takes

  XK_ALLREDUCE_HD constexpr size_t input(uint32_t parity) const { return kSignalBytes + (parity & 1) * capacity; }
  XK_ALLREDUCE_HD constexpr size_t scratch() const { return kSignalBytes + 2 * capacity; }
  XK_ALLREDUCE_HD constexpr size_t total() const { return kSignalBytes + 3 * capacity; }
};

XK_ALLREDUCE_HD constexpr Layout layout(size_t capacity) { return Layout{round_up(capacity, kAlign)}; }

// Work comes in units of `width` elements (the last one may be shorter): a 16-byte pack for a
// plain all-reduce, a row of `hidden` for the fused one (the norm needs whole rows).
XK_ALLREDUCE_HD constexpr int64_t unit_count(int64_t n, int64_t width) { return (n + width - 1) / width; }

struct Range {
  int64_t begin;
  int64_t end;
};

// Rank r's share of the units in two-shot: contiguous, sizes differ by at most one.
XK_ALLREDUCE_HD constexpr Range share(int64_t units, int ranks, int r) {
  int64_t q = units / ranks, extra = units % ranks;
  int64_t begin = r * q + (r < extra ? r : extra);
  return Range{begin, begin + q + (r < extra ? 1 : 0)};
}

// Which units block b touches, in every stage and on every rank: units begin + b,
// begin + b + blocks, ... of a range. Block b of one rank reads only what block b of its
// peers wrote before their barrier, so a barrier between blocks of one index suffices.
// The grid of a call: a function of the call's shape only, so every rank launches the same
// blocks (block b meets block b), never more than max_blocks.
XK_ALLREDUCE_HD constexpr int grid(int64_t units, int ranks, int mode, int max_blocks) {
  int64_t work = mode == kOneShot ? units : (units + ranks - 1) / ranks;
  return int(work < 1 ? 1 : work < max_blocks ? work : max_blocks);
}

template <class F>
XK_ALLREDUCE_HD void for_block_units(Range range, int block, int blocks, F&& f) {
  for (int64_t u = range.begin + block; u < range.end; u += blocks) f(u);
}

// Block `block` of every rank meets: true when all ranks arrived; else false, with the ranks
// that did not arrive within timeout_ns as bits of *missing and the epoch in *epoch.
// Each rank stores its epoch to every rank's flags (itself included), then waits for all.
// The release store publishes this block's earlier writes (its input or its reduced share)
// and orders its earlier reads (of peers' regions) before the peers may overwrite them; the
// acquire load makes the peers' writes visible to this block's later reads.
template <class Flags>
XK_ALLREDUCE_HD bool barrier(Signal* self, Signal* const* peers, int rank, int ranks, int block,
             int64_t timeout_ns, uint32_t* missing, uint32_t* epoch) {
  uint32_t e = 0;
  for (int p = 0; p < ranks; ++p) e = ++self->self_counter[block][p];
  for (int p = 0; p < ranks; ++p) Flags::store_release(&peers[p]->peer_counter[e & 1][block][rank], e);
  uint32_t waiting = (ranks >= 32 ? ~0u : (1u << ranks) - 1);
  int64_t start = Flags::now_ns();
  while (waiting) {
    for (int p = 0; p < ranks; ++p) {
      if ((waiting >> p & 1) && Flags::load_acquire(&self->peer_counter[e & 1][block][p]) == e)
        waiting &= ~(1u << p);
    }
    if (!waiting) break;
    if (Flags::now_ns() - start > timeout_ns) {
      *missing = waiting;
      *epoch = e;
      return false;
    }
    Flags::pause();
  }
  return true;
}

}  // namespace xk::allreduce
