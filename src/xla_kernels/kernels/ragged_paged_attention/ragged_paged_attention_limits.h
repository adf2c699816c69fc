// ragged_paged_attention's limits and tiling: the one definition. The CPU and CUDA handlers
// include it; the Python declaration reads the constants from this file
// (xla_kernels.kernel_kit.read_constants). Plain C++, usable from host and device code.
#pragma once

#include <cstdint>

namespace xla_kernels::ragged_paged_attention {

constexpr int64_t kHeadDims[] = {64, 128, 256};
constexpr int64_t kBlockSizes[] = {16, 32, 64, 128, 256};

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

inline bool IsSupportedHeadDim(int64_t d) {
  for (int64_t x : kHeadDims) if (x == d) return true;
  return false;
}

inline bool IsSupportedBlockSize(int64_t b) {
  for (int64_t x : kBlockSizes) if (x == b) return true;
  return false;
}

// log2 of a supported block size (a power of two): the kernels split a token position into
// block and slot with a shift and a mask.
inline int Log2BlockSize(int64_t b) {
  int l = 0;
  while ((int64_t{1} << l) < b) ++l;
  return l;
}

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
