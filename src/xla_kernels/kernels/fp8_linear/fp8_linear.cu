// fp8_linear on NVIDIA GPUs (design and roofline in docs/kernels/fp8_linear.md). Handler
// XkFp8LinearCuda, command-buffer compatible, four paths:
// * decode (up to 16 tokens, bf16 / f16 x, weight-only, per-channel scales): the skinny GEMM
//   of xla_kernels/gemm/ (one launch, e4m3 converted in registers); from 9 tokens on, the
//   Hopper path goes first where it runs;
// * Hopper (compute capability 9.0, bf16 x, library built with CUTLASS's headers;
//   fp8_linear_sm90.cu): per-channel scales, weight-only, CUTLASS's mixed-input GEMM; W8A8
//   ("dynamic", any token count), x quantized per token into the workspace, then CUTLASS's
//   e4m3 GEMM with the channel and token scales in its epilogue, or with 128 x 128 block
//   scales CUTLASS's blockwise-scaled e4m3 GEMM;
// * tensor cores (fp8_linear_mma.cuh) for bf16 / f16 x, in a multiple of 128, block scales of
//   whole 128-column chunks (W8A8 on sm_89+): a workspace memset, (W8A8) a quantize pass, the
//   GEMM (K split so that the grid fills the SMs once), a finalize pass;
// * CUDA cores for the rest (f32 x, odd sizes, W8A8 on sm_80), one launch, below.
//
// The CUDA-core kernel: a CTA owns kRowsPerCta output rows and a tile of kTokens tokens. Per step of kChunk
// columns: every warp issues its 16-byte weight loads for the step (kRows rows x kChunk /
// kWarpCols loads per lane), the CTA stages the step's x columns in shared memory as f32
// (for "dynamic": quantized to e4m3 and back, with the row scales found in a prologue), then
// each lane dequantizes its 16 weights per load (fp8x2 -> half2 -> float2, times the block
// scale) and accumulates kRows x kTokens dot products in f32. x sits in shared memory lane-
// major ([column / 4 of the lane's 16][token][lane][4]), so each float4 read of a warp is
// 512 contiguous bytes, free of bank conflicts. The lanes' partial sums are added with
// shuffles; the per-channel and per-token scales multiply the result.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "fp8_linear_ffi.h"
#include "fp8_linear_mma.cuh"
#include "fp8_linear_sm90.h"
#include "fp8_linear_tuning.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/gemm/skinny_kernel.cuh"

namespace ffi = xla::ffi;

namespace xla_kernels::fp8_linear {
namespace {

using namespace tuning;  // NOLINT: the tile sizes

struct Params {
  const void* x;
  const uint8_t* w;
  const float* scale;
  void* y;
  int64_t tokens, in, out;
  int64_t bn, bk, scale_cols;  // block scales (bk > 0) or per channel (bk == 0)
  bool dynamic;
  bool vec;        // 16-byte weight loads: in % 16 == 0 and the weight 16-byte aligned
  bool vec_scale;  // block scales with bk % 16 == 0: one scale per 16-byte load
};

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

// Round to e4m3 (nearest even, saturated to +-448, as the host's F32ToE4m3Sat) and back.
__device__ inline float E4m3RoundTrip(float v) {
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
}

// Two e4m3 values (the low byte first) as floats; exact through half.
__device__ inline float2 E4m3x2ToF32(uint32_t two) {
  const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3));
  return __half22float2(h);
}

using mma::WarpMax;  // the W8A8 pass's; the CUDA-core prologue finds row amaxes too

__device__ inline float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where column k (of a step) of token t lives in the staged x tile (floats).
__device__ inline int StagedIndex(int t, int k) {
  const int sub = k / kWarpCols, lane = (k % kWarpCols) / kVec, j = k % kVec;
  return (((sub * (kVec / 4) + j / 4) * kTokens + t) * 32 + lane) * 4 + j % 4;
}

// The 16 weights of row `row` from column col0 (a multiple of 16) as raw bytes.
__device__ inline uint4 LoadWeights(const Params& p, int64_t row, int64_t col0) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (row >= p.out || col0 >= p.in) return v;
  const uint8_t* src = p.w + row * p.in + col0;
  if (p.vec) return __ldg(reinterpret_cast<const uint4*>(src));
  uint32_t words[4] = {0u, 0u, 0u, 0u};
  for (int e = 0; e < kVec && col0 + e < p.in; ++e)
    words[e / 4] |= static_cast<uint32_t>(__ldg(src + e)) << (8 * (e % 4));
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// raw's 16 weights in f32, times their block scales (per-channel scales come at the end).
template <bool kBlock>
__device__ inline void Dequantize(const Params& p, const uint4& raw, int64_t row, int64_t col0,
                                  float* w) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 lo = E4m3x2ToF32(words[q]), hi = E4m3x2ToF32(words[q] >> 16);
    w[4 * q] = lo.x;
    w[4 * q + 1] = lo.y;
    w[4 * q + 2] = hi.x;
    w[4 * q + 3] = hi.y;
  }
  if constexpr (kBlock) {
    if (row >= p.out || col0 >= p.in) return;
    const float* srow = p.scale + (row / p.bn) * p.scale_cols;
    if (p.vec_scale) {
      const float f = __ldg(srow + col0 / p.bk);
#pragma unroll
      for (int e = 0; e < kVec; ++e) w[e] *= f;
    } else {
      for (int e = 0; e < kVec; ++e)
        w[e] *= col0 + e < p.in ? __ldg(srow + (col0 + e) / p.bk) : 0.f;
    }
  }
}

template <typename T, bool kBlock>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) Fp8LinearKernel(const Params p) {
  __shared__ float4 staged[kChunk * kTokens / 4];
  __shared__ float row_scale[kTokens];
  float* staged_f = reinterpret_cast<float*>(staged);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* x = static_cast<const T*>(p.x);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + warp * kRows;
  constexpr int kSubs = kChunk / kWarpCols;

  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokens; t0 < p.tokens;
       t0 += static_cast<int64_t>(gridDim.y) * kTokens) {
    const int nt = p.tokens - t0 < kTokens ? static_cast<int>(p.tokens - t0) : kTokens;
    __syncthreads();  // row_scale and the staged tile of the previous token tile are read
    {  // the prologue: warp w finds the scale of token t0 + w
      float s = 1.f;
      if (p.dynamic && warp < nt) {
        const T* xr = x + (t0 + warp) * p.in;
        float amax = 0.f;
        for (int64_t i = lane; i < p.in; i += 32) amax = fmaxf(amax, fabsf(Load(xr[i])));
        s = ActivationScale(WarpMax(amax));
      }
      if (lane == 0) row_scale[warp] = s;
    }
    float acc[kRows][kTokens];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < kTokens; ++t) acc[r][t] = 0.f;

    for (int64_t c0 = 0; c0 < p.in; c0 += kChunk) {
      uint4 raw[kRows][kSubs];  // issued first: in flight while x is staged
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int u = 0; u < kSubs; ++u)
          raw[r][u] = LoadWeights(p, row0 + r, c0 + u * kWarpCols + lane * kVec);
      __syncthreads();  // the previous step's tile is read; row_scale is written
      // Only the tile's nt tokens: the arithmetic below skips the others.
      for (int e = threadIdx.x; e < nt * kChunk; e += kThreads) {
        const int t = e / kChunk, k = e % kChunk;
        const int64_t col = c0 + k;
        float v = 0.f;
        if (col < p.in) {
          v = Load(x[(t0 + t) * p.in + col]);
          if (p.dynamic) v = E4m3RoundTrip(v / row_scale[t]);
        }
        staged_f[StagedIndex(t, k)] = v;
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kSubs; ++u) {
        const int64_t col0 = c0 + u * kWarpCols + lane * kVec;
        float w[kRows][kVec];
#pragma unroll
        for (int r = 0; r < kRows; ++r) Dequantize<kBlock>(p, raw[r][u], row0 + r, col0, w[r]);
#pragma unroll
        for (int q = 0; q < kVec / 4; ++q) {
#pragma unroll
          for (int t = 0; t < kTokens; ++t) {
            if (t < nt) {  // uniform across the CTA: a decode tile of 1 token does 1/8
              const float4 xv = staged[((u * (kVec / 4) + q) * kTokens + t) * 32 + lane];
#pragma unroll
              for (int r = 0; r < kRows; ++r) {
                float a = acc[r][t];
                a = fmaf(xv.x, w[r][4 * q], a);
                a = fmaf(xv.y, w[r][4 * q + 1], a);
                a = fmaf(xv.z, w[r][4 * q + 2], a);
                a = fmaf(xv.w, w[r][4 * q + 3], a);
                acc[r][t] = a;
              }
            }
          }
        }
      }
    }
    T* y = static_cast<T*>(p.y);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r;
      const float channel = !kBlock && row < p.out ? __ldg(p.scale + row) : 1.f;
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        const float sum = WarpSum(acc[r][t]);
        if (lane == (r * kTokens + t) % 32 && row < p.out && t < nt)
          y[(t0 + t) * p.out + row] = Store<T>(sum * channel * row_scale[t]);
      }
    }
  }
}

template <typename T>
cudaError_t Launch(cudaStream_t stream, const Params& p) {
  const int64_t tiles = CeilDiv(p.tokens, kTokens);
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.out, kRowsPerCta)),
                  static_cast<unsigned>(tiles < kMaxGridY ? tiles : kMaxGridY));
  if (p.bk > 0) {
    Fp8LinearKernel<T, true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    Fp8LinearKernel<T, false><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

int DeviceAttribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&value, attr, device);
  return value;
}

// The tensor-core path's conditions (see the file comment); the CUDA-core kernel takes the rest.
bool UseMma(const Shape& s, const Params& p) {
  if (s.dtype != ffi::DataType::BF16 && s.dtype != ffi::DataType::F16) return false;
  if (s.in % mma::kChunk != 0) return false;
  if (reinterpret_cast<uintptr_t>(p.w) % 16 != 0 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0)
    return false;
  if (s.bk > 0 && (s.bk % mma::kChunk != 0 || s.bn % 8 != 0)) return false;
  if (s.dynamic) {
    const int arch = 10 * DeviceAttribute(cudaDevAttrComputeCapabilityMajor) +
                     DeviceAttribute(cudaDevAttrComputeCapabilityMinor);
    if (arch < 89) return false;  // no e4m3 mma.sync before sm_89
  }
  return true;
}

// Decode with per-channel scales, weight-only: the skinny GEMM (one launch, no workspace,
// K split over a cluster), measured faster than the tensor-core path up to kSkinnyTokens
// tokens (docs/design/gemm.md); block scales stay on the tensor-core path, which applies
// them per 128-column chunk.
constexpr int64_t kSkinnyTokens = 16;

gemm::SkinnyParams SkinnyParamsOf(const Params& p) {
  gemm::SkinnyParams sp{};
  sp.x = p.x;
  sp.w = p.w;
  sp.scale = p.scale;
  sp.y = p.y;
  sp.tokens = p.tokens;
  sp.k = p.in;
  sp.n = p.out;
  sp.bn = 1;
  return sp;
}

bool UseSkinny(const Shape& s, const Params& p) {
  if (s.dtype != ffi::DataType::BF16 && s.dtype != ffi::DataType::F16) return false;
  if (s.dynamic || s.bk > 0 || s.tokens > kSkinnyTokens) return false;
  return gemm::SkinnySupports(SkinnyParamsOf(p), /*fp8=*/true);
}

template <typename T, typename A, bool kBlock, int kMf>
cudaError_t LaunchGemm(cudaStream_t stream, const mma::Params& mp) {
  auto kernel = mma::GemmKernel<T, A, kBlock, kMf>;
  constexpr int kSmem = mma::kStages * mma::Stage<A, kMf * 16>::kBytes;
  // Per launch: the attribute belongs to the current device.
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  // The resident CTA slots, found once per kernel (as the SM count: the first device's),
  // not on every call's host path.
  static const std::pair<cudaError_t, int> occupancy = [&] {
    int per_sm = 0;
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, mma::kThreads, kSmem);
    return std::pair<cudaError_t, int>{err, per_sm};
  }();
  if (occupancy.first != cudaSuccess) return occupancy.first;
  const int per_sm = occupancy.second;
  static const int sms = DeviceAttribute(cudaDevAttrMultiProcessorCount);
  const int64_t slots = static_cast<int64_t>(per_sm > 0 ? per_sm : 1) * (sms > 0 ? sms : 1);
  const int64_t chunks = mp.in / mma::kChunk;
  const int64_t tiles_m = CeilDiv(mp.tokens, kMf * 16), tiles_n = CeilDiv(mp.out, mma::kBN);
  // Split K so that the grid fills the resident slots once (a second, partial wave would
  // double a decode call's time); a grid that fills them anyway is not split.
  int64_t splits = slots / (tiles_m * tiles_n);
  splits = splits < 1 ? 1 : (splits > chunks ? chunks : splits);
  splits = splits > 65535 ? 65535 : splits;
  mma::Params p = mp;
  p.chunks_per_split = static_cast<int>(CeilDiv(chunks, splits));
  splits = CeilDiv(chunks, p.chunks_per_split);
  const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n),
                  static_cast<unsigned>(splits));
  kernel<<<grid, mma::kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

// The GEMM for x's element type A (T, or e4m3 bytes for W8A8), picking the tile height.
template <typename T, typename A>
cudaError_t LaunchGemmFor(cudaStream_t stream, const mma::Params& mp, bool block) {
  const bool one = mma::MfFor(mp.tokens) == 1;
  if (block) return one ? LaunchGemm<T, A, true, 1>(stream, mp) : LaunchGemm<T, A, true, 2>(stream, mp);
  return one ? LaunchGemm<T, A, false, 1>(stream, mp) : LaunchGemm<T, A, false, 2>(stream, mp);
}

template <typename T>
cudaError_t LaunchMma(cudaStream_t stream, const Params& p, float* workspace) {
  const int64_t tokens = p.tokens, out = p.out;
  float* acc = workspace;
  float* row_scale = workspace + tokens * out;
  uint8_t* xp = reinterpret_cast<uint8_t*>(workspace + RoundUp4(tokens * out + tokens));
  cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(float) * tokens * out, stream);
  if (e != cudaSuccess) return e;
  mma::Params mp{};
  mp.x = xp;
  mp.w = p.w;
  mp.scale = p.scale;
  mp.acc = acc;
  mp.tokens = tokens;
  mp.in = p.in;
  mp.out = out;
  mp.bn = p.bn;
  mp.bk = p.bk;
  mp.scale_cols = p.scale_cols;
  const T* x = static_cast<const T*>(p.x);
  if (p.dynamic) {
    mma::QuantizeRowsKernel<T><<<static_cast<unsigned>(tokens), mma::kThreads, 0, stream>>>(
        x, tokens, p.in, xp, row_scale);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    e = LaunchGemmFor<T, uint8_t>(stream, mp, p.bk > 0);
  } else {
    const int64_t blocks = CeilDiv(tokens * p.in / 2, 256);
    mma::PermuteRowsKernel<T><<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0,
                                stream>>>(x, tokens, p.in, xp);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    e = LaunchGemmFor<T, T>(stream, mp, p.bk > 0);
  }
  if (e != cudaSuccess) return e;
  const int64_t blocks = CeilDiv(tokens * out, 256);
  mma::FinalizeKernel<T><<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0,
                           stream>>>(acc, p.dynamic ? row_scale : nullptr, tokens, out,
                                     static_cast<T*>(p.y));
  return cudaGetLastError();
}

// W8A8 on the Hopper path: x quantized per token into the workspace (its scales first, then x
// in e4m3, [tokens, in], at a 16-byte aligned offset), then CUTLASS's e4m3 GEMM with both
// scales in the epilogue. False, with nothing launched, where the Hopper path does not run
// (CUTLASS's TMA wants 16-byte rows: in a multiple of 16, bf16 y's out of 8); a call CUTLASS
// still declines after x was quantized also gives false, and the next path quantizes again.
bool LaunchSm90W8A8Quantized(cudaStream_t stream, const Shape& s, const Params& p,
                             float* workspace, size_t workspace_bytes, cudaError_t* status) {
  const size_t xq_offset = sizeof(float) * RoundUp4(s.tokens);
  const size_t needed = xq_offset + static_cast<size_t>(s.tokens * s.in);
  using gemm::Aligned16;
  if (s.in % 16 != 0 || s.out % 8 != 0 || !Aligned16(p.w) || !Aligned16(p.y) ||
      !Aligned16(p.scale) || !Aligned16(workspace) || workspace_bytes < needed || !Sm90PathRuns())
    return false;
  float* token_scale = workspace;
  uint8_t* xq = reinterpret_cast<uint8_t*>(workspace) + xq_offset;
  mma::QuantizeRowsKernel<__nv_bfloat16, /*kRowMajor=*/true>
      <<<static_cast<unsigned>(s.tokens), mma::kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(p.x), s.tokens, s.in, xq, token_scale);
  if ((*status = cudaGetLastError()) != cudaSuccess) return true;
  gemm::SwapAbCall call{p.w, xq, p.y, p.scale, s.tokens, s.in, s.out};
  call.token_scale = token_scale;
  return LaunchSm90W8A8(stream, call, status);
}

// Block-scaled W8A8's first pass, one launch: CTA t < tokens quantizes token t's row
// (mma::QuantizeRow) and writes its scale once per K block into sfb; the CTAs after them
// write the weight's [ceil(out / bn)][k_blocks] block scales once per 64-row group into sfa
// and zero sfb's padding tokens. sfa and sfb are the layouts CUTLASS's blockwise mainloop
// reads (gemm::BlockScales): [k_blocks][row_groups] and [k_blocks][token_stride], MN-major.
__global__ void __launch_bounds__(mma::kThreads)
    QuantizeRowsBlockScalesKernel(const __nv_bfloat16* x, int64_t tokens, int64_t in,
                                  uint8_t* xq, const float* weight_scale, int64_t bn,
                                  int64_t k_blocks, int64_t row_groups, int64_t token_stride,
                                  float* sfa, float* sfb) {
  if (blockIdx.x < tokens) {
    const int64_t t = blockIdx.x;
    const float s = mma::QuantizeRow<__nv_bfloat16, /*kRowMajor=*/true>(x, tokens, in, t, xq);
    for (int64_t kb = threadIdx.x; kb < k_blocks; kb += mma::kThreads)
      sfb[kb * token_stride + t] = s;
    return;
  }
  const int64_t n_sfa = k_blocks * row_groups, padding = token_stride - tokens;
  const int64_t n_all = n_sfa + k_blocks * padding;
  const int64_t stride = (gridDim.x - tokens) * static_cast<int64_t>(mma::kThreads);
  for (int64_t i = (blockIdx.x - tokens) * static_cast<int64_t>(mma::kThreads) + threadIdx.x;
       i < n_all; i += stride) {
    if (i < n_sfa) {
      const int64_t kb = i / row_groups, group = i % row_groups;
      sfa[i] = weight_scale[group * gemm::kBlockScaleRows / bn * k_blocks + kb];
    } else {
      const int64_t j = i - n_sfa;
      sfb[j / padding * token_stride + tokens + j % padding] = 0.f;
    }
  }
}

// W8A8 with 128 x 128 block-scaled weights (bk 128, bn a multiple of 64) on the Hopper path:
// x quantized per token and both scales laid out for CUTLASS in one launch
// (QuantizeRowsBlockScalesKernel), then the blockwise e4m3 GEMM. Workspace: x in e4m3
// [tokens, in] (rounded up to 16 bytes), the weight's scales [k_blocks][ceil(out / 64)]
// (rounded up to 4), the tokens' [k_blocks][RoundUp4(tokens)]; false, with nothing launched,
// where any of it does not hold or fit. A call CUTLASS still declines after x was quantized
// also gives false, and the next path quantizes again.
bool LaunchSm90W8A8BlockQuantized(cudaStream_t stream, const Shape& s, const Params& p,
                                  float* workspace, size_t workspace_bytes,
                                  cudaError_t* status) {
  using gemm::Aligned16;
  if (s.bk != gemm::kBlockScaleCols || s.bn % gemm::kBlockScaleRows != 0 || s.in % 16 != 0 ||
      s.out % 8 != 0 || !Aligned16(p.w) || !Aligned16(p.y) || !Aligned16(workspace) ||
      !Sm90PathRuns())
    return false;
  const int64_t token_stride = RoundUp4(s.tokens);
  const int64_t k_blocks = CeilDiv(s.in, gemm::kBlockScaleCols);
  const int64_t row_groups = CeilDiv(s.out, gemm::kBlockScaleRows);
  const size_t sfa_offset = (static_cast<size_t>(s.tokens * s.in) + 15) / 16 * 16;
  const size_t sfb_offset = sfa_offset + sizeof(float) * RoundUp4(k_blocks * row_groups);
  const size_t needed = sfb_offset + sizeof(float) * k_blocks * token_stride;
  if (workspace_bytes < needed) return false;
  auto* base = reinterpret_cast<uint8_t*>(workspace);
  auto* sfa = reinterpret_cast<float*>(base + sfa_offset);
  auto* sfb = reinterpret_cast<float*>(base + sfb_offset);
  // After the tokens' CTAs, enough for sfa and sfb's padding (at most 3 tokens a K block) in
  // one stride where that takes at most 64.
  const int64_t layout_ctas =
      std::clamp<int64_t>(CeilDiv(k_blocks * (row_groups + 3), mma::kThreads), 1, 64);
  const auto grid = static_cast<unsigned>(s.tokens + layout_ctas);
  QuantizeRowsBlockScalesKernel<<<grid, mma::kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(p.x), s.tokens, s.in, base, p.scale, s.bn, k_blocks,
      row_groups, token_stride, sfa, sfb);
  if ((*status = cudaGetLastError()) != cudaSuccess) return true;
  gemm::SwapAbCall call{p.w, base, p.y, nullptr, s.tokens, s.in, s.out};
  return LaunchSm90W8A8BlockScaled(stream, call, {sfa, sfb, token_stride}, status);
}

// Up to this many tokens the skinny GEMM goes before the Hopper path: at one token it was
// 1.03-1.5x faster on each of Llama-3-8B's linears, at 16 the Hopper path was faster in sum
// (docs/design/gemm.md, "fp8 weights on the Hopper GEMM").
constexpr int64_t kSkinnyBeforeHopperTokens = 8;

// The fastest path that takes the call (the order of the file's header comment).
cudaError_t LaunchFastest(cudaStream_t stream, const Shape& s, const Params& p, float* workspace,
                          size_t workspace_bytes) {
  const bool skinny = UseSkinny(s, p);
  const auto launch_skinny = [&] {
    const gemm::SkinnyParams sp = SkinnyParamsOf(p);
    return s.dtype == ffi::DataType::BF16
               ? gemm::LaunchSkinny<__nv_bfloat16, uint8_t>(stream, sp, false)
               : gemm::LaunchSkinny<__half, uint8_t>(stream, sp, false);
  };
  if (skinny && s.tokens <= kSkinnyBeforeHopperTokens) return launch_skinny();
  cudaError_t status = cudaSuccess;
  if (s.dtype == ffi::DataType::BF16 && !s.dynamic && s.bk == 0 &&
      LaunchSm90(stream, {p.w, p.x, p.y, p.scale, s.tokens, s.in, s.out, workspace, workspace_bytes},
                 &status))
    return status;
  if (s.dtype == ffi::DataType::BF16 && s.dynamic && s.bk == 0 && s.tokens > 0 &&
      LaunchSm90W8A8Quantized(stream, s, p, workspace, workspace_bytes, &status))
    return status;
  if (s.dtype == ffi::DataType::BF16 && s.dynamic && s.bk > 0 && s.tokens > 0 &&
      LaunchSm90W8A8BlockQuantized(stream, s, p, workspace, workspace_bytes, &status))
    return status;
  if (skinny) return launch_skinny();
  if (UseMma(s, p)) {
    return s.dtype == ffi::DataType::BF16 ? LaunchMma<__nv_bfloat16>(stream, p, workspace)
                                          : LaunchMma<__half>(stream, p, workspace);
  }
  switch (s.dtype) {
    case ffi::DataType::BF16: return Launch<__nv_bfloat16>(stream, p);
    case ffi::DataType::F16: return Launch<__half>(stream, p);
    default: return Launch<float>(stream, p);
  }
}

ffi::Error Fp8LinearCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                         ffi::AnyBuffer scale, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::AnyBuffer> workspace,
                         ffi::Span<const int64_t> block_shape,
                         std::string_view activation_scheme) {
  Shape s{};
  ffi::Error err = Decode(x, weight, scale, *y, block_shape, activation_scheme, &s);
  if (err.failure()) return err;
  if (s.tokens == 0) return ffi::Error::Success();
  Params p{};
  p.x = x.untyped_data();
  p.w = static_cast<const uint8_t*>(weight.untyped_data());
  p.scale = static_cast<const float*>(scale.untyped_data());
  p.y = y->untyped_data();
  p.tokens = s.tokens;
  p.in = s.in;
  p.out = s.out;
  p.bn = s.bn;
  p.bk = s.bk;
  p.scale_cols = s.bk > 0 ? CeilDiv(s.in, s.bk) : 1;
  p.dynamic = s.dynamic;
  p.vec = s.in % kVec == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
  p.vec_scale = s.bk > 0 && s.bk % kVec == 0;
  if (UseMma(s, p) && (static_cast<int64_t>(workspace->element_count()) < WorkspaceElements(s) ||
                       workspace->element_type() != ffi::DataType::F32))
    return InvalidArgument(kOp, "workspace", "expected " +
                           std::to_string(WorkspaceElements(s)) + " f32 elements",
                           "call fp8_linear through its Python op, which sizes it");
  const size_t workspace_bytes =
      workspace->element_type() == ffi::DataType::F32 ? workspace->size_bytes() : 0;
  const cudaError_t status = LaunchFastest(
      stream, s, p, static_cast<float*>(workspace->untyped_data()), workspace_bytes);
  if (status != cudaSuccess)
    return ffi::Error::Internal(std::string(kOp) + ": launch failed: " +
                                cudaGetErrorString(status));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace xla_kernels::fp8_linear

XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFp8LinearCuda, xla_kernels::fp8_linear::Fp8LinearCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("block_shape")
                                  .Attr<std::string_view>("activation_scheme"),
                              {ffi::Traits::kCmdBufferCompatible});
