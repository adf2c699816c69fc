// fp8_linear's CUDA tile sizes: the one table (design notes in docs/kernels/fp8_linear.md).
// Plain C++, read by fp8_linear.cu.
#pragma once

namespace xla_kernels::fp8_linear::tuning {

// 8 warps: one per token of a tile in the "dynamic" prologue (each warp finds one row's
// amax), and enough loads in flight per SM for a weight-bound decode.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Tokens per CTA: every weight a warp loads is used for this many tokens from registers;
// more tokens re-read the weight tile from L2 in another CTA (grid.y).
constexpr int kTokens = 8;
// Output rows per warp: each x value read from shared memory serves this many rows. 2 rows
// x 8 warps = 16 rows per CTA, 256 CTAs at out = 4096 (about two per SM on an H100).
constexpr int kRows = 2;
constexpr int kRowsPerCta = kWarps * kRows;
// fp8 weights per lane per load: one 16-byte load.
constexpr int kVec = 16;
constexpr int kWarpCols = 32 * kVec;
// Columns of x staged in shared memory per step (f32, kTokens rows: 32 KiB); a warp covers
// them in kChunk / kWarpCols loads per row, all issued before the step's arithmetic.
constexpr int kChunk = 2 * kWarpCols;
// CTAs per SM the register budget is sized for (__launch_bounds__): 2 x 256 threads x up to
// 128 registers; fewer registers made ptxas spill the accumulators.
constexpr int kMinCtasPerSm = 2;
// grid.y is at most this (CUDA's limit); CTAs stride over further token tiles.
constexpr int kMaxGridY = 65535;

static_assert(kWarps == kTokens, "the dynamic prologue gives each warp one token");

}  // namespace xla_kernels::fp8_linear::tuning
