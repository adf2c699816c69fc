// The grouped GEMM's tile scheduler: which rows, expert and columns a CTA computes. The sort
// (moe_routing.cuh) writes the tile table on the device, so the grid (moe.cu's LaunchGemm) is
// sized for the most tiles a sort can make: ceil(pairs / BM) + min(experts, pairs) along x
// (at most one partial tile per expert), ceil(N / BN) along y; CTAs past the table's tiles
// leave at once.
#pragma once

#include "moe_gemm_config.cuh"

namespace xla_kernels::moe {

struct GemmTile {
  int expert, row0;  // tile table entry blockIdx.x: the expert and its first sorted row
  int rows;          // sorted rows from row0 (at most BM), all routed to `expert`
  int64_t n0;        // the first of the BN output columns, block blockIdx.y
};

// This CTA's tile; false past the table's tiles (the whole CTA: before any barrier).
template <int BM, int BN>
__device__ __forceinline__ bool ScheduleTile(const GemmParams& p, GemmTile* t) {
  const int tile = blockIdx.x;
  if (tile >= *p.tile_count) return false;
  t->expert = p.tiles[2 * tile];
  t->row0 = p.tiles[2 * tile + 1];
  t->rows = min(BM, p.offsets[t->expert + 1] - t->row0);
  t->n0 = static_cast<int64_t>(blockIdx.y) * BN;
  return true;
}

}  // namespace xla_kernels::moe
