// One call of the Hopper GEMM (sm90_swap_ab.cuh), in a header free of CUTLASS so that the ops'
// CUDA files that do not include CUTLASS (linear.cu, fp8_linear.cu) can describe a call.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace xla_kernels::gemm {

// Kernel schedules of the Hopper GEMMs: ping-pong (each consumer warp group its own tile),
// cooperative with CUTLASS's stream-K scheduler, and cooperative with whole tiles (both
// consumer warp groups on one 128-row tile, 64 rows each).
struct PingPong {};
struct StreamK {};
struct Cooperative {};

// y [tokens, out] = x [tokens, in] · w [out, in]^T, all row-major; with row_scale (f32 [out]),
// y[t, o] = row_scale[o] · sum_i x[t, i] w[o, i], the product applied in f32 before the one
// rounding to y's type. w's type is the op's to know (x's, or e4m3 weights).
// workspace: device memory a stream-K tile may use for its partial sums and their barriers
// (CUTLASS sizes it per call; a tile whose need exceeds workspace_bytes declines the call).
struct SwapAbCall {
  const void* w;
  const void* x;
  void* y;
  const float* row_scale;  // nullptr: no scale
  int64_t tokens, in, out;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // W8A8 (x in e4m3 too): y[t, o] also times token_scale[t] (f32 [tokens]), x's per-token
  // quantization scale; nullptr elsewhere.
  const float* token_scale = nullptr;
};

// Whether a pointer is 16-byte aligned, as TMA needs (CUTLASS's can_implement does not check).
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// W8A8 with block-scaled weights (sm90_swap_ab_blockwise.cuh): the scales of one call as
// CUTLASS's sm90 blockwise mainloop reads them, both f32 and MN-major (device pointers).
constexpr int kBlockScaleRows = 64;   // weight rows per scale (a 128-row block's, twice)
constexpr int kBlockScaleCols = 128;  // columns of in per scale
struct BlockScales {
  const float* weight;   // [ceil(in / 128)][ceil(out / 64)]
  const float* tokens;   // [ceil(in / 128)][token_stride]: each token's scale, per block
  int64_t token_stride;  // tokens rounded up to 4 (16-byte rows for TMA)
};

}  // namespace xla_kernels::gemm
