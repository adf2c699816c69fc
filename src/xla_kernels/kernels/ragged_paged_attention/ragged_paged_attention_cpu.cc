// ragged_paged_attention on the CPU: the semantics of the op (see __init__.py and
// ragged_paged_attention.cuh), computed plainly with f32 accumulation. Per (sequence, kv
// head) the sequence's cache rows are converted to f32 once; every query row of the sequence
// and every q head of the group then reads them. fp8 caches are read as stored (exact in
// f32); k_scale multiplies the logit scale and v_scale the output, which equals attention over
// the dequantized cache.
//
// Handler XkRaggedPagedAttentionCpu.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "ragged_paged_attention_ffi.h"
#include "ragged_paged_attention_limits.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::ragged_paged_attention {
namespace {

template <ffi::DataType DT>
using Elem = HostElem<DT>;

// The sequences after clamping (SeqView's rule in ragged_paged_attention_ffi.h).
std::vector<SeqView> Sequences(const Shape& s, const int32_t* kv_lens, const int32_t* cu_q_lens,
                               const int32_t* num_seqs) {
  const int64_t n = std::clamp<int64_t>(num_seqs[0], 0, s.max_seqs);
  const int64_t capacity = s.max_blocks_per_seq * s.block_size;
  std::vector<SeqView> seqs(n);
  int64_t c = std::clamp<int64_t>(cu_q_lens[0], 0, s.num_tokens);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t next = std::max<int64_t>(c, std::clamp<int64_t>(cu_q_lens[i + 1], 0,
                                                                  s.num_tokens));
    seqs[i] = {c, next - c, std::clamp<int64_t>(kv_lens[i], 0, capacity)};
    c = next;
  }
  return seqs;
}

// DT: queries and output; CT: caches (DT, or F8E4M3FN).
template <ffi::DataType DT, ffi::DataType CT>
void Run(const Shape& s, const void* q_raw, const void* k_raw, const void* v_raw,
         const int32_t* kv_lens, const int32_t* block_tables, const int32_t* cu_q_lens,
         const int32_t* num_seqs, void* out_raw, float scale, float softcap, int64_t window,
         float v_scale) {
  using E = Elem<DT>;
  using EC = Elem<CT>;
  using T = typename E::T;
  using C = typename EC::T;
  const T* q = static_cast<const T*>(q_raw);
  const C* kc = static_cast<const C*>(k_raw);
  const C* vc = static_cast<const C*>(v_raw);
  T* out = static_cast<T*>(out_raw);
  const int64_t D = s.head_dim, Hq = s.num_q_heads, G = s.num_q_heads / s.num_kv_heads;

  // Rows no sequence owns are zeros; owned rows are all written below.
  std::fill(out, out + s.num_tokens * Hq * D, E::Store(0.f));

  const HostPagedCache cache{s.num_blocks, s.block_size, s.stride_block, s.stride_slot,
                             s.stride_head};
  std::vector<int64_t> offs;  // element offset (kv head 0) of token t, -1 when masked
  std::vector<float> kf, vf, logits, qf(D), acc(D);
  const std::vector<SeqView> seqs = Sequences(s, kv_lens, cu_q_lens, num_seqs);
  for (size_t seq = 0; seq < seqs.size(); ++seq) {
    const SeqView& sv = seqs[seq];
    if (sv.q_len == 0) continue;
    const int64_t L = sv.kv_len;
    offs.assign(L, -1);
    for (int64_t t = 0; t < L; ++t)  // t < L <= capacity: the table read is in bounds
      offs[t] = cache.RowOffset(block_tables + seq * s.max_blocks_per_seq, t);
    // Tokens some row attends: [lo_all, L). Only those are read.
    const int64_t p_first = L - sv.q_len;
    const int64_t lo_all = window > 0 ? std::max<int64_t>(0, p_first - window + 1) : 0;
    kf.assign(L * D, 0.f);
    vf.assign(L * D, 0.f);
    logits.resize(L);
    for (int64_t kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      for (int64_t t = lo_all; t < L; ++t) {
        if (offs[t] < 0) continue;
        const C* kr = kc + offs[t] + cache.HeadOffset(kvh);
        const C* vr = vc + offs[t] + cache.HeadOffset(kvh);
        for (int64_t d = 0; d < D; ++d) {
          kf[t * D + d] = EC::Load(kr[d]);
          vf[t * D + d] = EC::Load(vr[d]);
        }
      }
      for (int64_t i = 0; i < sv.q_len; ++i) {
        const int64_t p = p_first + i;  // position of row i; < 0: nothing to attend
        const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = kvh * G + g;
          const T* qr = q + ((sv.start + i) * Hq + h) * D;
          T* o = out + ((sv.start + i) * Hq + h) * D;
          for (int64_t d = 0; d < D; ++d) qf[d] = E::Load(qr[d]);
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t t = lo; t <= p; ++t) {
            if (offs[t] < 0) continue;
            float dot = 0.f;
            for (int64_t d = 0; d < D; ++d) dot += qf[d] * kf[t * D + d];
            float x = dot * scale;
            if (softcap > 0.f) x = softcap * std::tanh(x / softcap);
            logits[t] = x;
            mx = std::max(mx, x);
          }
          if (mx == -std::numeric_limits<float>::infinity()) continue;  // no token: zeros
          std::fill(acc.begin(), acc.end(), 0.f);
          float total = 0.f;
          for (int64_t t = lo; t <= p; ++t) {
            if (offs[t] < 0) continue;
            const float w = std::exp(logits[t] - mx);
            total += w;
            for (int64_t d = 0; d < D; ++d) acc[d] += w * vf[t * D + d];
          }
          const float inv = v_scale / total;
          for (int64_t d = 0; d < D; ++d) o[d] = E::Store(acc[d] * inv);
        }
      }
    }
  }
}

ffi::Error RaggedPagedAttentionCpu(ffi::AnyBuffer queries, ffi::AnyBuffer key_cache,
                                   ffi::AnyBuffer value_cache, ffi::Buffer<ffi::S32> kv_lens,
                                   ffi::Buffer<ffi::S32> block_tables,
                                   ffi::Buffer<ffi::S32> cu_q_lens,
                                   ffi::Buffer<ffi::S32> num_seqs,
                                   ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::Buffer<ffi::F32>> /*workspace: CUDA only*/,
                                   float scale, float softcap, int64_t sliding_window,
                                   std::string_view layout, float k_scale, float v_scale) {
  Shape s{};
  ffi::Error err = DecodeAndValidate(queries, key_cache, value_cache, kv_lens, block_tables,
                                     cu_q_lens, num_seqs, *out, scale, softcap, sliding_window,
                                     layout, k_scale, v_scale, &s);
  if (err.failure()) return err;
  if (s.num_tokens == 0 || s.num_q_heads == 0) return ffi::Error::Success();
  const void* q = queries.untyped_data();
  const void* k = key_cache.untyped_data();
  const void* v = ValueCacheData(value_cache, s);
  const int32_t* kl = kv_lens.typed_data();
  const int32_t* bt = block_tables.typed_data();
  const int32_t* cu = cu_q_lens.typed_data();
  const int32_t* ns = num_seqs.typed_data();
  void* o = out->untyped_data();
  const float qk = scale * k_scale;  // k_scale and v_scale are 1 unless the caches are fp8
  using DT = ffi::DataType;
  const bool fp8 = s.cache_dtype == DT::F8E4M3FN;
  switch (s.dtype) {
    case DT::F32:
      Run<DT::F32, DT::F32>(s, q, k, v, kl, bt, cu, ns, o, qk, softcap, sliding_window, v_scale);
      break;
    case DT::BF16:
      if (fp8) {
        Run<DT::BF16, DT::F8E4M3FN>(s, q, k, v, kl, bt, cu, ns, o, qk, softcap, sliding_window,
                                    v_scale);
      } else {
        Run<DT::BF16, DT::BF16>(s, q, k, v, kl, bt, cu, ns, o, qk, softcap, sliding_window,
                                v_scale);
      }
      break;
    case DT::F16:
      if (fp8) {
        Run<DT::F16, DT::F8E4M3FN>(s, q, k, v, kl, bt, cu, ns, o, qk, softcap, sliding_window,
                                   v_scale);
      } else {
        Run<DT::F16, DT::F16>(s, q, k, v, kl, bt, cu, ns, o, qk, softcap, sliding_window,
                              v_scale);
      }
      break;
    default:
      return Bad("queries", "unsupported dtype", "pass bf16, f16 or f32");
  }
  return ffi::Error::Success();
}

ffi::Error RaggedPagedAttentionFusedCpu(ffi::AnyBuffer queries, ffi::AnyBuffer kv_cache,
                                        ffi::Buffer<ffi::S32> kv_lens,
                                        ffi::Buffer<ffi::S32> block_tables,
                                        ffi::Buffer<ffi::S32> cu_q_lens,
                                        ffi::Buffer<ffi::S32> num_seqs,
                                        ffi::Result<ffi::AnyBuffer> out,
                                        ffi::Result<ffi::Buffer<ffi::F32>> workspace, float scale,
                                        float softcap, int64_t sliding_window, float k_scale,
                                        float v_scale) {
  return RaggedPagedAttentionCpu(queries, kv_cache, kv_cache, kv_lens, block_tables, cu_q_lens,
                                 num_seqs, out, workspace, scale, softcap, sliding_window,
                                 "fused", k_scale, v_scale);
}

}  // namespace
}  // namespace xla_kernels::ragged_paged_attention

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkRaggedPagedAttentionCpu,
                              xla_kernels::ragged_paged_attention::RaggedPagedAttentionCpu,
                              xla_kernels::ragged_paged_attention::BindOperands(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XkRaggedPagedAttentionFusedCpu,
    xla_kernels::ragged_paged_attention::RaggedPagedAttentionFusedCpu,
    xla_kernels::ragged_paged_attention::BindFusedOperands(ffi::Ffi::Bind()));
