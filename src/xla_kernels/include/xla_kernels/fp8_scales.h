// fp8 weights' scales in vLLM's layout (xla_kernels/kernels/fp8_weights.py), shared by every
// kernel that reads fp8 weights: a weight matrix [rows, cols] has one f32 scale per output
// channel (scales [rows, 1]) or one per (bn x bk) block (scales [ceil(rows / bn),
// ceil(cols / bk)]). Plain C++, usable from host and device code.
//
//   float w = E4m3ToF32(q[row * cols + col]) * scale[ScaleIndex(row, col, cols, bn, bk)];
#pragma once

#include <cstdint>

#include "xla_kernels/host_device.h"

namespace xla_kernels {

XK_HOST_DEVICE inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The index of the scale of weight (row, col) of a matrix of `cols` columns: per output
// channel (bk == 0: scales [rows, 1]) or per (bn x bk) block.
XK_HOST_DEVICE inline int64_t ScaleIndex(int64_t row, int64_t col, int64_t cols, int64_t bn,
                                         int64_t bk) {
  if (bk == 0) return row;
  return (row / bn) * CeilDiv(cols, bk) + col / bk;
}

}  // namespace xla_kernels
