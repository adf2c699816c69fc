// XLA's XlaCustomCallStatus C API, for classic CPU custom calls of the form
//   void fn(void* out, const void** in, XlaCustomCallStatus* status)
// jaxlib does not ship xla/service/custom_call_status.h; include this header instead. The
// adapter in legacy.h owns the status object and turns a failure into an FFI error.
//
//   #include "xla_kernels/custom_call_status.h"
//   void MyKernel(void* out, const void** in, XlaCustomCallStatus* status) {
//     if (bad) { XlaCustomCallStatusSetFailure(status, "bad input", 9); return; }
//   }
#pragma once

#include <cstddef>
#include <string>

struct XlaCustomCallStatus_ {
  bool failed = false;
  std::string message;
};
typedef struct XlaCustomCallStatus_ XlaCustomCallStatus;

// Hidden and inline: each library carries its own copy, so these never bind to (or clash
// with) same-named symbols that XLA itself may export into the process.
__attribute__((visibility("hidden"))) inline void XlaCustomCallStatusSetSuccess(
    XlaCustomCallStatus* status) {
  status->failed = false;
  status->message.clear();
}

__attribute__((visibility("hidden"))) inline void XlaCustomCallStatusSetFailure(
    XlaCustomCallStatus* status, const char* message, size_t message_len) {
  status->failed = true;
  status->message.assign(message, message_len);
}
