// fused_moe's limits and workspace layout: the one definition. The CPU and CUDA handlers include
// it; the Python declaration reads the constants (xla_kernels.kernel_kit.read_constants) and
// mirrors the workspace formulas in workspace.py (the handlers reject a smaller workspace).
// Plain C++, usable from host and device code.
#pragma once

#include <cstdint>

#include "xla_kernels/fp8_scales.h"  // CeilDiv, ScaleIndex (fp8 weights)
#include "xla_kernels/host_device.h"

namespace xla_kernels::moe {

// Routing: the CUDA sort runs in one CTA with one counter per expert in shared memory and one
// thread per expert for the prefix sums, so experts fit in one CTA's threads.
constexpr int64_t kMaxExperts = 1024;
// The routing kernel keeps a token's chosen experts in registers.
constexpr int64_t kMaxTopK = 32;
// Token pairs (tokens * top_k) addressed with 32-bit indices on the device.
constexpr int64_t kMaxPairs = 268435456;  // 2^28
// The smallest tile of rows (routed token pairs of one expert) the CUDA GEMMs use; the tile
// table is sized for it.
constexpr int64_t kMinTileRows = 16;

// The int32 workspace, in order: topk_ids [pairs], sorted_pairs [pairs] (pair t * top_k + j
// of each row, rows grouped by expert), row_of_pair [pairs], expert_offsets [experts + 1],
// tiles [2 * max_tiles] ((expert, first row) per tile), tile_count [1]. Tiles of at least
// kMinTileRows rows of one expert: at most one partial tile per expert. The formulas use no
// comparison (a symbolic token count exports) and are at least 1 (XLA allocates no empty
// operand).
inline int64_t MaxTiles(int64_t pairs, int64_t experts) {
  return (pairs + kMinTileRows - 1) / kMinTileRows + experts;
}
inline int64_t WorkspaceI32(int64_t pairs, int64_t experts) {
  return 3 * pairs + (experts + 1) + 2 * MaxTiles(pairs, experts) + 1;
}
// The f32 workspace: topk_weights [pairs].
inline int64_t WorkspaceF32(int64_t pairs) { return pairs + 1; }
// The workspace in hidden's dtype: the activation rows [pairs, intermediate] (sorted order),
// then each row's weighted second-GEMM output [pairs, hidden].
inline int64_t WorkspaceAct(int64_t pairs, int64_t intermediate, int64_t hidden) {
  return pairs * (intermediate + hidden) + 1;
}

}  // namespace xla_kernels::moe
