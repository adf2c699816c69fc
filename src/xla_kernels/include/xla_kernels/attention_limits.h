// The head dims and block sizes the attention kernels over a paged KV cache (paged_attention,
// ragged_paged_attention) support: the one definition. Their handlers include it; their Python
// declarations read the constants from this file (xla_kernels.kernel_kit.read_constants).
// Plain C++.
#pragma once

#include <cstdint>

namespace xla_kernels {

constexpr int64_t kHeadDims[] = {64, 128, 256};
constexpr int64_t kBlockSizes[] = {16, 32, 64, 128, 256};

inline bool IsSupportedHeadDim(int64_t d) {
  for (int64_t x : kHeadDims) if (x == d) return true;
  return false;
}

inline bool IsSupportedBlockSize(int64_t b) {
  for (int64_t x : kBlockSizes) if (x == b) return true;
  return false;
}

}  // namespace xla_kernels
