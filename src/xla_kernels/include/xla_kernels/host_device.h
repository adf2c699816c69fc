// XK_HOST_DEVICE: marks a helper callable from host code and, when nvcc compiles it, from
// device code, so one header serves a kernel's CPU and CUDA handlers.
//
//   XK_HOST_DEVICE inline int64_t RowOffset(int64_t slot) { ... }
#pragma once

#ifdef __CUDACC__
#define XK_HOST_DEVICE __host__ __device__
#else
#define XK_HOST_DEVICE
#endif
