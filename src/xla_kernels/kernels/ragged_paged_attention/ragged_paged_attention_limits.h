// ragged_paged_attention's limits and tiling: the one definition (the head dims and block sizes
// it shares with paged_attention are in xla_kernels/attention_limits.h). The CPU and CUDA handlers
// include it; the Python declaration reads the constants from this file
// (xla_kernels.kernel_kit.read_constants). Plain C++, usable from host and device code.
#pragma once

#include <cstdint>

#include "xla_kernels/attention_limits.h"

namespace xla_kernels::ragged_paged_attention {

// CUDA tiling. A CTA serves one kv head and a tile of "packed rows" of one sequence: packed
// row r is (query row r / G, q head r % G of the kv head's group), G = num_q_heads /
// num_kv_heads. 4 warps; each warp owns kRowsPerWarp* consecutive packed rows.
constexpr int64_t kWarps = 4;
constexpr int64_t kRowsPerWarpMma = 16;   // bf16/f16: one m16 slab of mma.sync m16n8k16
constexpr int64_t kRowsPerWarpSimt = 8;   // f32: CUDA cores
constexpr int64_t kKvTile = 32;           // cache tokens per shared-memory tile

// Most packed rows (num_tokens * num_q_heads) and cache capacity the kernels accept: both
// must stay addressable with 32-bit indices on the device.
constexpr int64_t kMaxPackedRows = 1073741824;  // 2^30
constexpr int64_t kMaxCapacity = 1073741824;    // 2^30

// Packed rows per CTA for a dtype path.
inline int64_t TileRows(bool tensor_cores) {
  return kWarps * (tensor_cores ? kRowsPerWarpMma : kRowsPerWarpSimt);
}

// CTAs along x of the CUDA grid: an upper bound of the sum over sequences of
// ceil(q_len * G / tile_rows), from static shapes only (q_lens are device data).
inline int64_t MaxTiles(int64_t num_tokens, int64_t group, int64_t max_seqs, int64_t tile_rows) {
  return (num_tokens * group + tile_rows - 1) / tile_rows + max_seqs;
}

}  // namespace xla_kernels::ragged_paged_attention
