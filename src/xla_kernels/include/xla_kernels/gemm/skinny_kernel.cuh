// The skinny GEMM (decode: few tokens, the weight read is the cost): kernel, epilogue and
// scheduler. The mainloop is gemm/skinny_mainloop.cuh; design and measurements in
// docs/design/gemm.md.
//
// Scheduler: a CTA owns kBN = 32 kNf weight rows (4 warps x kNf n8 fragments) and 16 kMf
// tokens (grid.y: further token tiles). K is split over the CTAs of a thread-block cluster
// (sm_90+): rank r of a cluster of C reads a contiguous 1/C of every row's chunks, so the
// grid holds tiles x C CTAs, chosen so that they all fit on the GPU at once (one wave: a
// CTA's time is its share of the bytes, no tail). One launch, no workspace, no atomics.
//
// Epilogue: each CTA puts its partial sums [tokens, kBN] (f32) in its shared memory; after
// a cluster barrier rank r adds up elements r, r + C, ... of all C CTAs' partials through
// distributed shared memory, scales them (per-channel e4m3 scales) and writes y in T.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "xla_kernels/gemm/skinny_mainloop.cuh"

namespace xla_kernels::gemm {

// The thread-block cluster, or the CTA alone before sm_90 (the host launches clusters of
// one there).
struct Cluster {
  __device__ __forceinline__ static unsigned Rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().block_rank();
#else
    return 0;
#endif
  }
  __device__ __forceinline__ static unsigned Size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().num_blocks();
#else
    return 1;
#endif
  }
  __device__ __forceinline__ static void Sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __syncthreads();
#endif
  }
  // `local` (a shared-memory address of this CTA) in the CTA of rank `rank`.
  template <typename V>
  __device__ __forceinline__ static const V* Map(const V* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(local, rank);
#else
    return local;
#endif
  }
};

template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return __float2half_rn(v);
  }
}

template <typename T, typename W, typename Tile, bool kBlock>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    SkinnyGemmKernel(const SkinnyParams p) {
  using S = SkinnyShape<T, W, Tile>;
  constexpr int kMf = Tile::kMf, kNf = Tile::kNf;
  extern __shared__ __align__(16) uint8_t smem[];
  const unsigned rank = Cluster::Rank(), splits = Cluster::Size();
  const int64_t tile = blockIdx.x / splits;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * S::kBM;
  const SkinnyMainloop<T, W, Tile> loop(p, smem, t0, tile * S::kBN);

  float acc[kMf][kNf][4];
#pragma unroll
  for (int m = 0; m < kMf; ++m)
#pragma unroll
    for (int f = 0; f < kNf; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][f][i] = 0.f;
  uint32_t nan_probe[kNf] = {};

  const int chunks = static_cast<int>((p.k + S::kChunkElems - 1) / S::kChunkElems);
  const int c_begin = min(static_cast<int>(rank) * p.chunks_per_split, chunks);
  const int c_end = min(c_begin + p.chunks_per_split, chunks);
  // The ring: kStages - 1 chunks in flight while one is multiplied.
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (c_begin + s < c_end) loop.IssueStage(c_begin + s, smem + s * S::kStageBytes);
    cuda_mma::cp_async_commit();
  }
  for (int c = c_begin; c < c_end; ++c) {
    const int it = c - c_begin;
    cuda_mma::cp_async_wait<S::kStages - 2>();
    __syncthreads();  // chunk c landed for every thread; chunk c - 1's stage is free
    const int next = c + S::kStages - 1;
    if (next < c_end)
      loop.IssueStage(next, smem + ((it + S::kStages - 1) % S::kStages) * S::kStageBytes);
    cuda_mma::cp_async_commit();
    loop.template Mma<kBlock>(smem + (it % S::kStages) * S::kStageBytes, c, acc, nan_probe);
  }
  cuda_mma::cp_async_wait<0>();
  loop.PoisonNanRows(nan_probe, acc);
  __syncthreads();  // the stages become the partial sums

  // Partial sums to shared memory: lane (g, q) holds tokens g and g + 8 of each m fragment,
  // columns (weight rows of the CTA) 2q and 2q + 1 of each n8 fragment.
  float* red = reinterpret_cast<float*>(smem);
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
  for (int m = 0; m < kMf; ++m)
#pragma unroll
    for (int f = 0; f < kNf; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = 16 * m + 8 * h + g, col = warp * 8 * kNf + 8 * f + 2 * q;
        *reinterpret_cast<float2*>(red + t * S::kRedStride + col) =
            make_float2(acc[m][f][2 * h], acc[m][f][2 * h + 1]);
      }
  Cluster::Sync();  // every rank's partials are in place

  const int rows = static_cast<int>(min(p.tokens - t0, int64_t{S::kBM}));
  const int64_t n0 = tile * S::kBN;
  T* y = static_cast<T*>(p.y);
  for (int e = static_cast<int>(rank) * S::kThreads + threadIdx.x; e < rows * S::kBN;
       e += static_cast<int>(splits) * S::kThreads) {
    const int t = e / S::kBN, col = e % S::kBN;
    const int64_t n = n0 + col;
    if (n >= p.n) continue;
    const float* mine = red + t * S::kRedStride + col;
    float sum = 0.f;
    for (unsigned r = 0; r < splits; ++r) sum += *Cluster::Map(mine, r);
    if (S::kFp8 && !kBlock) sum *= __ldg(p.scale + n);
    y[(t0 + t) * p.n + n] = FromFloat<T>(sum);
  }
  Cluster::Sync();  // no CTA leaves while another still reads its shared memory
}

// What the host decides for a call (SkinnyPlan): the instantiation's token fragments and
// chunk length, the cluster size and the grid.
struct SkinnyLaunch {
  int mf, u, splits;
  dim3 grid;
  int chunks_per_split;
};

// The skinny GEMM handles 16-bit x and W (or e4m3 W) with 16-byte rows and 16-byte aligned
// buffers; e4m3 block scales must cover whole segments and n8 fragments.
inline bool SkinnySupports(const SkinnyParams& p, bool fp8) {
  const int64_t row_bytes = p.k * (fp8 ? 1 : 2);
  const auto aligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  };
  if (p.k < 1 || p.n < 1 || p.tokens < 1 || row_bytes % 16 != 0 || p.k % 8 != 0) return false;
  if (p.k > (int64_t{1} << 24)) return false;  // 32-bit offsets within a row and a token tile
  if (!aligned(p.x) || !aligned(p.w)) return false;
  if (fp8 && p.bk > 0 && (p.bk % 64 != 0 || p.bn % 8 != 0)) return false;
  return true;
}

// Multiprocessors and compute capability of the current device, read once per device.
struct DeviceFacts {
  int sms = 0, major = 0;
};
inline DeviceFacts CurrentDeviceFacts() {
  constexpr int kMaxDevices = 64;
  static DeviceFacts facts[kMaxDevices];  // written once per device; racing writers agree
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return {};
  DeviceFacts& f = facts[device];
  if (f.sms == 0) {
    int sms = 0, major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    f.major = major;
    f.sms = sms;
  }
  return f;
}

template <typename T, typename W, typename Tile, bool kBlock>
cudaError_t LaunchSkinnyAs(cudaStream_t stream, SkinnyParams p) {
  using S = SkinnyShape<T, W, Tile>;
  const auto kernel = SkinnyGemmKernel<T, W, Tile, kBlock>;
  // Per launch: the attribute belongs to the current device.
  const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const DeviceFacts dev = CurrentDeviceFacts();
  const int64_t tiles = (p.n + S::kBN - 1) / S::kBN;
  const int64_t token_tiles = (p.tokens + S::kBM - 1) / S::kBM;
  const int64_t chunks = (p.k + S::kChunkElems - 1) / S::kChunkElems;
  // The CTAs of each cluster size that are resident at once (found once per kernel): a
  // cluster's CTAs share a GPC, so clusters of 4 or 8 fit fewer CTAs than the SMs' slots.
  static const std::array<int64_t, 4> resident = [&] {
    std::array<int64_t, 4> ctas{};
    for (int i = 0; i < 4; ++i) {
      const int size = 1 << i;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned>(size), 1, 1);
      config.blockDim = dim3(S::kThreads, 1, 1);
      config.dynamicSmemBytes = S::kSmemBytes;
      cudaLaunchAttribute attribute[1];
      attribute[0].id = cudaLaunchAttributeClusterDimension;
      attribute[0].val.clusterDim = {static_cast<unsigned>(size), 1, 1};
      config.attrs = attribute;
      config.numAttrs = dev.major >= 9 ? 1 : 0;
      int clusters = 0;
      if (size == 1) {
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&clusters, kernel, S::kThreads,
                                                      S::kSmemBytes);
        clusters *= dev.sms;
      } else if (dev.major >= 9) {
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
      }
      ctas[i] = int64_t{clusters} * size;
    }
    return ctas;
  }();
  // The largest cluster whose whole grid is resident at once (one wave: no CTA waits for
  // another to finish), each split keeping at least two chunks.
  int splits = 1;
  for (int i = 1; i < 4 && (1 << i) <= p.max_splits; ++i)
    if (tiles * token_tiles * (1 << i) <= resident[i] && chunks >= 2 * (1 << i))
      splits = 1 << i;
  p.chunks_per_split = static_cast<int>((chunks + splits - 1) / splits);
  if (tiles * splits > 0x7fffffff || token_tiles > 65535) return cudaErrorInvalidConfiguration;

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(tiles * splits),
                        static_cast<unsigned>(token_tiles), 1);
  config.blockDim = dim3(S::kThreads, 1, 1);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (dev.major >= 9) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = static_cast<unsigned>(splits);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, p);
}

// The tile of each token count (measured on an H200, docs/design/gemm.md): up to 16 tokens
// one m16 fragment and 64 weight rows per CTA, 4 segments a stage; past 32 tokens four
// fragments over 128 rows, one segment a stage in a 6-deep ring (each x tile feeds twice the
// weight rows, and the registers hold the accumulators).
using SkinnyTile16 = SkinnyTile<1, 2, 4, 4, 4, 2>;
using SkinnyTile32 = SkinnyTile<2, 2, 2, 4, 4, 2>;
using SkinnyTile64 = SkinnyTile<4, 4, 1, 4, 6, 2>;

// y = x W^T for any token count (token tiles of 64 past 64 tokens, each reading W again).
// W is T, or e4m3 (W = uint8_t) with p.scale per channel (block == false) or per block.
template <typename T, typename W>
cudaError_t LaunchSkinny(cudaStream_t stream, const SkinnyParams& p, bool block) {
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  if (p.tokens <= 16) {
    if (kFp8 && block) return LaunchSkinnyAs<T, W, SkinnyTile16, kFp8>(stream, p);
    return LaunchSkinnyAs<T, W, SkinnyTile16, false>(stream, p);
  }
  if (p.tokens <= 32) {
    if (kFp8 && block) return LaunchSkinnyAs<T, W, SkinnyTile32, kFp8>(stream, p);
    return LaunchSkinnyAs<T, W, SkinnyTile32, false>(stream, p);
  }
  if (kFp8 && block) return LaunchSkinnyAs<T, W, SkinnyTile64, kFp8>(stream, p);
  return LaunchSkinnyAs<T, W, SkinnyTile64, false>(stream, p);
}

}  // namespace xla_kernels::gemm
