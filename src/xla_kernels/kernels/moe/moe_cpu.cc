// fused_moe on the host: routing, then the experts one after the other, each over the token
// pairs routed to it (its weight rows are read and, for fp8, dequantized once per call),
// then each token's weighted expert outputs summed in f32 and rounded once.
// Handlers XkFusedMoeCpu and XkFusedMoeFp8Cpu, and their expert-parallel forms
// XkFusedMoeEpCpu and XkFusedMoeFp8EpCpu (routing over every expert's logit, only the local
// experts computed), bound and decoded by moe_ffi.h; the workspaces are the CUDA kernels'
// (unused).
#include <cmath>
#include <cstdint>
#include <vector>

#include "moe_ffi.h"
#include "moe_limits.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::moe {
namespace {

// Converts elements of any supported dtype to f32.
template <ffi::DataType DT>
void ToF32(const void* src, int64_t offset, int64_t n, float* dst) {
  using E = HostElem<DT>;
  const auto* p = static_cast<const typename E::T*>(src) + offset;
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(E::Load(p[i]));
}

void LoadF32(ffi::DataType dt, const void* src, int64_t offset, int64_t n, float* dst) {
  switch (dt) {
    case ffi::DataType::F32: ToF32<ffi::DataType::F32>(src, offset, n, dst); break;
    case ffi::DataType::BF16: ToF32<ffi::DataType::BF16>(src, offset, n, dst); break;
    case ffi::DataType::F16: ToF32<ffi::DataType::F16>(src, offset, n, dst); break;
    default: ToF32<ffi::DataType::F8E4M3FN>(src, offset, n, dst); break;
  }
}

// x rounded to dtype and back (the activation rows are stored in hidden's dtype).
float RoundTo(ffi::DataType dt, float x) {
  switch (dt) {
    case ffi::DataType::BF16: return Bf16ToF32(F32ToBf16(x));
    case ffi::DataType::F16: return F16ToF32(F32ToF16(x));
    default: return x;
  }
}

void StoreRow(ffi::DataType dt, const float* src, int64_t n, void* dst, int64_t offset) {
  switch (dt) {
    case ffi::DataType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[offset + i] = F32ToBf16(src[i]);
      break;
    case ffi::DataType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[offset + i] = F32ToF16(src[i]);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[offset + i] = src[i];
  }
}

// softmax in f32 over the routed experts, the top_k largest (the lower expert first among
// equal ones), optionally renormalized: global ids and weights [tokens, top_k].
void Route(const Shape& s, const void* logits, std::vector<int32_t>* ids,
           std::vector<float>* weights) {
  std::vector<float> p(static_cast<size_t>(s.routed));
  std::vector<char> taken(static_cast<size_t>(s.routed));
  for (int64_t t = 0; t < s.tokens; ++t) {
    LoadF32(s.logits_dtype, logits, t * s.routed, s.routed, p.data());
    float m = -INFINITY;
    for (float v : p) m = std::fmax(m, v);
    float sum = 0.f;
    for (float& v : p) sum += (v = std::exp(v - m));
    for (float& v : p) v /= sum;
    std::fill(taken.begin(), taken.end(), 0);
    float chosen = 0.f;
    for (int64_t j = 0; j < s.top_k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < s.routed; ++e)
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      (*ids)[t * s.top_k + j] = static_cast<int32_t>(best);
      (*weights)[t * s.top_k + j] = p[best];
      chosen += p[best];
    }
    if (s.renormalize)
      for (int64_t j = 0; j < s.top_k; ++j) (*weights)[t * s.top_k + j] /= chosen;
  }
}

float Activate(Activation a, float g) {
  if (a == Activation::kSilu) return g / (1.f + std::exp(-g));
  return 0.5f * g * (1.f + std::erf(g * 0.70710678118654752f));
}

// One expert's weight row `row` ([rows, cols] matrices) in f32, dequantized for fp8.
void WeightRow(const Shape& s, const void* w, const float* scale, int64_t expert, int64_t rows,
               int64_t cols, int64_t row, float* dst) {
  const int64_t offset = (expert * rows + row) * cols;
  LoadF32(s.fp8 ? ffi::DataType::F8E4M3FN : s.dtype, w, offset, cols, dst);
  if (!s.fp8) return;
  const int64_t per_expert = s.bk == 0 ? rows : CeilDiv(rows, s.bn) * CeilDiv(cols, s.bk);
  const float* sc = scale + expert * per_expert;
  for (int64_t c = 0; c < cols; ++c) dst[c] *= sc[ScaleIndex(row, c, cols, s.bn, s.bk)];
}

float Dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// `expert_offset`: the global id of local expert 0; pairs routed elsewhere add nothing.
void Run(const Shape& s, const void* hidden, const void* logits, const void* w13,
         const void* w2, const float* w13_scale, const float* w2_scale, int64_t expert_offset,
         void* out) {
  const int64_t H = s.hidden, N = s.inter, K = s.top_k;
  std::vector<int32_t> ids(static_cast<size_t>(s.pairs));
  std::vector<float> weights(static_cast<size_t>(s.pairs));
  Route(s, logits, &ids, &weights);
  std::vector<std::vector<int64_t>> pairs_of(static_cast<size_t>(s.experts));
  for (int64_t p = 0; p < s.pairs; ++p) {
    const int64_t local = ids[p] - expert_offset;
    if (local >= 0 && local < s.experts) pairs_of[local].push_back(p);
  }
  std::vector<float> x(static_cast<size_t>(s.tokens * H));
  LoadF32(s.dtype, hidden, 0, s.tokens * H, x.data());
  std::vector<float> y(static_cast<size_t>(s.pairs * H), 0.f);
  std::vector<float> row(static_cast<size_t>(H > N ? H : N)), up_row(static_cast<size_t>(H));
  for (int64_t e = 0; e < s.experts; ++e) {
    const std::vector<int64_t>& mine = pairs_of[e];
    const int64_t n_rows = static_cast<int64_t>(mine.size());
    if (n_rows == 0) continue;
    std::vector<float> act(static_cast<size_t>(n_rows * N));
    for (int64_t o = 0; o < N; ++o) {
      WeightRow(s, w13, w13_scale, e, 2 * N, H, o, row.data());
      WeightRow(s, w13, w13_scale, e, 2 * N, H, N + o, up_row.data());
      for (int64_t r = 0; r < n_rows; ++r) {
        const float* xr = x.data() + (mine[r] / K) * H;
        const float g = Dot(xr, row.data(), H), u = Dot(xr, up_row.data(), H);
        act[r * N + o] = RoundTo(s.dtype, Activate(s.activation, g) * u);
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      WeightRow(s, w2, w2_scale, e, H, N, h, row.data());
      for (int64_t r = 0; r < n_rows; ++r)
        y[mine[r] * H + h] = weights[mine[r]] * Dot(act.data() + r * N, row.data(), N);
    }
  }
  std::vector<float> sum(static_cast<size_t>(H));
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::fill(sum.begin(), sum.end(), 0.f);
    for (int64_t j = 0; j < K; ++j)
      for (int64_t h = 0; h < H; ++h) sum[h] += y[(t * K + j) * H + h];
    StoreRow(s.dtype, sum.data(), H, out, t * H);
  }
}

ffi::Error Compute(const Call& c) {
  Run(c.s, c.hidden, c.logits, c.w13, c.w2, c.w13_scale, c.w2_scale,
      c.expert_offset != nullptr ? *c.expert_offset : 0, c.out);
  return ffi::Error::Success();
}

using CpuHandlers = Handlers<Compute>;

}  // namespace
}  // namespace xla_kernels::moe

XK_MOE_DEFINE_HANDLERS(Cpu, xla_kernels::moe::CpuHandlers, ffi::Ffi::Bind());
