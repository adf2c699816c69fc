// paged_attention's kernel interface: the parameters of one call and its launcher
// (decode_launch.cuh). Plain C++, no XLA types.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace xla_kernels::paged_attention {

enum class DType { kF32, kF16, kBF16 };

// Everything the kernels need; element strides describe either cache layout:
//   vllm   [num_blocks, block_size, num_kv_heads, head_dim]
//   pallas [num_kv_heads, num_blocks, block_size, head_dim]
struct Params {
  DType dtype = DType::kF32;          // query and output
  bool fp8_cache = false;             // caches are f8e4m3fn (dtype is kBF16 or kF16)
  const void* query = nullptr;        // [num_seqs, num_q_heads, head_dim]
  const void* key_cache = nullptr;    // layout above
  const void* value_cache = nullptr;  // same shape and layout as key_cache
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;      // [num_seqs]
  void* out = nullptr;                // [num_seqs, num_q_heads, head_dim]
  float* workspace = nullptr;         // flash-decoding partials
  int64_t workspace_elems = 0;
  int64_t num_seqs = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0, max_blocks_per_seq = 0;
  int64_t stride_block = 0, stride_slot = 0, stride_head = 0;  // elements
  float scale = 1.f, softcap = 0.f;
  int64_t sliding_window = 0;
  float k_scale = 1.f, v_scale = 1.f;  // fp8 caches: key = stored * k_scale, value likewise
};

// Launches the kernels on `stream`; returns "" on success, else an error message.
inline std::string launch_paged_attention(cudaStream_t stream, const Params& p);

}  // namespace xla_kernels::paged_attention
