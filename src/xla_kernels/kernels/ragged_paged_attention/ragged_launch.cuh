// ragged_paged_attention, host side: the kernel per dtype, head_dim and card (the Hopper
// kernel where it can run, with XLA_KERNELS_RAGGED_WGMMA), and launch_ragged_paged_attention.
#pragma once

#include <cstdlib>

#include "ragged_decode_path.cuh"
#include "ragged_mma_kernel.cuh"
#include "ragged_paged_attention_sm90.cuh"
#include "ragged_simt_kernel.cuh"
#include "ragged_zero_kernel.cuh"
#include "xla_kernels/attention_launch.cuh"

namespace xla_kernels::ragged_paged_attention {
namespace detail {

template <typename Kernel>
inline std::string launch_main(cudaStream_t stream, const Params& p, const Args& a, Kernel kernel,
                               int smem, int tile_rows, int threads = kThreads) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  std::string err =
      prepare_kernel(reinterpret_cast<const void*>(kernel), smem, device, threads);
  if (!err.empty()) return err;
  const int64_t tiles = MaxTiles(p.num_tokens, p.num_q_heads / p.num_kv_heads, p.max_seqs,
                                 tile_rows);
  if (tiles > INT_MAX || p.num_kv_heads > 65535)
    return "ragged_paged_attention: problem too large for one launch";
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.num_kv_heads));
  kernel<<<grid, threads, smem, stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_error("launching the main kernel", e);
  return "";
}

// XLA_KERNELS_RAGGED_WGMMA in the environment (xla_kernels/env.py), read at every launch so
// that a test can pick the kernel per call: "0" never takes the wgmma kernel (the mma.sync
// kernel of pre-Hopper cards then runs on a Hopper card too); "require" makes a call that the
// wgmma kernel should serve (bf16/f16, any head_dim) fail when it cannot (not an sm_90a
// build, not a 9.0 device), so tests know which kernel ran; unset or anything else: use it
// when possible.
enum class WgmmaMode { kOff, kAuto, kRequire };
inline WgmmaMode wgmma_mode_from_env() {
  const char* v = std::getenv("XLA_KERNELS_RAGGED_WGMMA");
  if (v == nullptr) return WgmmaMode::kAuto;
  const std::string s(v);
  return s == "0" ? WgmmaMode::kOff : s == "require" ? WgmmaMode::kRequire : WgmmaMode::kAuto;
}

// Whether `kernel` (a ragged_wgmma_kernel) can run on `device`: compute capability 9.0 and
// the loaded binary is the sm_90a build, which alone has static shared memory (the other
// builds compile the kernel to an empty body). Cached per (kernel, device).
inline bool wgmma_kernel_usable(const void* kernel, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  int major = 0, minor = 0;
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) ==
                cudaSuccess &&
            major == 9 && minor == 0;
  if (ok) {
    cudaFuncAttributes attr{};
    ok = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
         attr.sharedSizeBytes >= sizeof(Work);
  }
  cudaGetLastError();  // a failed query is "not usable", not a launch error
  known[key] = ok;
  return ok;
}

// The wgmma kernel with N-token tiles when it applies (see ragged_paged_attention_sm90.cuh);
// *used = false leaves the choice to the caller.
template <typename T, int D, int N, bool kFp8 = false>
inline std::string try_launch_wgmma_tile(cudaStream_t stream, const Params& p, const Args& a,
                                         WgmmaMode mode, bool* used) {
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  const auto kernel = ragged_wgmma_kernel<T, D, N, kFp8>;
  if (!wgmma_kernel_usable(reinterpret_cast<const void*>(kernel), device)) {
    return mode == WgmmaMode::kRequire
               ? "ragged_paged_attention: XLA_KERNELS_RAGGED_WGMMA=require, but the wgmma "
                 "kernel cannot run here (needs a compute capability 9.0 device and an "
                 "sm_90a build)"
               : "";
  }
  *used = true;
  return launch_main(stream, p, a, kernel, Sm90Config<D, N, kFp8>::kBytes, kSm90Rows,
                     kSm90Threads);
}

// The wgmma kernel when it applies, with tuning::wgmma_tile_tokens's tiles. *used = false
// leaves the choice to the caller.
template <typename T, int D, bool kFp8 = false>
inline std::string try_launch_wgmma(cudaStream_t stream, const Params& p, const Args& a,
                                    bool* used) {
  *used = false;
  const WgmmaMode mode = wgmma_mode_from_env();
  if (mode == WgmmaMode::kOff) return "";
  constexpr int N = tuning::wgmma_tile_tokens(D, kFp8);
  return try_launch_wgmma_tile<T, D, N, kFp8>(stream, p, a, mode, used);
}

// One cache dtype's dispatch (kFp8: f8e4m3fn caches, else the query dtype): bf16/f16
// queries take the wgmma kernel when it can serve the call (an sm_90a build on a compute
// capability 9.0 device), else the mma.sync kernel; f32 queries take the SIMT kernel, and
// are refused on fp8 caches.
template <int D, bool kFp8>
inline std::string launch_cache_dtype(cudaStream_t stream, const Params& p, const Args& a) {
  bool used = false;
  std::string err;
  if (p.dtype == DType::kBF16) {
    err = try_launch_wgmma<__nv_bfloat16, D, kFp8>(stream, p, a, &used);
  }
  if (p.dtype == DType::kF16) err = try_launch_wgmma<__half, D, kFp8>(stream, p, a, &used);
  if (used || !err.empty()) return err;
  switch (p.dtype) {
    case DType::kBF16:
      return launch_main(stream, p, a, ragged_mma_kernel<__nv_bfloat16, D, kFp8>,
                         MmaConfig<__nv_bfloat16, D, kFp8>::kBytes,
                         MmaConfig<__nv_bfloat16, D, kFp8>::BM);
    case DType::kF16:
      return launch_main(stream, p, a, ragged_mma_kernel<__half, D, kFp8>,
                         MmaConfig<__half, D, kFp8>::kBytes, MmaConfig<__half, D, kFp8>::BM);
    case DType::kF32:
      if constexpr (kFp8) {
        return "ragged_paged_attention: f8e4m3fn caches need bf16 or f16 queries";
      } else {
        return launch_main(stream, p, a, ragged_simt_kernel<D>, SimtConfig<D>::kBytes,
                           SimtConfig<D>::BM);
      }
  }
  return "ragged_paged_attention: unknown dtype";
}

template <int D>
inline std::string launch_head_dim(cudaStream_t stream, const Params& p, const Args& a) {
  return p.fp8_cache ? launch_cache_dtype<D, true>(stream, p, a)
                     : launch_cache_dtype<D, false>(stream, p, a);
}

}  // namespace detail

inline std::string launch_ragged_paged_attention(cudaStream_t stream, const Params& p) {
  using detail::Args;
  if (p.num_tokens == 0 || p.num_q_heads == 0) return "";
  if (std::string err = CheckHeadsAndBlockSize("ragged_paged_attention", p); !err.empty())
    return err;
  const int64_t capacity = p.max_blocks_per_seq * p.block_size;
  if (capacity > kMaxCapacity || p.num_tokens * p.num_q_heads > kMaxPackedRows ||
      p.num_blocks > INT_MAX || p.max_seqs < 1 || p.max_seqs >= INT_MAX)
    return "ragged_paged_attention: sizes out of range";
  Args a{};
  SetPagedAttentionArgs(p, detail::kLog2e, &a);
  a.q = p.queries;
  a.kv_lens = p.kv_lens;
  a.cu = p.cu_q_lens;
  a.num_seqs = p.num_seqs;
  a.T = static_cast<int>(p.num_tokens);
  a.max_seqs = static_cast<int>(p.max_seqs);
  a.capacity = static_cast<int>(capacity);
  a.window = p.sliding_window <= 0 ? 0
             : (p.sliding_window >= INT_MAX / 2 ? INT_MAX / 2 : static_cast<int>(p.sliding_window));
  const int64_t elem = p.dtype == DType::kF32 ? 4 : 2;
  const int64_t row_bytes = p.num_q_heads * p.head_dim * elem;
  if (row_bytes > INT_MAX) return "ragged_paged_attention: sizes out of range";
  a.skip = nullptr;
  if (p.workspace != nullptr && has_decode_path(p.num_tokens, p.max_seqs)) {
    const std::string err = detail::launch_decode_path(stream, p, &a);
    if (!err.empty()) return err;
  }
  const int64_t zgrid = (p.num_tokens + detail::kZeroRows - 1) / detail::kZeroRows;
  detail::ragged_zero_kernel<<<static_cast<unsigned>(zgrid), detail::kThreads, 0, stream>>>(
      a, static_cast<int>(row_bytes));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return detail::cuda_error("launching the zero kernel", e);
  switch (p.head_dim) {
    case 64: return detail::launch_head_dim<64>(stream, p, a);
    case 128: return detail::launch_head_dim<128>(stream, p, a);
    case 256: return detail::launch_head_dim<256>(stream, p, a);
    default: return "ragged_paged_attention: head_dim must be 64, 128 or 256";
  }
}

}  // namespace xla_kernels::ragged_paged_attention
