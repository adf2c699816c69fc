// ragged_paged_attention on NVIDIA GPUs: the XLA FFI binding of the kernel core in
// ragged_paged_attention.cuh (design notes there).
//
// Handler XkRaggedPagedAttentionCuda: decodes and validates the buffers and attributes (the
// checks shared with the CPU handler), checks the workspace (decode_workspace_size() in
// __init__.py), fills the core's Params and launches on XLA's stream.
// Command-buffer (CUDA graph) compatible: it only enqueues kernels, and which sequences and
// tiles exist is decided on the device from cu_q_lens / kv_lens / num_seqs.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "ragged_paged_attention.cuh"
#include "ragged_paged_attention_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace xla_kernels::ragged_paged_attention {
namespace {

ffi::Error RaggedPagedAttentionCuda(cudaStream_t stream, ffi::AnyBuffer queries,
                                    ffi::AnyBuffer key_cache, ffi::AnyBuffer value_cache,
                                    ffi::Buffer<ffi::S32> kv_lens,
                                    ffi::Buffer<ffi::S32> block_tables,
                                    ffi::Buffer<ffi::S32> cu_q_lens,
                                    ffi::Buffer<ffi::S32> num_seqs,
                                    ffi::Result<ffi::AnyBuffer> out,
                                    ffi::Result<ffi::Buffer<ffi::F32>> workspace, float scale,
                                    float softcap, int64_t sliding_window,
                                    std::string_view layout, float k_scale, float v_scale) {
  Shape s{};
  ffi::Error err = DecodeAndValidate(queries, key_cache, value_cache, kv_lens, block_tables,
                                     cu_q_lens, num_seqs, *out, scale, softcap, sliding_window,
                                     layout, k_scale, v_scale, &s);
  if (err.failure()) return err;
  const int64_t need = decode_workspace_elems(s.num_tokens, s.max_seqs, s.num_q_heads,
                                              s.head_dim, s.max_blocks_per_seq, s.block_size);
  const int64_t have = static_cast<int64_t>(workspace->element_count());
  if (workspace->dimensions().size() != 1 || have < need)
    return Bad("workspace", "has " + std::to_string(have) + " f32 elements, needs " +
                                std::to_string(need),
               "allocate decode_workspace_size(num_tokens, max_seqs, num_q_heads, "
               "head_dim, max_blocks_per_seq, block_size) elements");
  Params p;
  static_cast<PagedAttentionParams&>(p) =
      PagedAttentionParamsOf(s, scale, softcap, sliding_window, k_scale, v_scale);
  p.key_cache = key_cache.untyped_data();
  p.value_cache = ValueCacheData(value_cache, s);
  p.block_tables = block_tables.typed_data();
  p.out = out->untyped_data();
  p.workspace = workspace->typed_data();
  p.workspace_elems = have;
  p.queries = queries.untyped_data();
  p.kv_lens = kv_lens.typed_data();
  p.cu_q_lens = cu_q_lens.typed_data();
  p.num_seqs = num_seqs.typed_data();
  p.num_tokens = s.num_tokens;
  p.max_seqs = s.max_seqs;
  const std::string msg = launch_ragged_paged_attention(stream, p);
  if (!msg.empty()) return ffi::Error::Internal("xla_kernels." + msg);
  return ffi::Error::Success();
}

ffi::Error RaggedPagedAttentionFusedCuda(cudaStream_t stream, ffi::AnyBuffer queries,
                                         ffi::AnyBuffer kv_cache, ffi::Buffer<ffi::S32> kv_lens,
                                         ffi::Buffer<ffi::S32> block_tables,
                                         ffi::Buffer<ffi::S32> cu_q_lens,
                                         ffi::Buffer<ffi::S32> num_seqs,
                                         ffi::Result<ffi::AnyBuffer> out,
                                         ffi::Result<ffi::Buffer<ffi::F32>> workspace,
                                         float scale, float softcap, int64_t sliding_window,
                                         float k_scale, float v_scale) {
  return RaggedPagedAttentionCuda(stream, queries, kv_cache, kv_cache, kv_lens, block_tables,
                                  cu_q_lens, num_seqs, out, workspace, scale, softcap,
                                  sliding_window, "fused", k_scale, v_scale);
}

}  // namespace
}  // namespace xla_kernels::ragged_paged_attention

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XkRaggedPagedAttentionCuda,
    xla_kernels::ragged_paged_attention::RaggedPagedAttentionCuda,
    xla_kernels::ragged_paged_attention::BindOperands(
        ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XkRaggedPagedAttentionFusedCuda,
    xla_kernels::ragged_paged_attention::RaggedPagedAttentionFusedCuda,
    xla_kernels::ragged_paged_attention::BindFusedOperands(
        ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
