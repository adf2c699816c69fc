// xla-kernels handler guard: what JAX registers for an op's handler.
//
// XLA builds each call frame from the op's declaration (the custom call's operands,
// results and attributes); the op's own handler decodes it (counts, dtypes, attribute
// names and types) before its body runs, and on a disagreement returns a bare message
// such as "[execute] Wrong number of arguments: expected 2 but got 1" that names neither
// the op nor the item. A guard slot holds one op's handler: the guard calls it with XLA's
// own call frame, unchanged, and only when it returns a decoding error asks the Python
// side (xk_guard_set_explain) for a message naming the op, the item and both sides.
//
// Why this and not a probe with a made-up call frame: a handler whose binding decodes
// nothing that can fail (AnyBuffer arguments, no results, no named attribute) runs its
// body on any frame with its argument count, so no made-up frame is certain to stop
// before the body. The guard never makes a frame: the body runs exactly when it would
// without the guard (the handler decoded XLA's real frame), and the explanation costs
// nothing unless the handler failed. Every call pays one indirect call.
//
// Plain C++ with only the XLA FFI C API (c_api.h), FFI API 0.3 and 0.4.
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "xla/ffi/api/c_api.h"

#if XLA_FFI_API_MAJOR > 0 || XLA_FFI_API_MINOR >= 4
#define XK_ERROR_GET_FN XLA_FFI_Error_GetDetails
using XkErrorGetArgs = XLA_FFI_Error_GetDetails_Args;
constexpr size_t kErrorGetArgsSize = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
#else
#define XK_ERROR_GET_FN XLA_FFI_Error_GetMessage
using XkErrorGetArgs = XLA_FFI_Error_GetMessage_Args;
constexpr size_t kErrorGetArgsSize = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
#endif

extern "C" {
// Writes the explanation of `message` (a decoding failure of slot's handler) into
// out[0, out_len) and returns its length, or 0 to keep XLA's message.
typedef int32_t (*XkGuardExplainFn)(int32_t slot, const char* message, char* out,
                                    int64_t out_len);
}

namespace {

constexpr int kSlots = 1024;
constexpr int64_t kExplainLen = 8192;

std::atomic<XLA_FFI_Handler*> g_handlers[kSlots];
std::atomic<XkGuardExplainFn> g_explain{nullptr};

// The typed FFI's messages for a frame its binding cannot decode (xla/ffi/api/api.h):
// counts are checked first, then every operand is decoded before the body may run.
bool IsDecodingError(std::string_view message) {
  for (std::string_view what :
       {"Wrong number of arguments", "Wrong number of results", "Wrong number of attributes",
        "Failed to decode all FFI handler operands"}) {
    if (message.find(what) != std::string_view::npos) return true;
  }
  return false;
}

XLA_FFI_Error* Guarded(int slot, XLA_FFI_CallFrame* frame) {
  XLA_FFI_Handler* handler = g_handlers[slot].load(std::memory_order_acquire);
  XLA_FFI_Error* error = handler(frame);
  XkGuardExplainFn explain = g_explain.load(std::memory_order_acquire);
  if (error == nullptr || explain == nullptr || frame->extension_start != nullptr) {
    return error;  // success, nobody to explain, or XLA's metadata request
  }
  const XLA_FFI_Api* api = frame->api;
  XkErrorGetArgs get;
  std::memset(&get, 0, sizeof get);
  get.struct_size = kErrorGetArgsSize;
  get.error = error;
  api->XK_ERROR_GET_FN(&get);
  std::string message = get.message != nullptr ? get.message : "";
  if (!IsDecodingError(message)) return error;
  std::string out(kExplainLen, '\0');
  int32_t n = explain(slot, message.c_str(), out.data(), kExplainLen);
  if (n <= 0) return error;
  out.resize(n < kExplainLen ? n : kExplainLen - 1);

  XLA_FFI_Error_Destroy_Args destroy;
  std::memset(&destroy, 0, sizeof destroy);
  destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  destroy.error = error;
  api->XLA_FFI_Error_Destroy(&destroy);
  XLA_FFI_Error_Create_Args create;
  std::memset(&create, 0, sizeof create);
  create.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  create.message = out.c_str();
  create.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
  return api->XLA_FFI_Error_Create(&create);
}

template <int N>
XLA_FFI_Error* GuardSlot(XLA_FFI_CallFrame* frame) {
  return Guarded(N, frame);
}

template <size_t... Is>
constexpr auto MakeGuards(std::index_sequence<Is...>) {
  return std::array<XLA_FFI_Handler*, sizeof...(Is)>{&GuardSlot<Is>...};
}

const std::array<XLA_FFI_Handler*, kSlots> kGuards =
    MakeGuards(std::make_index_sequence<kSlots>{});

}  // namespace

extern "C" {

int32_t xk_guard_slots(void) { return kSlots; }

// Points `slot` at `handler` and returns the guard to register with XLA (NULL if the slot
// does not exist). A slot is filled once, before its guard is registered.
void* xk_guard_install(int32_t slot, void* handler) {
  if (slot < 0 || slot >= kSlots || handler == nullptr) return nullptr;
  g_handlers[slot].store(reinterpret_cast<XLA_FFI_Handler*>(handler), std::memory_order_release);
  return reinterpret_cast<void*>(kGuards[slot]);
}

void xk_guard_set_explain(XkGuardExplainFn explain) {
  g_explain.store(explain, std::memory_order_release);
}

}  // extern "C"
