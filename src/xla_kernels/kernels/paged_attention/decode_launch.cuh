// paged_attention, host side: kernel attributes, the partition count that fills the GPU, the
// core per dtype and head ratio, and launch_paged_attention.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "decode_main_kernel.cuh"
#include "decode_reduce_kernel.cuh"
#include "xla_kernels/attention_launch.cuh"

namespace xla_kernels::paged_attention {
namespace detail {

inline std::string cuda_error(const char* what, cudaError_t e) {
  return std::string("paged_attention: ") + what + ": " + cudaGetErrorName(e) + " (" +
         cudaGetErrorString(e) + ")";
}

// Raises the kernel's dynamic shared-memory limit and returns its CTAs per SM, once per
// (kernel, device): function attributes are per device context.
inline std::string prepare_kernel(const void* kernel, int smem, int device, int* ctas_per_sm) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  auto it = cache.find(key);
  if (it != cache.end()) {
    *ctas_per_sm = it->second;
    return "";
  }
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return cuda_error("cudaFuncSetAttribute", e);
  int occ = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem);
  if (e != cudaSuccess) return cuda_error("cudaOccupancyMaxActiveBlocksPerMultiprocessor", e);
  if (occ < 1) {
    return "paged_attention: the kernel does not fit on this GPU (" + std::to_string(smem) +
           " bytes of shared memory per CTA)";
  }
  cache[key] = occ;
  *ctas_per_sm = occ;
  return "";
}

// Raises *smem (dynamic shared memory per CTA) so that at most `cap` CTAs fit an SM: one more
// would need more than the SM has, counting each CTA's reserved shared memory.
inline std::string cap_ctas_per_sm(int cap, int device, int* smem) {
  int per_sm = 0, reserved = 0;
  cudaError_t e =
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", e);
  e = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", e);
  const int floor = per_sm / (cap + 1) - reserved + 16;
  if (*smem < floor) *smem = floor;
  return "";
}

template <typename T, int D, class Core>
inline std::string launch_typed(cudaStream_t stream, const Params& p, KernelArgs a) {
  using L = Smem<T, D, Core>;
  auto main_kernel = paged_attention_main<T, D, Core>;
  int device = 0, sms = 0, ctas_per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", e);
  std::string err;
  int smem = L::kBytes;
  if constexpr (Core::kMaxCtasPerSm > 0) {
    err = cap_ctas_per_sm(Core::kMaxCtasPerSm, device, &smem);
    if (!err.empty()) return err;
  }
  err = prepare_kernel(reinterpret_cast<const void*>(main_kernel), smem, device, &ctas_per_sm);
  if (!err.empty()) return err;

  a.chunks = (a.G + Core::GC - 1) / Core::GC;
  a.cta_tile = kWarps * Core::NW;
  const int64_t pairs = p.num_seqs * p.num_kv_heads * a.chunks;
  // Partitions fill at most kPartitionCtasPerSm CTAs per SM: more resident CTAs add
  // partials and a reduce kernel without adding bandwidth (the design notes: d 64 at 4 CTAs/SM).
  const int64_t slots =
      static_cast<int64_t>(sms) * (ctas_per_sm < kPartitionCtasPerSm ? ctas_per_sm
                                                                     : kPartitionCtasPerSm);
  int64_t parts = slots / pairs;
  const int64_t max_parts = MaxPartitions(p.num_seqs, p.max_blocks_per_seq * p.block_size);
  if (parts > max_parts) parts = max_parts;
  if (parts < 1) parts = 1;
  a.T = static_cast<int>(parts);
  if (parts > 1) {
    const int64_t need = p.num_seqs * p.num_q_heads * parts * (p.head_dim + 2);
    if (p.workspace == nullptr || p.workspace_elems < need) {
      return "paged_attention: workspace has " + std::to_string(p.workspace_elems) +
             " f32 elements, the kernel needs " + std::to_string(need) +
             " (size it with workspace_size())";
    }
  }
  const int64_t grid = p.num_seqs * parts * p.num_kv_heads * a.chunks;
  if (grid > INT_MAX) return "paged_attention: problem too large for one launch";
  const bool pdl = pdl_enabled(device);
  e = launch_kernel(main_kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem,
                    stream, pdl, a);
  if (e != cudaSuccess) return cuda_error("launching the main kernel", e);
  if (parts > 1) {
    const int64_t rgrid = p.num_seqs * p.num_q_heads;
    if (rgrid > INT_MAX) return "paged_attention: problem too large for one launch";
    e = launch_kernel(paged_attention_reduce<T, D, !std::is_same_v<typename Core::Cache, T>>,
                      dim3(static_cast<unsigned>(rgrid)), dim3(32 * kReduceWarps), 0, stream,
                      pdl, a);
    if (e != cudaSuccess) return cuda_error("launching the reduce kernel", e);
  }
  return "";
}

template <int D>
inline std::string launch_head_dim(cudaStream_t stream, const Params& p, const KernelArgs& a) {
  if (p.fp8_cache) {
    // Up to 8 q heads per kv head: tokens on the MMA rows (Fp8MmaCoreT); more: heads.
    const bool tokens_on_rows = a.G <= Fp8MmaCoreT<__half, D>::GC;
    switch (p.dtype) {
      case DType::kBF16:
        if (tokens_on_rows) {
          return launch_typed<__nv_bfloat16, D, Fp8MmaCoreT<__nv_bfloat16, D>>(stream, p, a);
        }
        return launch_typed<__nv_bfloat16, D, Fp8MmaCore<__nv_bfloat16, D>>(stream, p, a);
      case DType::kF16:
        if (tokens_on_rows) return launch_typed<__half, D, Fp8MmaCoreT<__half, D>>(stream, p, a);
        return launch_typed<__half, D, Fp8MmaCore<__half, D>>(stream, p, a);
      case DType::kF32:
        return "paged_attention: f8e4m3fn caches need bf16 or f16 queries";
    }
  }
  switch (p.dtype) {
    case DType::kBF16:
      return launch_typed<__nv_bfloat16, D, MmaCore<__nv_bfloat16, D>>(stream, p, a);
    case DType::kF16:
      return launch_typed<__half, D, MmaCore<__half, D>>(stream, p, a);
    case DType::kF32:
      if (a.G == 1) return launch_typed<float, D, SimtCore<float, D, 1>>(stream, p, a);
      if (a.G <= 4) return launch_typed<float, D, SimtCore<float, D, 4>>(stream, p, a);
      return launch_typed<float, D, SimtCore<float, D, 8>>(stream, p, a);
  }
  return "paged_attention: unknown dtype";
}

}  // namespace detail

inline std::string launch_paged_attention(cudaStream_t stream, const Params& p) {
  using detail::KernelArgs;
  if (p.num_seqs == 0 || p.num_q_heads == 0) return "";
  if (std::string err = CheckHeadsAndBlockSize("paged_attention", p); !err.empty()) return err;
  const int64_t capacity = p.max_blocks_per_seq * p.block_size;
  if (capacity >= (int64_t{1} << 30) || p.num_blocks > INT_MAX || p.num_seqs > INT_MAX ||
      p.num_q_heads > INT_MAX)
    return "paged_attention: sizes out of range (context capacity must be < 2^30 tokens)";
  KernelArgs a{};
  SetPagedAttentionArgs(p, detail::kLog2e, &a);
  a.q = p.query;
  a.lens = p.seq_lens;
  a.ws = p.workspace;
  a.S = static_cast<int>(p.num_seqs);
  a.window = p.sliding_window <= 0 ? 0
             : (p.sliding_window >= INT_MAX ? INT_MAX : static_cast<int>(p.sliding_window));
  switch (p.head_dim) {
    case 64: return detail::launch_head_dim<64>(stream, p, a);
    case 128: return detail::launch_head_dim<128>(stream, p, a);
    case 256: return detail::launch_head_dim<256>(stream, p, a);
    default: return "paged_attention: head_dim must be 64, 128 or 256";
  }
}

}  // namespace xla_kernels::paged_attention
