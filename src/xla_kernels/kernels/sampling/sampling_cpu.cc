// sample on the host: the rules of sampling_core.h with plain selection and sorting (the CPU
// needs no sort-free search), so it is the CUDA kernel's token-for-token oracle.
// Handler XkSampleCpu.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "sampling_core.h"
#include "sampling_ffi.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::sampling {
namespace {

struct Params {
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const uint32_t* seeds;
  const uint32_t* offsets;
};

// The token of one row of `vocab` logits (already f32).
int32_t SampleRow(const float* x, int64_t vocab, const Params& p, int64_t row) {
  int64_t best = -1;  // the largest key, ties to the lowest index; NaN skipped
  for (int64_t i = 0; i < vocab; ++i)
    if (x[i] == x[i] && (best < 0 || OrderedKey(x[i]) > OrderedKey(x[best]))) best = i;
  if (best < 0) return 0;  // every logit NaN
  const float m = x[best];
  const RowRule rule = MakeRule(p.temperature[row], p.top_k[row], p.top_p[row], p.min_p[row],
                                vocab, m);
  if (rule.greedy) return static_cast<int32_t>(best);

  std::vector<uint32_t> keys(vocab);
  std::vector<uint64_t> q(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    keys[i] = OrderedKey(x[i]);
    q[i] = Weight(x[i], m, rule.s);
  }
  uint32_t threshold_k = 0;
  if (rule.top_k) {
    std::vector<uint32_t> sorted = keys;
    std::nth_element(sorted.begin(), sorted.begin() + (rule.k - 1), sorted.end(),
                     std::greater<uint32_t>());
    threshold_k = sorted[rule.k - 1];
  }
  auto in_c = [&](int64_t i) { return keys[i] >= threshold_k && KeepsMinP(rule, q[i]); };
  uint64_t mass_c = 0;
  std::vector<std::pair<uint32_t, uint64_t>> kept;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!in_c(i)) continue;
    mass_c += q[i];
    if (rule.top_p) kept.emplace_back(keys[i], q[i]);
  }
  uint32_t threshold_p = 0;
  uint64_t mass_s = mass_c;
  if (rule.top_p) {
    const double goal = TopPGoal(rule, mass_c);
    std::sort(kept.begin(), kept.end(), std::greater<>());
    uint64_t running = 0;
    for (size_t i = 0; i < kept.size();) {
      const uint32_t key = kept[i].first;
      for (; i < kept.size() && kept[i].first == key; ++i) running += kept[i].second;
      if (Reaches(running, goal)) {
        threshold_p = key;
        mass_s = running;
        break;
      }
    }
  }
  const uint64_t target = MulHi64(mass_s, DrawBits(p.seeds[row], p.offsets[row]));
  uint64_t running = 0;
  for (int64_t column = 0; column < kColumns; ++column)
    for (int64_t run = kVec * column; run < vocab; run += int64_t{kVec} * kColumns)
      for (int64_t i = run; i < run + kVec && i < vocab; ++i) {
        if (!in_c(i) || keys[i] < threshold_p) continue;
        running += q[i];
        if (running > target) return static_cast<int32_t>(i);
      }
  return static_cast<int32_t>(best);  // unreachable: target < the kept mass
}

template <ffi::DataType DT>
void SampleRows(const Shape& s, const void* logits, const Params& p, int32_t* tokens) {
  using E = HostElem<DT>;
  const auto* x = static_cast<const typename E::T*>(logits);
  std::vector<float> row(s.vocab);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t i = 0; i < s.vocab; ++i) row[i] = static_cast<float>(E::Load(x[r * s.vocab + i]));
    tokens[r] = SampleRow(row.data(), s.vocab, p, r);
  }
}

ffi::Error SampleCpu(ffi::AnyBuffer logits, ffi::AnyBuffer temperature, ffi::AnyBuffer top_k,
                     ffi::AnyBuffer top_p, ffi::AnyBuffer min_p, ffi::AnyBuffer seeds,
                     ffi::AnyBuffer offsets, ffi::Result<ffi::AnyBuffer> tokens) {
  Shape s;
  ffi::Error err = Decode(logits, temperature, top_k, top_p, min_p, seeds, offsets, *tokens, &s);
  if (err.failure()) return err;
  const Params p{static_cast<const float*>(temperature.untyped_data()),
                 static_cast<const int32_t*>(top_k.untyped_data()),
                 static_cast<const float*>(top_p.untyped_data()),
                 static_cast<const float*>(min_p.untyped_data()),
                 static_cast<const uint32_t*>(seeds.untyped_data()),
                 static_cast<const uint32_t*>(offsets.untyped_data())};
  auto* out = static_cast<int32_t*>(tokens->untyped_data());
  switch (logits.element_type()) {
    case ffi::DataType::F32: SampleRows<ffi::DataType::F32>(s, logits.untyped_data(), p, out); break;
    case ffi::DataType::BF16: SampleRows<ffi::DataType::BF16>(s, logits.untyped_data(), p, out); break;
    case ffi::DataType::F16: SampleRows<ffi::DataType::F16>(s, logits.untyped_data(), p, out); break;
    default: return Bad("logits", "unsupported dtype", "pass f32, bf16 or f16 logits");
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::sampling

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkSampleCpu, xla_kernels::sampling::SampleCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
