// The paged K/V cache as the attention kernels walk it, one definition for paged_attention
// and ragged_paged_attention (every kernel of both, host strides in paged_cache_checks.h):
// a token position of a sequence -> its block id (block table) -> the element offset of its
// row for one kv head. A block id outside [0, num_blocks) marks tokens that hold no data:
// kernels test valid() before forming any address from it.
//
//   const int32_t* row = a.cache.table(s);
//   const int blk = a.cache.block_id(row, pos);      // pos < capacity(): in bounds
//   if (a.cache.valid(blk)) copy(k + a.cache.offset(blk, pos, kvh), ...);
//
// Element strides (block, slot, kv head) describe every layout the kernels take:
//   vllm   [num_blocks, block_size, num_kv_heads, head_dim]
//   pallas [num_kv_heads, num_blocks, block_size, head_dim]
//   fused  [num_blocks, block_size, 2 * num_kv_heads, head_dim] (one array; the value rows
//          start head_dim elements after the key rows, so the value pointer is offset)
#pragma once

#include <cstdint>

namespace xla_kernels::paged_cache {

struct View {
  // The view of block tables of max_blocks entries per sequence over a cache of num_blocks
  // blocks of block_size tokens (a power of two) with the given element strides; the
  // caller has checked that the sizes fit an int.
  static View Make(const int32_t* block_tables, int64_t num_blocks, int64_t block_size,
                   int64_t max_blocks, int64_t stride_block, int64_t stride_slot,
                   int64_t stride_head) {
    int log2 = 0;
    while ((int64_t{1} << log2) < block_size) ++log2;
    return View{block_tables, static_cast<int>(num_blocks), static_cast<int>(max_blocks), log2,
                stride_block, stride_slot, stride_head};
  }

  const int32_t* bt;     // block tables [num_seqs, max_blocks]
  int num_blocks;        // ids outside [0, num_blocks) hold no data
  int max_blocks;        // block table entries per sequence
  int log2_bs;           // log2(block_size)
  int64_t sb, ss, sh;    // element strides: block, slot, kv head

  // Sequence s's row of the block tables.
  __device__ __forceinline__ const int32_t* table(int s) const {
    return bt + static_cast<int64_t>(s) * max_blocks;
  }
  // Index of the block holding token pos, and the token's slot in it.
  __device__ __forceinline__ int block_index(int pos) const { return pos >> log2_bs; }
  __device__ __forceinline__ int slot(int pos) const { return pos & ((1 << log2_bs) - 1); }
  // Blocks that hold a sequence's first len tokens, at most max_blocks.
  __device__ __forceinline__ int blocks(int len) const {
    const int n = (len + (1 << log2_bs) - 1) >> log2_bs;
    return n < max_blocks ? n : max_blocks;
  }
  // Tokens a sequence's table can address.
  __device__ __forceinline__ int capacity() const { return max_blocks << log2_bs; }
  // Block id of token pos (< capacity(), so the table read is in bounds).
  __device__ __forceinline__ int block_id(const int32_t* row, int pos) const {
    return __ldg(row + block_index(pos));
  }
  // Entry b of a table row, or -1 past its end.
  __device__ __forceinline__ int entry_or_none(const int32_t* row, int b) const {
    return b < max_blocks ? __ldg(row + b) : -1;
  }
  // Whether a block id may form an address.
  __device__ __forceinline__ bool valid(int blk) const { return blk >= 0 && blk < num_blocks; }
  // Element offset of token pos's row in block blk (a valid id), from kv head 0's; of kv
  // head kvh's rows from the cache's start; and of the token's row for kv head kvh.
  __device__ __forceinline__ int64_t row_offset(int blk, int pos) const {
    return static_cast<int64_t>(blk) * sb + static_cast<int64_t>(slot(pos)) * ss;
  }
  __device__ __forceinline__ int64_t head_offset(int kvh) const {
    return static_cast<int64_t>(kvh) * sh;
  }
  __device__ __forceinline__ int64_t offset(int blk, int pos, int kvh) const {
    return row_offset(blk, pos) + head_offset(kvh);
  }
};

}  // namespace xla_kernels::paged_cache
