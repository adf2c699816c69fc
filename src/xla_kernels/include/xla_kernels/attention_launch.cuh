// The host side of launching an attention kernel over a paged KV cache (paged_attention's
// and ragged_paged_attention's launchers): the kernel arguments both ops' argument structs
// share, filled from the launchers' shared Params. Host code only.
#pragma once

#include "xla_kernels/attention_params.h"
#include "xla_kernels/paged_cache.cuh"

namespace xla_kernels {

// Sets `a`'s k, v, cache, out, Hq, Hkv, G, qk_scale, cap_mul and out_scale (an argument
// struct with those members); the launcher sets the rest (its rows and window). `log2e` is
// the kernels' constant (their softmax runs in base 2).
template <typename KernelArgs>
void SetPagedAttentionArgs(const PagedAttentionParams& p, float log2e, KernelArgs* a) {
  a->k = p.key_cache;
  a->v = p.value_cache;
  a->cache = paged_cache::View::Make(p.block_tables, p.num_blocks, p.block_size,
                                     p.max_blocks_per_seq, p.stride_block, p.stride_slot,
                                     p.stride_head);
  a->out = p.out;
  a->Hq = static_cast<int>(p.num_q_heads);
  a->Hkv = static_cast<int>(p.num_kv_heads);
  a->G = static_cast<int>(p.num_q_heads / p.num_kv_heads);
  const LogitScales logits = LogitScalesOf(p, log2e);
  a->qk_scale = logits.qk_scale;
  a->cap_mul = logits.cap_mul;
  a->out_scale = p.v_scale;
}

}  // namespace xla_kernels
