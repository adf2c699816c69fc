// rms_norm on the host, forward and backward, and fused_add_rms_norm, accumulating in f32
// (f64 for f64 inputs).
//   y = x * r * w,  r = 1 / sqrt(mean(x^2) + eps)
//   dx = r * (w dy) - x * r^3 / hidden * sum(w dy x),  dw = sum over rows of dy * x * r
//   residual_out = round(x + residual),  out = rms_norm(residual_out)
// Handlers XkRmsNormCpu, XkRmsNormBwdCpu and XkFusedAddRmsNormCpu.
#include <cmath>
#include <cstdint>
#include <vector>

#include "rms_norm_ffi.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/host_elem.h"

namespace ffi = xla::ffi;

namespace xla_kernels::rms_norm {
namespace {

template <ffi::DataType DT>
using Elem = HostElem<DT>;

// y = v * r * w for one row v: the normalization both rms_norm and fused_add_rms_norm run, so
// the fused op's out is bit for bit rms_norm of its residual_out.
template <ffi::DataType DT>
void NormalizeRow(const typename Elem<DT>::T* v, const typename Elem<DT>::T* w,
                  typename Elem<DT>::T* y, int64_t hidden, float eps) {
  using E = Elem<DT>;
  using Acc = typename E::Acc;
  Acc sq = 0;
  for (int64_t j = 0; j < hidden; ++j) sq += E::Load(v[j]) * E::Load(v[j]);
  const Acc r = Acc(1) / std::sqrt(sq / static_cast<Acc>(hidden) + static_cast<Acc>(eps));
  for (int64_t j = 0; j < hidden; ++j) y[j] = E::Store(E::Load(v[j]) * r * E::Load(w[j]));
}

template <ffi::DataType DT>
void Forward(const Rows& s, const void* xv, const void* wv, void* yv, float eps) {
  using T = typename Elem<DT>::T;
  const T* x = static_cast<const T*>(xv);
  const T* w = static_cast<const T*>(wv);
  T* y = static_cast<T*>(yv);
  for (int64_t i = 0; i < s.rows; ++i)
    NormalizeRow<DT>(x + i * s.hidden, w, y + i * s.hidden, s.hidden, eps);
}

// residual_out = x + residual (added in the accumulation type, rounded once to the dtype, as
// XLA's add), then out = rms_norm(residual_out) row by row.
template <ffi::DataType DT>
void FusedAdd(const Rows& s, const void* xv, const void* resv, const void* wv, void* outv,
              void* res_outv, float eps) {
  using E = Elem<DT>;
  using T = typename E::T;
  const T* x = static_cast<const T*>(xv);
  const T* res = static_cast<const T*>(resv);
  const T* w = static_cast<const T*>(wv);
  T* out = static_cast<T*>(outv);
  T* res_out = static_cast<T*>(res_outv);
  for (int64_t i = 0; i < s.rows; ++i) {
    const int64_t o = i * s.hidden;
    for (int64_t j = 0; j < s.hidden; ++j)
      res_out[o + j] = E::Store(E::Load(x[o + j]) + E::Load(res[o + j]));
    NormalizeRow<DT>(res_out + o, w, out + o, s.hidden, eps);
  }
}

template <ffi::DataType DT>
void Backward(const Rows& s, const void* xv, const void* wv, const void* dyv, void* dxv,
              void* dwv, float eps) {
  using E = Elem<DT>;
  using T = typename E::T;
  using Acc = typename E::Acc;
  const T* x = static_cast<const T*>(xv);
  const T* w = static_cast<const T*>(wv);
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  std::vector<Acc> dw(static_cast<size_t>(s.hidden), Acc(0));
  for (int64_t i = 0; i < s.rows; ++i) {
    const int64_t o = i * s.hidden;
    Acc sq = 0, dot = 0;
    for (int64_t j = 0; j < s.hidden; ++j) {
      const Acc xj = E::Load(x[o + j]);
      sq += xj * xj;
      dot += E::Load(w[j]) * E::Load(dy[o + j]) * xj;
    }
    const Acc n = static_cast<Acc>(s.hidden);
    const Acc r = Acc(1) / std::sqrt(sq / n + static_cast<Acc>(eps));
    for (int64_t j = 0; j < s.hidden; ++j) {
      const Acc xj = E::Load(x[o + j]), gj = E::Load(dy[o + j]);
      dx[o + j] = E::Store(r * E::Load(w[j]) * gj - xj * r * r * r * dot / n);
      dw[j] += gj * xj * r;
    }
  }
  T* out = static_cast<T*>(dwv);
  for (int64_t j = 0; j < s.hidden; ++j) out[j] = E::Store(dw[j]);
}

template <template <ffi::DataType> class Fn, typename... Args>
ffi::Error Dispatch(const char* op, ffi::DataType dt, Args... args) {
  switch (dt) {
    case ffi::DataType::F32: Fn<ffi::DataType::F32>::Run(args...); break;
    case ffi::DataType::F64: Fn<ffi::DataType::F64>::Run(args...); break;
    case ffi::DataType::BF16: Fn<ffi::DataType::BF16>::Run(args...); break;
    case ffi::DataType::F16: Fn<ffi::DataType::F16>::Run(args...); break;
    default: return Bad(op, "x", "unsupported dtype", "pass f64, f32, bf16 or f16");
  }
  return ffi::Error::Success();
}

template <ffi::DataType DT>
struct RunForward {
  template <typename... Args>
  static void Run(Args... args) { Forward<DT>(args...); }
};
template <ffi::DataType DT>
struct RunFusedAdd {
  template <typename... Args>
  static void Run(Args... args) { FusedAdd<DT>(args...); }
};
template <ffi::DataType DT>
struct RunBackward {
  template <typename... Args>
  static void Run(Args... args) { Backward<DT>(args...); }
};

constexpr const char* kFwd = "xla_kernels.rms_norm";
constexpr const char* kBwd = "xla_kernels.rms_norm_bwd";
constexpr const char* kAdd = "xla_kernels.fused_add_rms_norm";

ffi::Error RmsNormCpu(ffi::AnyBuffer x, ffi::AnyBuffer weight, ffi::Result<ffi::AnyBuffer> y,
                      float eps) {
  Rows s;
  ffi::Error err = DecodeRows(kFwd, x, weight, {&*y}, &s);
  if (err.failure()) return err;
  return Dispatch<RunForward>(kFwd, x.element_type(), s, x.untyped_data(), weight.untyped_data(),
                              y->untyped_data(), eps);
}

ffi::Error FusedAddRmsNormCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer weight,
                              ffi::Result<ffi::AnyBuffer> out,
                              ffi::Result<ffi::AnyBuffer> residual_out, float eps) {
  Rows s;
  ffi::Error err = DecodeRows(kAdd, x, weight, {&residual, &*out, &*residual_out}, &s);
  if (err.failure()) return err;
  return Dispatch<RunFusedAdd>(kAdd, x.element_type(), s, x.untyped_data(),
                               residual.untyped_data(), weight.untyped_data(),
                               out->untyped_data(), residual_out->untyped_data(), eps);
}

ffi::Error RmsNormBwdCpu(ffi::AnyBuffer x, ffi::AnyBuffer weight, ffi::AnyBuffer dy,
                         ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dweight,
                         ffi::Result<ffi::Buffer<ffi::F32>> workspace, float eps) {
  (void)workspace;  // the CUDA handler's per-row scratch
  Rows s;
  ffi::Error err = DecodeRows(kBwd, x, weight, {&dy, &*dx}, &s);
  if (err.failure()) return err;
  if (dweight->element_type() != x.element_type() ||
      dweight->element_count() != static_cast<size_t>(s.hidden))
    return Bad(kBwd, "dweight", "must be weight's shape and dtype", "allocate it like weight");
  return Dispatch<RunBackward>(kBwd, x.element_type(), s, x.untyped_data(),
                               weight.untyped_data(), dy.untyped_data(), dx->untyped_data(),
                               dweight->untyped_data(), eps);
}

}  // namespace
}  // namespace xla_kernels::rms_norm

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkRmsNormCpu, xla_kernels::rms_norm::RmsNormCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedAddRmsNormCpu, xla_kernels::rms_norm::FusedAddRmsNormCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkRmsNormBwdCpu, xla_kernels::rms_norm::RmsNormBwdCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps"));
