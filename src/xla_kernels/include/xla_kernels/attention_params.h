// What the CUDA launchers of the attention ops over a paged KV cache (paged_attention,
// ragged_paged_attention) share: the query dtype, the cache and its walk, the attributes and
// the workspace of one call, and the launch-time checks and logit scales derived from them.
// Each op's Params adds its own row description (paged_attention: one query per sequence;
// ragged_paged_attention: ragged rows). Plain C++, no XLA or CUDA types.
#pragma once

#include <cstdint>
#include <string>

#include "xla_kernels/attention_limits.h"

namespace xla_kernels {

enum class AttentionDType { kF32, kF16, kBF16 };

// Element strides describe either cache layout:
//   vllm   [num_blocks, block_size, num_kv_heads, head_dim]
//   pallas [num_kv_heads, num_blocks, block_size, head_dim]
struct PagedAttentionParams {
  AttentionDType dtype = AttentionDType::kF32;  // queries and output
  bool fp8_cache = false;                 // caches are f8e4m3fn (dtype is kBF16 or kF16)
  const void* key_cache = nullptr;        // layout above
  const void* value_cache = nullptr;      // same shape and layout as key_cache
  const int32_t* block_tables = nullptr;  // [sequences, max_blocks_per_seq]
  void* out = nullptr;                    // the queries' shape
  int64_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0, max_blocks_per_seq = 0;
  int64_t stride_block = 0, stride_slot = 0, stride_head = 0;  // elements
  float scale = 1.f, softcap = 0.f;
  float k_scale = 1.f, v_scale = 1.f;  // fp8 caches: key = stored * k_scale, value likewise
  int64_t sliding_window = 0;
  float* workspace = nullptr;  // f32 scratch (what it holds: each op's Params)
  int64_t workspace_elems = 0;
};

// The launchers' own check of what the handlers validated: "" or `op`'s error message.
inline std::string CheckHeadsAndBlockSize(const std::string& op, const PagedAttentionParams& p) {
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0)
    return op + ": num_q_heads must be a multiple of num_kv_heads";
  if (!IsSupportedBlockSize(p.block_size))
    return op + ": block_size must be 16, 32, 64, 128 or 256";
  return "";
}

// The kernels' softmax runs in base 2 with the scales folded in: a logit is q.k * qk_scale
// (scale * log2(e)), or with a softcap cap_mul * tanh(q.k * qk_scale) (scale / softcap and
// softcap * log2(e)). k_scale (1 unless the caches are fp8) is folded into the scale.
struct LogitScales {
  float qk_scale, cap_mul;
};

inline LogitScales LogitScalesOf(const PagedAttentionParams& p, float log2e) {
  const float scale = p.scale * p.k_scale;
  if (p.softcap > 0.f) return {scale / p.softcap, p.softcap * log2e};
  return {scale * log2e, 0.f};
}

}  // namespace xla_kernels
