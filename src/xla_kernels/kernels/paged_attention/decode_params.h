// paged_attention's kernel interface: the parameters of one call and its launcher
// (decode_launch.cuh). Plain C++, no XLA types.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "xla_kernels/attention_params.h"

namespace xla_kernels::paged_attention {

using DType = AttentionDType;

// Everything the kernels need: the shared part (xla_kernels/attention_params.h) and one query
// row per sequence.
struct Params : PagedAttentionParams {
  const void* query = nullptr;        // [num_seqs, num_q_heads, head_dim]
  const int32_t* seq_lens = nullptr;  // [num_seqs]
  int64_t num_seqs = 0;               // block_tables: [num_seqs, max_blocks_per_seq]
};

// Launches the kernels on `stream`; returns "" on success, else an error message.
inline std::string launch_paged_attention(cudaStream_t stream, const Params& p);

}  // namespace xla_kernels::paged_attention
