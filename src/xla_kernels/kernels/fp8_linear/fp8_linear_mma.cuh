// fp8_linear on tensor cores (sm_80+ for weight-only, sm_89+ for W8A8). At decode the weight
// read is the cost: the K chunks stream through a kStages-deep cp.async ring in shared memory
// (three chunks in flight per CTA, two CTAs per SM), and every weight byte is read once by one
// lane and fed to mma.sync from registers. Design and measurements:
// docs/kernels/fp8_linear.md.
//
// A CTA owns BM tokens (kMf m16 fragments) x kBN output rows and one split of the K chunks;
// its 8 warps take 16 rows each (two n8 fragments) and all BM tokens. Per chunk of kChunk
// columns, lane (row g = lane / 4, quad q = lane % 4) of fragment f reads bytes
// [64 h + 16 q, 64 h + 16 q + 16) of its row for each half h: the fragment's B operands come
// out of those registers with the K order permuted (a dot product does not care), and x's
// chunk is copied into shared memory (4-byte cp.async) in the same permuted order, so that
// ldmatrix hands every warp its A fragments. The permutation is done once per call by
// PermuteRowsKernel (W8A16) or QuantizeRowsKernel (W8A8), which write x into the workspace in
// stage order ([chunk][step][token][32 bytes]): each stage is then whole 16-byte copies, as the
// weights are:
//   W8A16 (bf16 / f16 x): m16n8k16 steps; 4 weight bytes of a lane are the step's two B
//     registers. f16 x: e4m3 -> f16 is exact (cvt). bf16 x: the e4m3 bits are moved into
//     bf16's fields (sign, exponent, mantissa), the weight times 2^-120 for normals and
//     subnormals alike, then multiplied by 2^120 in bf16 (exact).
//   W8A8 (x quantized per token to e4m3 by QuantizeRowsKernel): m16n8k32 e4m3 steps; 8 weight
//     bytes are a step's two B registers.
// Block scales (bk a multiple of kChunk, bn of 8) multiply each chunk's partial sums; channel
// scales multiply the end result. Splits add their f32 sums into a zeroed workspace with
// atomicAdd; FinalizeKernel scales by the token's activation scale and rounds to x's dtype.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "xla_kernels/cuda_mma.cuh"
#include "xla_kernels/gemm/fp8_convert.cuh"

namespace xla_kernels::fp8_linear::mma {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kNf = 2;         // n8 fragments per warp
constexpr int kBN = kWarps * kNf * 8;  // 128 output rows per CTA
constexpr int kChunk = 128;    // K columns per pipeline stage
constexpr int kHalves = kChunk / 64;
constexpr int kStages = 4;     // chunks in the ring: three in flight while one is computed
constexpr int kWBytes = kBN * kChunk;  // a stage's weights: 128 rows x 128 bytes

// m16 fragments per CTA tile for a call: one up to 16 tokens, else two (four spilled the
// 16-bit kernels' registers at two CTAs per SM); further token tiles are more CTAs, which read
// the same weight chunks (from L2 when they run together: blockIdx.x is the token tile).
constexpr int MfFor(int64_t tokens) { return tokens <= 16 ? 1 : 2; }

struct Params {
  const uint8_t* x;    // x in stage order (PermutedIndex): T (weight-only) or e4m3 (W8A8)
  const uint8_t* w;    // [out, in] e4m3
  const float* scale;  // [out] per channel, or [ceil(out / bn), scale_cols] per block
  float* acc;          // [tokens, out] f32, zeroed: the splits' sums
  int64_t tokens, in, out;
  int64_t bn, bk, scale_cols;  // bk == 0: per channel
  int chunks_per_split;
};

// A stage's x tile: kSteps steps of BM rows x 32 bytes (a step's k16 bf16 / k32 e4m3
// columns), each row's two 16-byte halves swapped on rows 4-7 of every 8 so that ldmatrix's
// eight rows hit distinct banks.
template <typename A, int BM>
struct Stage {
  static constexpr int kSteps = kChunk * static_cast<int>(sizeof(A)) / 32;
  static constexpr int kABytes = kSteps * BM * 32;
  static constexpr int kWordsPerRow = kChunk * static_cast<int>(sizeof(A)) / 4;
  static constexpr int kBytes = kWBytes + kABytes;  // weights first, then x
};

template <int BM>
__device__ __forceinline__ int AOffset(int step, int row, int word) {
  const int half = (word >> 2) ^ ((row >> 2) & 1);
  return step * BM * 32 + row * 32 + half * 16 + (word & 3) * 4;
}

// A weight row's 16-byte unit u (0..7) in a stage: odd rows swap their halves, so that the
// eight lanes of an LDS.128 phase (rows g, g + 1; quads 0..3) read eight distinct units.
__device__ __forceinline__ int WOffset(int row, int unit) {
  return row * kChunk + ((unit ^ (4 * (row & 1))) << 4);
}

// Byte offset of x[t, k] (element size E) in stage order: [chunk][step][token][32 bytes],
// steps and words permuted to match the weights' K order (see the file comment): column k of
// a 64-column half is in 16-column quad q = (k % 64) / 16; its word wx (4 bytes) within the
// half goes to step wx' / 2 and word 4 (wx' % 2) + q of that step, wx' = wx mod words per quad.
template <int E>
__device__ __forceinline__ int64_t PermutedIndex(int64_t tokens, int64_t t, int64_t k) {
  constexpr int kWordsPerHalf = 64 * E / 4, kWordsPerQuad = 16 * E / 4;
  constexpr int kStepsPerHalf = kWordsPerHalf / 8, kSteps = kChunk * E / 32;
  const int64_t c = k / kChunk;
  const int byte = static_cast<int>(k % kChunk) * E;
  const int half = byte / (64 * E), wx = (byte % (64 * E)) / 4, within = byte % 4;
  const int q = wx / kWordsPerQuad, r = wx % kWordsPerQuad;
  const int step = half * kStepsPerHalf + r / 2, word = 4 * (r % 2) + q;
  return ((c * kSteps + step) * tokens + t) * 32 + word * 4 + within;
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// A thread's 16-byte copies of one stage, fixed for the CTA: chunk c adds c times the
// chunk's stride to every source. Rows past out and tokens past the call's are zero-filled.
template <typename A, int BM>
struct CopyPlan {
  using S = Stage<A, BM>;
  static constexpr int kW = kWBytes / 16 / kThreads;
  static constexpr int kA = S::kABytes / 16 / kThreads > 0 ? S::kABytes / 16 / kThreads : 1;
  const uint8_t* w_src[kW];
  int w_dst[kW];
  bool w_valid[kW];
  const uint8_t* a_src[kA];
  int a_dst[kA];
  bool a_valid[kA];
  int64_t a_stride;  // bytes of x per chunk in stage order

  __device__ __forceinline__ CopyPlan(const Params& p, int64_t t0, int64_t n_cta) {
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const int e = threadIdx.x + i * kThreads, row = e / 8, unit = e % 8;
      w_valid[i] = n_cta + row < p.out;
      w_src[i] = p.w + (w_valid[i] ? (n_cta + row) * p.in + unit * 16 : 0);
      w_dst[i] = WOffset(row, unit);
    }
    a_stride = static_cast<int64_t>(S::kSteps) * p.tokens * 32;
#pragma unroll
    for (int i = 0; i < kA; ++i) {  // unit e: (step, token, 16-byte half)
      const int e = threadIdx.x + i * kThreads;
      const int step = e / (BM * 2), t = (e / 2) % BM, half = e % 2;
      a_valid[i] = e < S::kABytes / 16 && t0 + t < p.tokens;
      a_src[i] = p.x + (a_valid[i] ? (step * p.tokens + t0 + t) * 32 + half * 16 : 0);
      a_dst[i] = kWBytes + AOffset<BM>(step, t, 4 * half);
    }
  }

  __device__ __forceinline__ void Issue(uint8_t* stage, int64_t c) const {
#pragma unroll
    for (int i = 0; i < kW; ++i)
      CpAsync16(stage + w_dst[i], w_src[i] + (w_valid[i] ? c * kChunk : 0), w_valid[i]);
#pragma unroll
    for (int i = 0; i < kA; ++i)
      if (threadIdx.x + i * kThreads < S::kABytes / 16)
        CpAsync16(stage + a_dst[i], a_src[i] + (a_valid[i] ? c * a_stride : 0), a_valid[i]);
  }
};

using gemm::E4m3ToB16;

// D += A (16x32 e4m3, row) * B (32x8 e4m3, col), f32 accumulate (sm_89+).
__device__ __forceinline__ void MmaE4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the host launches the W8A8 kernel on sm_89+ only
#endif
}

// One stage's MMAs: acc[m][f] += A(stage) * W(stage) for the warp's rows.
template <typename T, typename A, int kMf>
__device__ __forceinline__ void StageMma(const uint8_t* stage, int warp, int lane, int mfs,
                                         float (&acc)[kMf][kNf][4]) {
  constexpr int BM = kMf * 16;
  constexpr int kSteps = Stage<A, BM>::kSteps, kStepsPerHalf = kSteps / kHalves;
  uint4 wv[kNf][kHalves];
#pragma unroll
  for (int f = 0; f < kNf; ++f)
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
      wv[f][h] = *reinterpret_cast<const uint4*>(
          stage + WOffset(warp * kNf * 8 + f * 8 + lane / 4, 4 * h + lane % 4));
  const uint8_t* a_tile = stage + kWBytes;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int h = s / kStepsPerHalf, sh = s % kStepsPerHalf;
    uint32_t b[kNf][2];
#pragma unroll
    for (int f = 0; f < kNf; ++f) {
      const uint32_t words[4] = {wv[f][h].x, wv[f][h].y, wv[f][h].z, wv[f][h].w};
      if constexpr (std::is_same_v<A, uint8_t>) {
        b[f][0] = words[2 * sh];
        b[f][1] = words[2 * sh + 1];
      } else {
        E4m3ToB16<T>(words[sh], &b[f][0], &b[f][1]);
      }
    }
#pragma unroll
    for (int m = 0; m < kMf; ++m) {
      if (m < mfs) {  // uniform across the CTA
        const int j = lane / 8, row = m * 16 + (j % 2) * 8 + lane % 8;
        const int half = (j / 2) ^ ((row >> 2) & 1);
        uint32_t a[4];
        cuda_mma::ldsm_x4(a, a_tile + s * BM * 32 + row * 32 + half * 16);
#pragma unroll
        for (int f = 0; f < kNf; ++f) {
          if constexpr (std::is_same_v<A, uint8_t>) {
            MmaE4m3(acc[m][f], a, b[f][0], b[f][1]);
          } else {
            cuda_mma::mma16816<T>(acc[m][f], a, b[f][0], b[f][1]);
          }
        }
      }
    }
  }
}

template <int kMf>
__device__ __forceinline__ void Zero(float (&acc)[kMf][kNf][4]) {
#pragma unroll
  for (int m = 0; m < kMf; ++m)
#pragma unroll
    for (int f = 0; f < kNf; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][f][i] = 0.f;
}

template <typename T, typename A, bool kBlock, int kMf>
__global__ void __launch_bounds__(kThreads, 2) GemmKernel(const Params p) {
  constexpr int BM = kMf * 16;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t n_cta = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t row0 = n_cta + warp * kNf * 8;
  const int64_t chunks = p.in / kChunk;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.z) * p.chunks_per_split;
  const int64_t c_end = c_begin + p.chunks_per_split < chunks ? c_begin + p.chunks_per_split
                                                               : chunks;
  if (c_begin >= c_end) return;
  const int64_t nt = p.tokens - t0 < BM ? p.tokens - t0 : BM;
  const int mfs = static_cast<int>((nt + 15) / 16);
  constexpr int kStageBytes = Stage<A, BM>::kBytes;
  const CopyPlan<A, BM> plan(p, t0, n_cta);

  float acc[kMf][kNf][4];
  Zero(acc);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (c_begin + s < c_end) plan.Issue(smem + s * kStageBytes, c_begin + s);
    cuda_mma::cp_async_commit();
  }
  int slot = 0;  // chunk c's stage; the ring's next free stage is the one before it
  for (int64_t c = c_begin; c < c_end; ++c) {
    cuda_mma::cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk c landed for every thread; chunk c - 1's stage is free
    const int64_t next = c + kStages - 1;
    const int free_slot = slot == 0 ? kStages - 1 : slot - 1;
    if (next < c_end) plan.Issue(smem + free_slot * kStageBytes, next);
    cuda_mma::cp_async_commit();
    const uint8_t* stage = smem + slot * kStageBytes;
    slot = slot == kStages - 1 ? 0 : slot + 1;
    if constexpr (kBlock) {
      float part[kMf][kNf][4];
      Zero(part);
      StageMma<T, A, kMf>(stage, warp, lane, mfs, part);
      const int64_t kb = c * kChunk / p.bk;
#pragma unroll
      for (int f = 0; f < kNf; ++f) {
        const int64_t frag_row = row0 + f * 8;  // a fragment's 8 rows share one block row
        const float s = frag_row < p.out ? __ldg(p.scale + (frag_row / p.bn) * p.scale_cols + kb)
                                         : 0.f;
#pragma unroll
        for (int m = 0; m < kMf; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][f][i] = fmaf(part[m][f][i], s, acc[m][f][i]);
      }
    } else {
      StageMma<T, A, kMf>(stage, warp, lane, mfs, acc);
    }
  }

  // C fragment: lane holds (token g, rows 2q, 2q + 1) and (token g + 8, the same rows).
#pragma unroll
  for (int f = 0; f < kNf; ++f) {
    const int64_t col = row0 + f * 8 + 2 * (lane % 4);
    float cs[2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
      cs[j] = col + j < p.out ? (kBlock ? 1.f : __ldg(p.scale + col + j)) : 0.f;
#pragma unroll
    for (int m = 0; m < kMf; ++m) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t t = m * 16 + lane / 4 + (i / 2) * 8, n = col + (i % 2);
        if (t < nt && n < p.out)
          atomicAdd(p.acc + (t0 + t) * p.out + n, acc[m][f][i] * cs[i % 2]);
      }
    }
  }
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Quantizes token t's row of x (fp8_linear's "dynamic" rule, as the CUDA-core kernel and the
// CPU kernel apply it) into xq, in stage order or (kRowMajor: the Hopper path's TMA operand)
// as x's own [tokens, in] layout; returns the row's scale to every thread. Called by all
// kThreads threads of a CTA.
template <typename T, bool kRowMajor>
__device__ float QuantizeRow(const T* x, int64_t tokens, int64_t in, int64_t t, uint8_t* xq) {
  __shared__ float warp_max[kWarps];
  const T* xr = x + t * in;
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < in; i += kThreads)
    amax = fmaxf(amax, fabsf(static_cast<float>(xr[i])));
  amax = WarpMax(amax);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = ActivationScale(amax);
  for (int64_t i = threadIdx.x; i < in; i += kThreads)
    xq[kRowMajor ? t * in + i : PermutedIndex<1>(tokens, t, i)] =
        __nv_cvt_float_to_fp8(static_cast<float>(xr[i]) / s, __NV_SATFINITE, __NV_E4M3);
  return s;
}

// W8A8's first pass: each CTA quantizes one token's row (QuantizeRow) and records its scale.
template <typename T, bool kRowMajor = false>
__global__ void __launch_bounds__(kThreads) QuantizeRowsKernel(const T* x, int64_t tokens,
                                                               int64_t in, uint8_t* xq,
                                                               float* row_scale) {
  const int64_t t = blockIdx.x;
  const float s = QuantizeRow<T, kRowMajor>(x, tokens, in, t, xq);
  if (threadIdx.x == 0) row_scale[t] = s;
}

// W8A16's first pass: x copied into stage order (PermutedIndex), two elements per thread step.
template <typename T>
__global__ void PermuteRowsKernel(const T* x, int64_t tokens, int64_t in, uint8_t* xp) {
  const int64_t pairs = tokens * in / 2;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = 2 * i / in, k = 2 * i % in;  // in is even: a pair stays in one row
    *reinterpret_cast<uint32_t*>(xp + PermutedIndex<2>(tokens, t, k)) =
        *reinterpret_cast<const uint32_t*>(x + 2 * i);
  }
}

// y = acc (times the token's activation scale, W8A8) rounded to T.
template <typename T>
__global__ void FinalizeKernel(const float* acc, const float* row_scale, int64_t tokens,
                               int64_t out, T* y) {
  const int64_t n = tokens * out;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = row_scale ? acc[i] * row_scale[i / out] : acc[i];
    y[i] = static_cast<T>(v);
  }
}

}  // namespace xla_kernels::fp8_linear::mma
