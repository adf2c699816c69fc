// paged_attention on NVIDIA GPUs: the XLA FFI binding of the kernel core in
// paged_attention.cuh (design notes there).
//
// Handler XkPagedAttentionCuda: decodes and validates the buffers and attributes, checks the
// workspace is large enough (workspace_size() in workspace.py), fills the core's Params and
// launches on XLA's stream. Command-buffer (CUDA graph) compatible: it only enqueues kernels.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "paged_attention.cuh"
#include "paged_attention_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace xla_kernels::paged_attention {
namespace {

ffi::Error PagedAttentionCuda(cudaStream_t stream, ffi::AnyBuffer query, ffi::AnyBuffer key_cache,
                              ffi::AnyBuffer value_cache, ffi::Buffer<ffi::S32> block_tables,
                              ffi::Buffer<ffi::S32> seq_lens, ffi::Result<ffi::AnyBuffer> out,
                              ffi::Result<ffi::Buffer<ffi::F32>> workspace, float scale,
                              float softcap, int64_t sliding_window, std::string_view layout,
                              float k_scale, float v_scale) {
  Shape s;
  ffi::Error err = DecodeAndValidate(query, key_cache, value_cache, block_tables, seq_lens, *out,
                                     scale, softcap, sliding_window, layout, k_scale, v_scale,
                                     &s);
  if (err.failure()) return err;
  const int64_t need = WorkspaceElems(s.num_seqs, s.num_q_heads, s.head_dim,
                                      s.max_blocks_per_seq * s.block_size);
  const int64_t have = static_cast<int64_t>(workspace->element_count());
  if (workspace->dimensions().size() != 1 || have < need)
    return Bad("workspace", "has " + std::to_string(have) + " f32 elements, needs " +
                                std::to_string(need),
               "allocate workspace_size(num_seqs, num_q_heads, head_dim, max_context) elements");

  Params p;
  static_cast<PagedAttentionParams&>(p) =
      PagedAttentionParamsOf(s, scale, softcap, sliding_window, k_scale, v_scale);
  p.key_cache = key_cache.untyped_data();
  p.value_cache = value_cache.untyped_data();
  p.block_tables = block_tables.typed_data();
  p.out = out->untyped_data();
  p.workspace = workspace->typed_data();
  p.workspace_elems = have;
  p.query = query.untyped_data();
  p.seq_lens = seq_lens.typed_data();
  p.num_seqs = s.num_seqs;
  const std::string msg = launch_paged_attention(stream, p);
  if (!msg.empty()) return ffi::Error::Internal("xla_kernels." + msg);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::paged_attention

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkPagedAttentionCuda,
                              xla_kernels::paged_attention::PagedAttentionCuda,
                              xla_kernels::paged_attention::BindOperands(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
