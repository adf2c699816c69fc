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

}  // namespace xla_kernels
