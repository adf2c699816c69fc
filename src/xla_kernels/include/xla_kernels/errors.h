// Errors a handler returns, worded as the Python side words them:
//   "<op>: argument '<arg>': <problem>. Fix: <fix>."
//
//   if (x.dimensions().size() != 2)
//     return xla_kernels::InvalidArgument("my_lib.op", "x", "expected rank 2", "reshape x");
#pragma once

#include <string>

#include "xla/ffi/api/ffi.h"

namespace xla_kernels {

inline xla::ffi::Error InvalidArgument(const std::string& op, const std::string& arg,
                                       const std::string& problem, const std::string& fix) {
  std::string message = op + ": ";
  if (!arg.empty()) message += "argument '" + arg + "': ";
  message += problem;
  if (!fix.empty()) message += ". Fix: " + fix + (fix.back() == '.' ? "" : ".");
  return xla::ffi::Error::InvalidArgument(message);
}

// "(2, 3)" (Python's tuple spelling, "(4,)" for one dimension) of a buffer's dimensions,
// so C++ messages show shapes as the Python errors do.
inline std::string DimsText(xla::ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

}  // namespace xla_kernels
