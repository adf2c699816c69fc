// fused_moe on NVIDIA GPUs: the XLA FFI binding of the kernel core in moe_routing.cuh and
// moe_gemm.cuh (design and roofline in docs/design/moe.md).
//
// Handlers XkFusedMoeCuda and XkFusedMoeFp8Cuda, and the expert-parallel XkFusedMoeEpCuda and
// XkFusedMoeFp8EpCuda (routing over every expert's logit, the sort keeping the local block's
// pairs; the offset stays on the device, read by the sort kernel): bound, decoded and
// validated by moe_ffi.h (shared with the CPU handlers), then Compute picks the tiles
// (moe_tuning.h) and makes five launches on XLA's stream:
// routing, the sort by expert, GEMM1 + activation, GEMM2 + routing weight, the per-token sum.
// bf16/f16 run the tensor-core GEMMs of moe_gemm.cuh; f32 runs SimtGemmKernel (CUDA cores,
// moe_simt_gemm.cuh).
// Command-buffer (CUDA graph) compatible: which tiles exist is decided on the device.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "moe_ffi.h"
#include "moe_gemm.cuh"
#include "moe_limits.h"
#include "moe_routing.cuh"
#include "moe_simt_gemm.cuh"
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

// One grouped GEMM: f32 on CUDA cores, bf16/f16 on the tensor cores in tiles of t.bm x bn.
template <typename T, bool kFp8, bool kGated>
cudaError_t Gemm(cudaStream_t stream, const GemmParams& p, const tuning::Tiles& t, int bn,
                 int64_t pairs, int64_t experts) {
  if constexpr (std::is_same_v<T, float>) {
    return LaunchSimt<kFp8, kGated>(stream, p, pairs, experts);
  } else {
    return DispatchGemm<T, kFp8, kGated>(stream, p, t, bn, pairs, experts);
  }
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
cudaError_t Run(cudaStream_t stream, const Call& c) {
  const Shape& s = c.s;
  const void *hidden = c.hidden, *logits = c.logits, *w13 = c.w13, *w2 = c.w2;
  const float *w13_scale = c.w13_scale, *w2_scale = c.w2_scale;  // null unless kFp8
  const int64_t P = s.pairs, E = s.experts;
  int32_t* ids = static_cast<int32_t*>(c.ws_i32);
  int32_t* sorted_pairs = ids + P;
  int32_t* row_of_pair = sorted_pairs + P;
  int32_t* offsets = row_of_pair + P;
  int32_t* tiles = offsets + E + 1;
  int32_t* tile_count = tiles + 2 * MaxTiles(P, E);
  float* topk_weights = static_cast<float*>(c.ws_f32);
  T* act = static_cast<T*>(c.ws_act);
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
                                             tile_count, c.expert_offset);
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

  // A GEMM's operands: A rows of K elements, the weights, the output of N columns.
  auto operands = [&](const void* a, const void* w, const float* scale, T* o, int64_t K,
                      int64_t N) {
    GemmParams p = g;
    p.a = a;
    p.w = w;
    p.scale = scale;
    p.out = o;
    p.K = K;
    p.N = N;
    p.a_async = K * 2 % 16 == 0 && Aligned16(a);
    p.w_async = K * kWBytes % 16 == 0 && Aligned16(w);
    return p;
  };
  err = Gemm<T, kFp8, true>(stream, operands(hidden, w13, w13_scale, act, s.hidden, s.inter), t,
                            t.bn1, P, E);
  if (err != cudaSuccess) return err;
  err = Gemm<T, kFp8, false>(stream, operands(act, w2, w2_scale, y, s.inter, s.hidden), t,
                             t.bn2, P, E);
  if (err != cudaSuccess) return err;

  const dim3 grid(static_cast<unsigned>(s.tokens),
                  static_cast<unsigned>(CeilDiv(s.hidden, kCombineThreads)));
  CombineKernel<T><<<grid, kCombineThreads, 0, stream>>>(y, row_of_pair, g.top_k, s.hidden,
                                                         static_cast<T*>(c.out));
  return cudaGetLastError();
}

template <typename T>
cudaError_t RunAs(cudaStream_t stream, const Call& c) {
  return c.s.fp8 ? Run<T, true>(stream, c) : Run<T, false>(stream, c);
}

ffi::Error Compute(cudaStream_t stream, const Call& c) {
  const Shape& s = c.s;
  if (CeilDiv(s.hidden, 64) > 65535 || CeilDiv(s.inter, 64) > 65535 || s.tokens > 0x7fffffff)
    return InvalidArgument(c.op, "hidden", "too large for one launch", "split the call");
  if (s.pairs == 0) return ffi::Error::Success();
  cudaError_t err;
  switch (s.dtype) {
    case ffi::DataType::BF16: err = RunAs<__nv_bfloat16>(stream, c); break;
    case ffi::DataType::F16: err = RunAs<__half>(stream, c); break;
    default: err = RunAs<float>(stream, c);  // f32 (Decode accepts f32, bf16 and f16 only)
  }
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string(c.op) + ": launch failed: " +
                                cudaGetErrorString(err));
  return ffi::Error::Success();
}

using CudaHandlers = Handlers<Compute, cudaStream_t>;

// Every CUDA handler's binding starts with XLA's stream.
auto StreamBinding() { return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>(); }

}  // namespace
}  // namespace xla_kernels::moe

XK_MOE_DEFINE_HANDLERS(Cuda, xla_kernels::moe::CudaHandlers,
                       xla_kernels::moe::StreamBinding(), {ffi::Traits::kCmdBufferCompatible});
