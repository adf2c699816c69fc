// ragged_paged_attention's decode path: decode-only batches (known on the device) run
// paged_attention's flash-decoding kernels over per-row lengths and block-table rows that a
// one-CTA kernel prepares.
#pragma once

#include "ragged_common.cuh"

namespace xla_kernels::ragged_paged_attention {
namespace detail {

constexpr int kPrepThreads = 1024;

// One CTA. *decode = 1 when every used sequence has q_len <= 1 (SeqView's rules); then row
// c_s of a sequence with q_len 1 gets length L_s (it sits at p = L_s - 1) and sequence s, and
// every other row length 0. When the batch is not decode-only every row gets length 0.
__global__ void __launch_bounds__(kPrepThreads) decode_prep_kernel(const Args a, int32_t* lens,
                                                                   int32_t* row_seq,
                                                                   int32_t* decode) {
  __shared__ int scan[kPrepThreads];
  __shared__ int carry_end;
  const int tid = threadIdx.x;
  for (int r = tid; r < a.T; r += kPrepThreads) lens[r] = 0;
  const int n = clampi(__ldg(a.num_seqs), 0, a.max_seqs);
  if (tid == 0) carry_end = clampi(__ldg(a.cu), 0, a.T);
  __syncthreads();
  int ok = 1;
  for (int base = 0; base < n; base += kPrepThreads) {
    const int s = base + tid;
    // s < n <= max_seqs: cu[s + 1] and kv_lens[s] are in bounds.
    scan[tid] = s < n ? clampi(__ldg(a.cu + s + 1), 0, a.T) : 0;
    __syncthreads();
    for (int off = 1; off < kPrepThreads; off <<= 1) {  // inclusive prefix maximum
      const int v = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] = max(scan[tid], v);
      __syncthreads();
    }
    const int carry = carry_end;
    const int start = tid == 0 ? carry : max(carry, scan[tid - 1]);
    const int end = max(carry, scan[tid]);
    __syncthreads();  // every thread has read carry_end
    if (s < n) {
      const int q_len = end - start;
      if (q_len > 1) ok = 0;
      if (q_len == 1) {
        lens[start] = clampi(__ldg(a.kv_lens + s), 0, a.capacity);
        row_seq[start] = s;
      }
    }
    if (tid == kPrepThreads - 1) carry_end = end;
    __syncthreads();
  }
  const int all = __syncthreads_and(ok);
  if (!all) {
    for (int r = tid; r < a.T; r += kPrepThreads) lens[r] = 0;
  }
  if (tid == 0) *decode = all;
}

// Copies each attending row's block-table row (only the blocks its length covers: the decode
// kernel reads no other entry).
__global__ void __launch_bounds__(kThreads) decode_tables_kernel(const Args a,
                                                                 const int32_t* lens,
                                                                 const int32_t* row_seq,
                                                                 int32_t* tables) {
  for (int r = blockIdx.x; r < a.T; r += gridDim.x) {
    const int len = __ldg(lens + r);
    if (len <= 0) continue;
    const int s = __ldg(row_seq + r);
    const int blocks = a.cache.blocks(len);
    const int32_t* from = a.cache.table(s);
    int32_t* to = tables + static_cast<int64_t>(r) * a.cache.max_blocks;
    for (int j = threadIdx.x; j < blocks; j += kThreads) to[j] = __ldg(from + j);
  }
}

// Launches the decode path (prep, tables, paged_attention's kernels) and points a.skip at
// the flag, so that the kernels launched after it exit when it did the work.
inline std::string launch_decode_path(cudaStream_t stream, const Params& p, Args* a) {
  const int64_t partials = paged_attention::WorkspaceElems(
      p.num_tokens, p.num_q_heads, p.head_dim, p.max_blocks_per_seq * p.block_size);
  const int64_t need = decode_workspace_elems(p.num_tokens, p.max_seqs, p.num_q_heads,
                                              p.head_dim, p.max_blocks_per_seq, p.block_size);
  if (p.workspace_elems < need)
    return "ragged_paged_attention: the workspace has " + std::to_string(p.workspace_elems) +
           " elements, the decode path needs " + std::to_string(need);
  int32_t* tables = reinterpret_cast<int32_t*>(p.workspace + partials);
  int32_t* lens = tables + p.num_tokens * p.max_blocks_per_seq;
  int32_t* row_seq = lens + p.num_tokens;
  int32_t* decode = row_seq + p.num_tokens;
  decode_prep_kernel<<<1, kPrepThreads, 0, stream>>>(*a, lens, row_seq, decode);
  const int64_t grid = p.num_tokens < 1024 ? p.num_tokens : 1024;
  decode_tables_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(*a, lens, row_seq,
                                                                              tables);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_error("launching the decode-path kernels", e);
  // The same cache, attributes and workspace; the rows are the decode rows, one per
  // "sequence", with the block tables and lengths the kernels above wrote.
  paged_attention::Params d;
  static_cast<PagedAttentionParams&>(d) = p;
  d.block_tables = tables;
  d.workspace_elems = partials;
  d.query = p.queries;
  d.seq_lens = lens;
  d.num_seqs = p.num_tokens;
  const std::string err = paged_attention::launch_paged_attention(stream, d);
  if (!err.empty()) return "ragged_paged_attention's decode path: " + err;
  a->skip = decode;
  return "";
}

}  // namespace detail
}  // namespace xla_kernels::ragged_paged_attention
