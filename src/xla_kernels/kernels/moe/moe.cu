// fused_moe on NVIDIA GPUs: the XLA FFI binding of the kernel core in moe_routing.cuh and
// moe_gemm.cuh (design and roofline in docs/design/moe.md).
//
// Handlers XkFusedMoeCuda and XkFusedMoeFp8Cuda, and the expert-parallel XkFusedMoeEpCuda and
// XkFusedMoeFp8EpCuda (routing over every expert's logit, the sort keeping the local block's
// pairs; the offset stays on the device, read by the sort kernel): decode and validate (moe_ffi.h, shared with
// the CPU handlers), pick the tiles (moe_tuning.h), then five launches on XLA's stream:
// routing, the sort by expert, GEMM1 + activation, GEMM2 + routing weight, the per-token sum.
// bf16/f16 run the tensor-core GEMMs of moe_gemm.cuh; f32 runs SimtGemmKernel (CUDA cores).
// Command-buffer (CUDA graph) compatible: which tiles exist is decided on the device.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "moe_ffi.h"
#include "moe_gemm.cuh"
#include "moe_limits.h"
#include "moe_routing.cuh"
#include "moe_tuning.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace xla_kernels::moe {
namespace {

int SmCount() {
  static const int count = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n > 0 ? n : 1;
  }();
  return count;
}

template <typename T, bool kFp8, bool kGated, int BM, int BN>
cudaError_t LaunchGemm(cudaStream_t stream, const GemmParams& p, int64_t max_tiles) {
  constexpr int kStages = tuning::Stages<T, kFp8, kGated, BM, BN>();
  using C = GemmConfig<T, kFp8, kGated, BM, BN, kStages>;
  auto kernel = GroupedGemmKernel<T, kFp8, kGated, BM, BN, kStages>;
  // Per launch, as paged_attention does: the attribute belongs to the current device.
  const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>(CeilDiv(p.N, BN)));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, bool kFp8, bool kGated>
cudaError_t DispatchGemm(cudaStream_t stream, const GemmParams& p, const tuning::Tiles& t,
                         int bn, int64_t pairs, int64_t experts) {
  const int64_t active = experts < pairs ? experts : pairs;
  const int64_t max_tiles = CeilDiv(pairs, t.bm) + active;
  if (t.bm == 16 && bn == 32) return LaunchGemm<T, kFp8, kGated, 16, 32>(stream, p, max_tiles);
  if (t.bm == 16 && bn == 64) return LaunchGemm<T, kFp8, kGated, 16, 64>(stream, p, max_tiles);
  if (t.bm == 16) return LaunchGemm<T, kFp8, kGated, 16, 128>(stream, p, max_tiles);
  if (t.bm == 64) return LaunchGemm<T, kFp8, kGated, 64, 128>(stream, p, max_tiles);
  if constexpr (kGated) {
    return LaunchGemm<T, kFp8, kGated, 128, 64>(stream, p, max_tiles);
  } else {
    return LaunchGemm<T, kFp8, kGated, 128, 128>(stream, p, max_tiles);
  }
}

template <bool kFp8, bool kGated>
cudaError_t LaunchSimt(cudaStream_t stream, const GemmParams& p, int64_t pairs,
                       int64_t experts) {
  const int64_t active = experts < pairs ? experts : pairs;
  const dim3 grid(static_cast<unsigned>(CeilDiv(pairs, kSimtRows) + active),
                  static_cast<unsigned>(CeilDiv(p.N, kSimtThreads)));
  SimtGemmKernel<kFp8, kGated><<<grid, kSimtThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename L>
void LaunchRoute(cudaStream_t stream, const Shape& s, const void* logits, int32_t* ids,
                 float* weights) {
  const unsigned blocks = static_cast<unsigned>(CeilDiv(s.tokens, kRouteWarps));
  const size_t smem = sizeof(float) * kRouteWarps * static_cast<size_t>(s.routed);
  RouteKernel<L><<<blocks, kRouteWarps * 32, smem, stream>>>(
      static_cast<const L*>(logits), static_cast<int>(s.tokens), static_cast<int>(s.routed),
      static_cast<int>(s.top_k), s.renormalize, ids, weights);
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename T, bool kFp8>
cudaError_t Run(cudaStream_t stream, const Shape& s, const void* hidden, const void* logits,
                const void* w13, const void* w2, const float* w13_scale, const float* w2_scale,
                const int32_t* expert_offset, void* out, int32_t* ws_i32, float* ws_f32,
                void* ws_act) {
  const int64_t P = s.pairs, E = s.experts;
  int32_t* ids = ws_i32;
  int32_t* sorted_pairs = ids + P;
  int32_t* row_of_pair = sorted_pairs + P;
  int32_t* offsets = row_of_pair + P;
  int32_t* tiles = offsets + E + 1;
  int32_t* tile_count = tiles + 2 * MaxTiles(P, E);
  float* topk_weights = ws_f32;
  T* act = static_cast<T*>(ws_act);
  T* y = act + P * s.inter;

  switch (s.logits_dtype) {
    case ffi::DataType::BF16:
      LaunchRoute<__nv_bfloat16>(stream, s, logits, ids, topk_weights);
      break;
    case ffi::DataType::F16: LaunchRoute<__half>(stream, s, logits, ids, topk_weights); break;
    default: LaunchRoute<float>(stream, s, logits, ids, topk_weights); break;
  }
  constexpr bool kSimt = std::is_same_v<T, float>;
  const tuning::Tiles t = kSimt ? tuning::Tiles{kSimtRows, kSimtThreads, kSimtThreads}
                                : tuning::ChooseTiles(P, E, s.inter, s.hidden, SmCount());
  SortKernel<<<1, kSortThreads, 0, stream>>>(ids, static_cast<int>(P), static_cast<int>(E),
                                             t.bm, sorted_pairs, row_of_pair, offsets, tiles,
                                             tile_count, expert_offset);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  constexpr int64_t kWBytes = kFp8 ? 1 : 2;
  GemmParams g{};
  g.scale_bn = s.bn;
  g.scale_bk = s.bk;
  g.sorted_pairs = sorted_pairs;
  g.offsets = offsets;
  g.tiles = tiles;
  g.tile_count = tile_count;
  g.topk_weights = topk_weights;
  g.top_k = static_cast<int>(s.top_k);
  g.activation = s.activation == Activation::kSilu ? 0 : 1;

  GemmParams g1 = g;
  g1.a = hidden;
  g1.w = w13;
  g1.scale = w13_scale;
  g1.out = act;
  g1.K = s.hidden;
  g1.N = s.inter;
  g1.a_async = s.hidden * 2 % 16 == 0 && Aligned16(hidden);
  g1.w_async = s.hidden * kWBytes % 16 == 0 && Aligned16(w13);
  if constexpr (kSimt) {
    err = LaunchSimt<kFp8, true>(stream, g1, P, E);
  } else {
    err = DispatchGemm<T, kFp8, true>(stream, g1, t, t.bn1, P, E);
  }
  if (err != cudaSuccess) return err;

  GemmParams g2 = g;
  g2.a = act;
  g2.w = w2;
  g2.scale = w2_scale;
  g2.out = y;
  g2.K = s.inter;
  g2.N = s.hidden;
  g2.a_async = s.inter * 2 % 16 == 0 && Aligned16(act);
  g2.w_async = s.inter * kWBytes % 16 == 0 && Aligned16(w2);
  if constexpr (kSimt) {
    err = LaunchSimt<kFp8, false>(stream, g2, P, E);
  } else {
    err = DispatchGemm<T, kFp8, false>(stream, g2, t, t.bn2, P, E);
  }
  if (err != cudaSuccess) return err;

  const dim3 grid(static_cast<unsigned>(s.tokens),
                  static_cast<unsigned>(CeilDiv(s.hidden, kCombineThreads)));
  CombineKernel<T><<<grid, kCombineThreads, 0, stream>>>(y, row_of_pair, g.top_k, s.hidden,
                                                         static_cast<T*>(out));
  return cudaGetLastError();
}

ffi::Error Execute(cudaStream_t stream, const char* op, const Shape& s, const void* hidden,
                   const void* logits, const void* w13, const void* w2, const float* w13_scale,
                   const float* w2_scale, const int32_t* off, ffi::Result<ffi::AnyBuffer>& out,
                   ffi::Result<ffi::AnyBuffer>& ws_i32, ffi::Result<ffi::AnyBuffer>& ws_f32,
                   ffi::Result<ffi::AnyBuffer>& ws_act) {
  if (CeilDiv(s.hidden, 64) > 65535 || CeilDiv(s.inter, 64) > 65535 || s.tokens > 0x7fffffff)
    return InvalidArgument(op, "hidden", "too large for one launch", "split the call");
  if (s.pairs == 0) return ffi::Error::Success();
  auto* i32 = static_cast<int32_t*>(ws_i32->untyped_data());
  auto* f32 = static_cast<float*>(ws_f32->untyped_data());
  cudaError_t err;
  void* o = out->untyped_data();
  void* act = ws_act->untyped_data();
  switch (s.dtype) {
    case ffi::DataType::BF16:
      err = s.fp8 ? Run<__nv_bfloat16, true>(stream, s, hidden, logits, w13, w2, w13_scale,
                                             w2_scale, off, o, i32, f32, act)
                  : Run<__nv_bfloat16, false>(stream, s, hidden, logits, w13, w2, nullptr,
                                              nullptr, off, o, i32, f32, act);
      break;
    case ffi::DataType::F16:
      err = s.fp8 ? Run<__half, true>(stream, s, hidden, logits, w13, w2, w13_scale, w2_scale,
                                      off, o, i32, f32, act)
                  : Run<__half, false>(stream, s, hidden, logits, w13, w2, nullptr, nullptr,
                                       off, o, i32, f32, act);
      break;
    default:  // f32 (Decode accepts f32, bf16 and f16 only)
      err = s.fp8 ? Run<float, true>(stream, s, hidden, logits, w13, w2, w13_scale, w2_scale,
                                     off, o, i32, f32, act)
                  : Run<float, false>(stream, s, hidden, logits, w13, w2, nullptr, nullptr,
                                      off, o, i32, f32, act);
  }
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string(op) + ": launch failed: " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

ffi::Error FusedMoeCuda(cudaStream_t stream, ffi::AnyBuffer hidden, ffi::AnyBuffer logits,
                        ffi::AnyBuffer w13, ffi::AnyBuffer w2, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> ws_i32, ffi::Result<ffi::AnyBuffer> ws_f32,
                        ffi::Result<ffi::AnyBuffer> ws_act, int64_t top_k, bool renormalize,
                        std::string_view activation) {
  Shape s{};
  ffi::Error err = Decode(kOp, hidden, logits, w13, w2, *out, *ws_i32, *ws_f32, *ws_act, top_k,
                          renormalize, activation, &s);
  if (err.failure()) return err;
  return Execute(stream, kOp, s, hidden.untyped_data(), logits.untyped_data(),
                 w13.untyped_data(), w2.untyped_data(), nullptr, nullptr, nullptr, out, ws_i32,
                 ws_f32, ws_act);
}

ffi::Error FusedMoeFp8Cuda(cudaStream_t stream, ffi::AnyBuffer hidden, ffi::AnyBuffer logits,
                           ffi::AnyBuffer w13, ffi::AnyBuffer w2, ffi::AnyBuffer w13_scale,
                           ffi::AnyBuffer w2_scale, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> ws_i32,
                           ffi::Result<ffi::AnyBuffer> ws_f32,
                           ffi::Result<ffi::AnyBuffer> ws_act, int64_t top_k, bool renormalize,
                           std::string_view activation, ffi::Span<const int64_t> block_shape) {
  Shape s{};
  ffi::Error err = Decode(kOpFp8, hidden, logits, w13, w2, *out, *ws_i32, *ws_f32, *ws_act,
                          top_k, renormalize, activation, &s);
  if (err.failure()) return err;
  err = DecodeScales(kOpFp8, w13_scale, w2_scale, block_shape, &s);
  if (err.failure()) return err;
  return Execute(stream, kOpFp8, s, hidden.untyped_data(), logits.untyped_data(),
                 w13.untyped_data(), w2.untyped_data(),
                 static_cast<const float*>(w13_scale.untyped_data()),
                 static_cast<const float*>(w2_scale.untyped_data()), nullptr, out, ws_i32,
                 ws_f32, ws_act);
}

const int32_t* OffsetPtr(const ffi::AnyBuffer& offset) {
  return static_cast<const int32_t*>(offset.untyped_data());
}

ffi::Error FusedMoeEpCuda(cudaStream_t stream, ffi::AnyBuffer hidden, ffi::AnyBuffer logits,
                          ffi::AnyBuffer w13, ffi::AnyBuffer w2, ffi::AnyBuffer expert_offset,
                          ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> ws_i32,
                          ffi::Result<ffi::AnyBuffer> ws_f32,
                          ffi::Result<ffi::AnyBuffer> ws_act, int64_t top_k, bool renormalize,
                          std::string_view activation) {
  Shape s{};
  ffi::Error err = Decode(kOpEp, hidden, logits, w13, w2, *out, *ws_i32, *ws_f32, *ws_act,
                          top_k, renormalize, activation, &s);
  if (err.failure()) return err;
  err = DecodeOffset(kOpEp, expert_offset);
  if (err.failure()) return err;
  return Execute(stream, kOpEp, s, hidden.untyped_data(), logits.untyped_data(),
                 w13.untyped_data(), w2.untyped_data(), nullptr, nullptr,
                 OffsetPtr(expert_offset), out, ws_i32, ws_f32, ws_act);
}

ffi::Error FusedMoeFp8EpCuda(cudaStream_t stream, ffi::AnyBuffer hidden, ffi::AnyBuffer logits,
                             ffi::AnyBuffer w13, ffi::AnyBuffer w2, ffi::AnyBuffer w13_scale,
                             ffi::AnyBuffer w2_scale, ffi::AnyBuffer expert_offset,
                             ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> ws_i32,
                             ffi::Result<ffi::AnyBuffer> ws_f32,
                             ffi::Result<ffi::AnyBuffer> ws_act, int64_t top_k,
                             bool renormalize, std::string_view activation,
                             ffi::Span<const int64_t> block_shape) {
  Shape s{};
  ffi::Error err = Decode(kOpFp8Ep, hidden, logits, w13, w2, *out, *ws_i32, *ws_f32, *ws_act,
                          top_k, renormalize, activation, &s);
  if (err.failure()) return err;
  err = DecodeScales(kOpFp8Ep, w13_scale, w2_scale, block_shape, &s);
  if (err.failure()) return err;
  err = DecodeOffset(kOpFp8Ep, expert_offset);
  if (err.failure()) return err;
  return Execute(stream, kOpFp8Ep, s, hidden.untyped_data(), logits.untyped_data(),
                 w13.untyped_data(), w2.untyped_data(),
                 static_cast<const float*>(w13_scale.untyped_data()),
                 static_cast<const float*>(w2_scale.untyped_data()), OffsetPtr(expert_offset),
                 out, ws_i32, ws_f32, ws_act);
}

}  // namespace
}  // namespace xla_kernels::moe

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoeCuda, xla_kernels::moe::FusedMoeCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("top_k")
                                  .Attr<bool>("renormalize")
                                  .Attr<std::string_view>("activation"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoeFp8Cuda, xla_kernels::moe::FusedMoeFp8Cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("top_k")
                                  .Attr<bool>("renormalize")
                                  .Attr<std::string_view>("activation")
                                  .Attr<ffi::Span<const int64_t>>("block_shape"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoeEpCuda, xla_kernels::moe::FusedMoeEpCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("top_k")
                                  .Attr<bool>("renormalize")
                                  .Attr<std::string_view>("activation"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoeFp8EpCuda, xla_kernels::moe::FusedMoeFp8EpCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("top_k")
                                  .Attr<bool>("renormalize")
                                  .Attr<std::string_view>("activation")
                                  .Attr<ffi::Span<const int64_t>>("block_shape"),
                              {ffi::Traits::kCmdBufferCompatible});
