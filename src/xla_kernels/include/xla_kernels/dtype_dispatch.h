// Small helpers shared by kernels: element-size queries and error text for dtypes.
#pragma once

#include <string>

#include "xla/ffi/api/ffi.h"

namespace xla_kernels {

namespace ffi = xla::ffi;

// Short name of an FFI dtype, matching xla_kernels.dtypes ("f32", "bf16", ...).
inline std::string DtypeName(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "i8";
    case ffi::DataType::S16: return "i16";
    case ffi::DataType::S32: return "i32";
    case ffi::DataType::S64: return "i64";
    case ffi::DataType::U8: return "u8";
    case ffi::DataType::U16: return "u16";
    case ffi::DataType::U32: return "u32";
    case ffi::DataType::U64: return "u64";
    case ffi::DataType::F16: return "f16";
    case ffi::DataType::F32: return "f32";
    case ffi::DataType::F64: return "f64";
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::F8E4M3FN: return "f8e4m3fn";
    default: return "dtype#" + std::to_string(static_cast<int>(dtype));
  }
}

// An InvalidArgument error for a dtype a kernel does not implement.
inline ffi::Error UnsupportedDtype(const char* op, ffi::DataType dtype, const char* supported) {
  return ffi::Error::InvalidArgument(std::string(op) + ": unsupported dtype " +
                                     DtypeName(dtype) + " (supported: " + supported + ")");
}

}  // namespace xla_kernels
