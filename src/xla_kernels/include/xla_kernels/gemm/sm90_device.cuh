// Whether the device a call runs on can run this library's sm_90a code, and its SM count (the
// persistent scheduler's grid). Included by one CUDA file per library, under CUTLASS's headers.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace xla_kernels::gemm {
namespace sm90_device {

constexpr int kMaxDevices = 64;

// Empty: its attributes say which code of this file the device runs (ptxVersion 90 for the
// sm_90a build; a build for older archs runs here through PTX, without wgmma).
__global__ void ArchProbe() {}

// Per device: 0 unknown, -1 not compute capability 9.0, else its SM count.
inline std::atomic<int> known_sms[kMaxDevices];

}  // namespace sm90_device

// The current device and its SM count, or false: no device, not compute capability 9.0 (sm_90a
// code runs on 9.0 only), or this library not built for it.
inline bool CurrentSm90Device(int* device, int* sms) {
  using namespace sm90_device;  // NOLINT: this file's own names
  if (cudaGetDevice(device) != cudaSuccess || *device < 0 || *device >= kMaxDevices) {
    cudaGetLastError();
    return false;
  }
  int known = known_sms[*device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0, minor = 0, count = 0;
    cudaFuncAttributes probe{};
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, *device) == cudaSuccess &&
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, *device) == cudaSuccess &&
        cudaFuncGetAttributes(&probe, ArchProbe) == cudaSuccess && probe.ptxVersion == 90;
    cudaGetLastError();
    known = ok && major == 9 && minor == 0 && count > 0 ? count : -1;
    known_sms[*device].store(known, std::memory_order_relaxed);
  }
  *sms = known;
  return known > 0;
}

}  // namespace xla_kernels::gemm
