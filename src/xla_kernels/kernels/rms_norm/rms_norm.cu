// rms_norm on NVIDIA GPUs, forward and backward, f32 accumulation.
// Forward: one CTA per row; its threads stride the row, sum x^2 (warp shuffles, then shared
// memory), and write y = x * r * w. Backward: one CTA per row computes r and sum(w dy x),
// writes dx and keeps r in the workspace; a second kernel gives each thread one column of
// dw = sum over rows of dy * x * r (reads are coalesced across the threads of a warp).
// fused_add_rms_norm: one CTA per row, as the forward; it writes residual_out = x + residual
// (rounded to the dtype) while summing its squares, then normalizes it with the forward's
// own row code (NormalizeRow), so out is bit for bit rms_norm(residual_out).
// Handlers XkRmsNormCuda, XkRmsNormBwdCuda and XkFusedAddRmsNormCuda; command-buffer
// compatible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "rms_norm_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace xla_kernels::rms_norm {
namespace {

constexpr int kThreads = 256;

__device__ inline float Load(float x) { return x; }
__device__ inline float Load(__half x) { return __half2float(x); }
__device__ inline float Load(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ inline T Store(float x);
template <>
__device__ inline float Store<float>(float x) { return x; }
template <>
__device__ inline __half Store<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ inline __nv_bfloat16 Store<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Sum of `v` over the CTA; every thread gets the result.
__device__ inline float BlockSum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  return total;
}

// 1 / sqrt(mean(v^2) + eps) of a row from each thread's partial sum of squares (its columns
// j = threadIdx.x + k * kThreads), then y = v * r * w over the same columns: the arithmetic
// and reduction order rms_norm's forward and fused_add_rms_norm share, so the fused op's out
// is bit for bit rms_norm of its residual_out.
template <typename T>
__device__ inline void NormalizeRow(const T* v, const T* __restrict__ w, T* __restrict__ y,
                                    float sq, int64_t hidden, float eps, float* shared) {
  const float r = rsqrtf(BlockSum(sq, shared) / static_cast<float>(hidden) + eps);
  for (int64_t j = threadIdx.x; j < hidden; j += kThreads)
    y[j] = Store<T>(Load(v[j]) * r * Load(w[j]));
}

template <typename T>
__global__ void ForwardKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                              int64_t hidden, float eps) {
  __shared__ float shared[kThreads / 32];
  const T* xr = x + blockIdx.x * hidden;
  float sq = 0.f;
  for (int64_t j = threadIdx.x; j < hidden; j += kThreads) sq += Load(xr[j]) * Load(xr[j]);
  NormalizeRow(xr, w, y + blockIdx.x * hidden, sq, hidden, eps, shared);
}

// fused_add_rms_norm: one CTA per row reads x and residual once, writes s = x + residual
// (rounded to T, as XLA's add) to residual_out, and normalizes s. Each thread reads back only
// the elements of residual_out it wrote itself (no barrier needed; an L1/L2 hit).
template <typename T>
__global__ void FusedAddKernel(const T* __restrict__ x, const T* __restrict__ residual,
                               const T* __restrict__ w, T* __restrict__ out, T* residual_out,
                               int64_t hidden, float eps) {
  __shared__ float shared[kThreads / 32];
  const int64_t o = blockIdx.x * hidden;
  float sq = 0.f;
  for (int64_t j = threadIdx.x; j < hidden; j += kThreads) {
    const T s = Store<T>(Load(x[o + j]) + Load(residual[o + j]));
    residual_out[o + j] = s;
    sq += Load(s) * Load(s);
  }
  NormalizeRow(residual_out + o, w, out + o, sq, hidden, eps, shared);
}

template <typename T>
__global__ void BackwardRowsKernel(const T* __restrict__ x, const T* __restrict__ w,
                                   const T* __restrict__ dy, T* __restrict__ dx,
                                   float* __restrict__ rstd, int64_t hidden, float eps) {
  __shared__ float shared[kThreads / 32];
  const int64_t o = blockIdx.x * hidden;
  float sq = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < hidden; j += kThreads) {
    const float xj = Load(x[o + j]);
    sq += xj * xj;
    dot += Load(w[j]) * Load(dy[o + j]) * xj;
  }
  const float n = static_cast<float>(hidden);
  const float r = rsqrtf(BlockSum(sq, shared) / n + eps);
  dot = BlockSum(dot, shared);
  for (int64_t j = threadIdx.x; j < hidden; j += kThreads)
    dx[o + j] = Store<T>(r * Load(w[j]) * Load(dy[o + j]) - Load(x[o + j]) * r * r * r * dot / n);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

template <typename T>
__global__ void WeightGradKernel(const T* __restrict__ x, const T* __restrict__ dy,
                                 const float* __restrict__ rstd, T* __restrict__ dw,
                                 int64_t rows, int64_t hidden) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= hidden) return;
  float acc = 0.f;
  for (int64_t i = 0; i < rows; ++i) acc += Load(dy[i * hidden + j]) * Load(x[i * hidden + j]) * rstd[i];
  dw[j] = Store<T>(acc);
}

ffi::Error LaunchError(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(op) + ": launch failed: " + cudaGetErrorString(e));
}

constexpr const char* kFwd = "xla_kernels.rms_norm";
constexpr const char* kBwd = "xla_kernels.rms_norm_bwd";
constexpr const char* kAdd = "xla_kernels.fused_add_rms_norm";

template <typename T>
void LaunchForward(cudaStream_t stream, const Rows& s, const void* x, const void* w, void* y,
                   float eps) {
  ForwardKernel<T><<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), s.hidden, eps);
}

template <typename T>
void LaunchFusedAdd(cudaStream_t stream, const Rows& s, const void* x, const void* residual,
                    const void* w, void* out, void* residual_out, float eps) {
  FusedAddKernel<T><<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(residual), static_cast<const T*>(w),
      static_cast<T*>(out), static_cast<T*>(residual_out), s.hidden, eps);
}

template <typename T>
void LaunchBackward(cudaStream_t stream, const Rows& s, const void* x, const void* w,
                    const void* dy, void* dx, void* dw, float* rstd, float eps) {
  BackwardRowsKernel<T><<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(dy),
      static_cast<T*>(dx), rstd, s.hidden, eps);
  const unsigned cols = static_cast<unsigned>((s.hidden + kThreads - 1) / kThreads);
  WeightGradKernel<T><<<cols, kThreads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(dy), rstd, static_cast<T*>(dw), s.rows,
      s.hidden);
}

ffi::Error RmsNormCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                       ffi::Result<ffi::AnyBuffer> y, float eps) {
  Rows s;
  ffi::Error err = DecodeRows(kFwd, x, weight, {&*y}, &s);
  if (err.failure()) return err;
  if (s.rows == 0 || s.hidden == 0) return ffi::Error::Success();
  if (s.rows > 0x7fffffff) return Bad(kFwd, "x", "too many rows for one launch", "split x");
  switch (x.element_type()) {
    case ffi::DataType::F32:
      LaunchForward<float>(stream, s, x.untyped_data(), weight.untyped_data(), y->untyped_data(), eps);
      break;
    case ffi::DataType::BF16:
      LaunchForward<__nv_bfloat16>(stream, s, x.untyped_data(), weight.untyped_data(),
                                   y->untyped_data(), eps);
      break;
    case ffi::DataType::F16:
      LaunchForward<__half>(stream, s, x.untyped_data(), weight.untyped_data(), y->untyped_data(), eps);
      break;
    default:
      return Bad(kFwd, "x", "unsupported dtype on cuda", "pass f32, bf16 or f16");
  }
  return LaunchError(kFwd);
}

ffi::Error FusedAddRmsNormCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                               ffi::AnyBuffer weight, ffi::Result<ffi::AnyBuffer> out,
                               ffi::Result<ffi::AnyBuffer> residual_out, float eps) {
  Rows s;
  ffi::Error err = DecodeRows(kAdd, x, weight, {&residual, &*out, &*residual_out}, &s);
  if (err.failure()) return err;
  if (s.rows == 0 || s.hidden == 0) return ffi::Error::Success();
  if (s.rows > 0x7fffffff) return Bad(kAdd, "x", "too many rows for one launch", "split x");
  const void* xp = x.untyped_data();
  const void* rp = residual.untyped_data();
  const void* wp = weight.untyped_data();
  void* yp = out->untyped_data();
  void* rop = residual_out->untyped_data();
  switch (x.element_type()) {
    case ffi::DataType::F32: LaunchFusedAdd<float>(stream, s, xp, rp, wp, yp, rop, eps); break;
    case ffi::DataType::BF16:
      LaunchFusedAdd<__nv_bfloat16>(stream, s, xp, rp, wp, yp, rop, eps);
      break;
    case ffi::DataType::F16: LaunchFusedAdd<__half>(stream, s, xp, rp, wp, yp, rop, eps); break;
    default:
      return Bad(kAdd, "x", "unsupported dtype on cuda", "pass f32, bf16 or f16");
  }
  return LaunchError(kAdd);
}

ffi::Error RmsNormBwdCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                          ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx,
                          ffi::Result<ffi::AnyBuffer> dweight,
                          ffi::Result<ffi::Buffer<ffi::F32>> workspace, float eps) {
  Rows s;
  ffi::Error err = DecodeRows(kBwd, x, weight, {&dy, &*dx}, &s);
  if (err.failure()) return err;
  if (dweight->element_type() != x.element_type() ||
      dweight->element_count() != static_cast<size_t>(s.hidden))
    return Bad(kBwd, "dweight", "must be weight's shape and dtype", "allocate it like weight");
  if (workspace->element_count() < static_cast<size_t>(s.rows))
    return Bad(kBwd, "workspace", "needs one f32 per row", "allocate rows f32 elements");
  if (s.hidden == 0) return ffi::Error::Success();
  if (s.rows == 0) {  // no rows: dw is zero
    cudaMemsetAsync(dweight->untyped_data(), 0, dweight->size_bytes(), stream);
    return LaunchError(kBwd);
  }
  if (s.rows > 0x7fffffff) return Bad(kBwd, "x", "too many rows for one launch", "split x");
  float* rstd = workspace->typed_data();
  switch (x.element_type()) {
    case ffi::DataType::F32:
      LaunchBackward<float>(stream, s, x.untyped_data(), weight.untyped_data(), dy.untyped_data(),
                            dx->untyped_data(), dweight->untyped_data(), rstd, eps);
      break;
    case ffi::DataType::BF16:
      LaunchBackward<__nv_bfloat16>(stream, s, x.untyped_data(), weight.untyped_data(),
                                    dy.untyped_data(), dx->untyped_data(),
                                    dweight->untyped_data(), rstd, eps);
      break;
    case ffi::DataType::F16:
      LaunchBackward<__half>(stream, s, x.untyped_data(), weight.untyped_data(), dy.untyped_data(),
                             dx->untyped_data(), dweight->untyped_data(), rstd, eps);
      break;
    default:
      return Bad(kBwd, "x", "unsupported dtype on cuda", "pass f32, bf16 or f16");
  }
  return LaunchError(kBwd);
}

}  // namespace
}  // namespace xla_kernels::rms_norm

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkRmsNormCuda, xla_kernels::rms_norm::RmsNormCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedAddRmsNormCuda, xla_kernels::rms_norm::FusedAddRmsNormCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkRmsNormBwdCuda, xla_kernels::rms_norm::RmsNormBwdCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});
