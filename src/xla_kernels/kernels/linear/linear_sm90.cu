// linear's Hopper path (bf16 on compute capability 9.0): CUTLASS's sm90 ping-pong GEMM in the
// swap-AB form (xla_kernels/gemm/sm90_swap_ab.cuh), one tile per token range, chosen from the
// measured sweep in docs/design/gemm.md. Built only where CUTLASS's headers are on the include
// path (xla_kernels/builder/cutlass.py); elsewhere LaunchSm90 launches nothing and linear.cu
// runs its other kernels. Decided by the headers' presence rather than a define, so that a
// prebuilt library (built with them) matches a machine without them.
#include <cuda_runtime.h>

#include <atomic>

#include "linear_sm90.h"

#if __has_include("cute/tensor.hpp") && __has_include("cutlass/util/packed_stride.hpp")
#define XK_LINEAR_CUTLASS 1
#include "xla_kernels/gemm/sm90_swap_ab.cuh"
#else
#define XK_LINEAR_CUTLASS 0
#endif

namespace xla_kernels::linear {

#if XK_LINEAR_CUTLASS
namespace {

constexpr int kMaxDevices = 64;

// Empty: its attributes say which code of this file the device runs (ptxVersion 90 for the
// sm_90a build; a build for older archs runs here through PTX, without wgmma).
__global__ void ArchProbe() {}

// Per device: 0 unknown, -1 not compute capability 9.0, else its SM count.
std::atomic<int> sm90_sms[kMaxDevices];

int Sm90SmCount(int device) {
  if (device < 0 || device >= kMaxDevices) return -1;
  int known = sm90_sms[device].load(std::memory_order_relaxed);
  if (known != 0) return known;
  int major = 0, minor = 0, sms = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  cudaFuncAttributes probe{};
  const bool built_for_sm90 = cudaFuncGetAttributes(&probe, ArchProbe) == cudaSuccess &&
                              probe.ptxVersion == 90;
  cudaGetLastError();
  known = major == 9 && minor == 0 && built_for_sm90 ? sms : -1;
  sm90_sms[device].store(known, std::memory_order_relaxed);
  return known;
}

using Bf16 = cutlass::bfloat16_t;
// Tokens <= 32: 64 weight rows x 16 tokens a tile, K in steps of 128; <= 128: 64 x 64 x 64;
// more: 128 x 128 x 64 (docs/design/gemm.md, the sweep).
using SmallTile = gemm::Sm90SwapAbGemm<Bf16, 64, 16, 128>;
using MediumTile = gemm::Sm90SwapAbGemm<Bf16, 64, 64, 64>;
using LargeTile = gemm::Sm90SwapAbGemm<Bf16, 128, 128, 64>;

}  // namespace

bool LaunchSm90(cudaStream_t stream, const Sm90Linear& call, cudaError_t* status) {
  if (!call.bf16) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const int sms = Sm90SmCount(device);
  if (sms <= 0) return false;
  constexpr int64_t kIntMax = 2147483647;
  if (call.tokens > kIntMax || call.in > kIntMax || call.out > kIntMax) return false;
  const gemm::SwapAbCall c{call.w, call.x, call.y, call.tokens, call.in, call.out, device, sms};
  if (call.tokens <= 32) return SmallTile::Launch(c, stream, status);
  if (call.tokens <= 128) return MediumTile::Launch(c, stream, status);
  return LargeTile::Launch(c, stream, status);
}

#else

bool LaunchSm90(cudaStream_t, const Sm90Linear&, cudaError_t*) { return false; }

#endif

}  // namespace xla_kernels::linear

// Whether this library has the Hopper path (xla_kernels.kernels.linear.hopper_path_built).
extern "C" __attribute__((visibility("default"))) int XkLinearHasSm90() {
  return XK_LINEAR_CUTLASS;
}
