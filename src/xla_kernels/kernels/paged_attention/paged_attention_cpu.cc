// paged_attention on the CPU: same semantics as the CUDA kernel (see paged_attention.cuh),
// computed plainly in f32. Per (sequence, kv head) the valid tokens are gathered once; each K
// and V row is converted to f32 once and serves every query head of the group. fp8 caches
// are read as stored (exact in f32); k_scale multiplies the logit scale and v_scale the
// output, which equals attention over the dequantized cache.
//
// Handler XkPagedAttentionCpu. The workspace output is accepted and left untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "paged_attention_limits.h"
#include "paged_attention_ffi.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::paged_attention {
namespace {

template <ffi::DataType DT>
using Elem = HostElem<DT>;

// DT: query and output; CT: caches (DT, or F8E4M3FN).
template <ffi::DataType DT, ffi::DataType CT>
void Run(const Shape& s, const void* q_raw, const void* k_raw, const void* v_raw,
         const int32_t* block_tables, const int32_t* seq_lens, void* out_raw, float scale,
         float softcap, int64_t window, float v_scale) {
  using E = Elem<DT>;
  using EC = Elem<CT>;
  using T = typename E::T;
  using C = typename EC::T;
  const T* q = static_cast<const T*>(q_raw);
  const C* kc = static_cast<const C*>(k_raw);
  const C* vc = static_cast<const C*>(v_raw);
  T* out = static_cast<T*>(out_raw);
  const int64_t D = s.head_dim, G = s.num_q_heads / s.num_kv_heads;
  const int64_t capacity = s.max_blocks_per_seq * s.block_size;

  const HostPagedCache cache{s.num_blocks, s.block_size, s.stride_block, s.stride_slot,
                             s.stride_head};
  std::vector<int64_t> rows;      // element offsets (head 0) of the valid tokens
  std::vector<float> qf(G * D), row(D), logits, acc(G * D), mx(G), sum(G);
  for (int64_t seq = 0; seq < s.num_seqs; ++seq) {
    int64_t L = std::min<int64_t>(seq_lens[seq], capacity);
    const int64_t lo = (window > 0 && L > window) ? L - window : 0;
    rows.clear();
    for (int64_t t = lo; t < L; ++t) {
      const int64_t row = cache.RowOffset(block_tables + seq * s.max_blocks_per_seq, t);
      if (row >= 0) rows.push_back(row);  // an invalid id: the token is skipped
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    logits.assign(G * n, 0.f);
    for (int64_t kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      const int64_t h0 = kvh * G;
      T* o = out + (seq * s.num_q_heads + h0) * D;
      if (n == 0) {
        for (int64_t e = 0; e < G * D; ++e) o[e] = E::Store(0.f);
        continue;
      }
      for (int64_t e = 0; e < G * D; ++e) qf[e] = E::Load(q[(seq * s.num_q_heads + h0) * D + e]);
      std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
      for (int64_t i = 0; i < n; ++i) {  // logits
        const C* kr = kc + rows[i] + cache.HeadOffset(kvh);
        for (int64_t d = 0; d < D; ++d) row[d] = EC::Load(kr[d]);
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qf.data() + g * D;
          float dot = 0.f;
          for (int64_t d = 0; d < D; ++d) dot += qg[d] * row[d];
          float x = dot * scale;
          if (softcap > 0.f) x = softcap * std::tanh(x / softcap);
          logits[g * n + i] = x;
          mx[g] = std::max(mx[g], x);
        }
      }
      for (int64_t g = 0; g < G; ++g) {  // probabilities
        float total = 0.f;
        for (int64_t i = 0; i < n; ++i) {
          const float p = std::exp(logits[g * n + i] - mx[g]);
          logits[g * n + i] = p;
          total += p;
        }
        sum[g] = total;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t i = 0; i < n; ++i) {  // weighted values
        const C* vr = vc + rows[i] + cache.HeadOffset(kvh);
        for (int64_t d = 0; d < D; ++d) row[d] = EC::Load(vr[d]);
        for (int64_t g = 0; g < G; ++g) {
          const float p = logits[g * n + i];
          float* a = acc.data() + g * D;
          for (int64_t d = 0; d < D; ++d) a[d] += p * row[d];
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        const float inv = v_scale / sum[g];
        for (int64_t d = 0; d < D; ++d) o[g * D + d] = E::Store(acc[g * D + d] * inv);
      }
    }
  }
}

ffi::Error PagedAttentionCpu(ffi::AnyBuffer query, ffi::AnyBuffer key_cache,
                             ffi::AnyBuffer value_cache, ffi::Buffer<ffi::S32> block_tables,
                             ffi::Buffer<ffi::S32> seq_lens, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::Buffer<ffi::F32>> workspace, float scale,
                             float softcap, int64_t sliding_window, std::string_view layout,
                             float k_scale, float v_scale) {
  (void)workspace;
  Shape s;
  ffi::Error err = DecodeAndValidate(query, key_cache, value_cache, block_tables, seq_lens, *out,
                                     scale, softcap, sliding_window, layout, k_scale, v_scale,
                                     &s);
  if (err.failure()) return err;
  if (s.num_seqs == 0 || s.num_q_heads == 0) return ffi::Error::Success();
  const void* q = query.untyped_data();
  const void* k = key_cache.untyped_data();
  const void* v = value_cache.untyped_data();
  const int32_t* bt = block_tables.typed_data();
  const int32_t* sl = seq_lens.typed_data();
  void* o = out->untyped_data();
  const float qk = scale * k_scale;
  using DT = ffi::DataType;
  const bool fp8 = s.cache_dtype == DT::F8E4M3FN;
  switch (s.dtype) {
    case DT::F32:
      Run<DT::F32, DT::F32>(s, q, k, v, bt, sl, o, qk, softcap, sliding_window, v_scale);
      break;
    case DT::BF16:
      if (fp8) {
        Run<DT::BF16, DT::F8E4M3FN>(s, q, k, v, bt, sl, o, qk, softcap, sliding_window, v_scale);
      } else {
        Run<DT::BF16, DT::BF16>(s, q, k, v, bt, sl, o, qk, softcap, sliding_window, v_scale);
      }
      break;
    case DT::F16:
      if (fp8) {
        Run<DT::F16, DT::F8E4M3FN>(s, q, k, v, bt, sl, o, qk, softcap, sliding_window, v_scale);
      } else {
        Run<DT::F16, DT::F16>(s, q, k, v, bt, sl, o, qk, softcap, sliding_window, v_scale);
      }
      break;
    default:
      return Bad("query", "unsupported dtype", "pass bf16, f16 or f32");
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::paged_attention

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkPagedAttentionCpu, xla_kernels::paged_attention::PagedAttentionCpu,
                              xla_kernels::paged_attention::BindOperands(ffi::Ffi::Bind()));

// The workspace formula of paged_attention_limits.h, for the test that holds the Python shape rule to it.
extern "C" int64_t XkPagedAttentionWorkspaceElems(int64_t num_seqs, int64_t num_q_heads,
                                                  int64_t head_dim, int64_t max_context) {
  return xla_kernels::paged_attention::WorkspaceElems(num_seqs, num_q_heads, head_dim,
                                                      max_context);
}
