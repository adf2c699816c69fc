// paged_attention's limits and workspace size: the one definition (the head dims and block sizes
// it shares with ragged_paged_attention are in xla_kernels/attention_limits.h). The CUDA and CPU
// handlers include it; the Python declaration reads the constants from this file
// (xla_kernels.kernel_kit.read_constants) and the CPU library exports WorkspaceElems, which a
// test compares with the Python shape rule. Plain C++, usable from host and device code.
#pragma once

#include <cstdint>

#include "xla_kernels/attention_limits.h"

namespace xla_kernels::paged_attention {

// Flash-decoding partitions.
constexpr int64_t kPartMin = 64;       // fewest tokens per partition (before rounding to the tile)
constexpr int64_t kMaxParts = 64;      // most partitions per sequence
constexpr int64_t kPartBudget = 2048;  // most (sequence, partition) pairs in total

// Most partitions per sequence the kernel may use; the workspace is sized for it.
inline int64_t MaxPartitions(int64_t num_seqs, int64_t max_context) {
  if (num_seqs <= 0 || max_context <= 0) return 1;
  int64_t p = (max_context + kPartMin - 1) / kPartMin;
  if (p > kMaxParts) p = kMaxParts;
  const int64_t budget = (kPartBudget + num_seqs - 1) / num_seqs;
  if (p > budget) p = budget;
  return p < 1 ? 1 : p;
}

// f32 elements of workspace the kernel needs at most (1 when it needs none): per (sequence,
// q head, partition) the unnormalized accumulator [head_dim] plus (m, l).
inline int64_t WorkspaceElems(int64_t num_seqs, int64_t num_q_heads, int64_t head_dim,
                              int64_t max_context) {
  const int64_t p = MaxPartitions(num_seqs, max_context);
  if (p <= 1) return 1;
  return num_seqs * num_q_heads * p * (head_dim + 2);
}

}  // namespace xla_kernels::paged_attention
