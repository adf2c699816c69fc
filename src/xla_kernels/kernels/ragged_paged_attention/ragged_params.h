// ragged_paged_attention's kernel interface: the parameters of one call, its launcher
// (ragged_launch.cuh) and the decode path's workspace size. Plain C++, no XLA types.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../paged_attention/paged_attention_limits.h"
#include "xla_kernels/attention_params.h"

namespace xla_kernels::ragged_paged_attention {

using DType = AttentionDType;

// Everything the kernels need: the shared part (xla_kernels/attention_params.h; its workspace
// is null where there is no decode path, else decode_workspace_elems() floats) and the ragged
// rows.
struct Params : PagedAttentionParams {
  const void* queries = nullptr;        // [num_tokens, num_q_heads, head_dim]
  const int32_t* kv_lens = nullptr;     // [max_seqs]
  const int32_t* cu_q_lens = nullptr;   // [max_seqs + 1]
  const int32_t* num_seqs = nullptr;    // [1]
  int64_t num_tokens = 0, max_seqs = 0;  // block_tables: [max_seqs, max_blocks_per_seq]
};

// Launches the kernels on `stream`; returns "" on success, else an error message.
inline std::string launch_ragged_paged_attention(cudaStream_t stream, const Params& p);

// f32 elements of workspace the decode path needs: paged_attention's flash-decoding
// partials for num_tokens rows, then int32 areas: block-table rows [num_tokens,
// max_blocks_per_seq], row lengths [num_tokens], row sequences [num_tokens], the flag [1].
// The path exists only when num_tokens <= max_seqs (a decode batch needs no more rows than
// sequence slots; otherwise the decode kernels' launch over every row would cost more than
// it saves on prefill-sized calls); then 1 element (unused) is enough.
inline bool has_decode_path(int64_t num_tokens, int64_t max_seqs) {
  return num_tokens <= max_seqs;
}

inline int64_t decode_workspace_elems(int64_t num_tokens, int64_t max_seqs, int64_t num_q_heads,
                                      int64_t head_dim, int64_t max_blocks_per_seq,
                                      int64_t block_size) {
  if (!has_decode_path(num_tokens, max_seqs)) return 1;
  return paged_attention::WorkspaceElems(num_tokens, num_q_heads, head_dim,
                                         max_blocks_per_seq * block_size) +
         num_tokens * (max_blocks_per_seq + 2) + 1;
}

}  // namespace xla_kernels::ragged_paged_attention
