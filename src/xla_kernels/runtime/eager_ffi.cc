// xla-kernels eager runtime: calls typed XLA FFI handlers without XLA.
//
// Build: g++ -std=c++17 -O3 -fPIC -shared -I$(jax.ffi.include_dir()) eager_ffi.cc
// (plain C++, no CUDA: streams are opaque pointers). See eager_ffi.h for the C ABI.
//
// What the runtime provides to a handler, function by function:
//
//   Error_Create/GetMessage/Destroy  our own XLA_FFI_Error (code + message);
//                                    GetMessage is GetDetails from FFI API 0.4
//   Stream_Get                       XkDevice.stream (NULL on the host)
//   DeviceOrdinal_Get                XkDevice.device_ordinal
//   RunId_Get                        0
//   DeviceMemory_Allocate/Free       host: aligned malloc/free; device: the
//                                    caller's XkAllocFn/XkFreeFn, or an error
//   ThreadPool_Schedule              runs the task inline, before returning
//   ThreadPool_NumThreads            0 (no pool; what ffi.h reports without one)
//   ExecutionContext_Get             error: not available in eager mode;
//                                    InvokeContext_Get from 0.4
//   State_Set/State_Get              one slot per stage (instantiate, prepare,
//                                    initialize) in the caller's XkState
//                                    (xk_eager_call_stage); no XkState: error
//   InvokeContext_FindExtension      (0.4) no extensions: finds nothing
//   Type_Register, Handler_Register  error: register with XLA instead
//   Future_*                         error: asynchronous handlers unsupported
//
// The call frame is built on the stack (heap only past kInline* entries).
//
// Compiles against the XLA FFI headers of FFI API 0.3 (jaxlib 0.10) and 0.4
// (jaxlib 0.11), which renamed a few functions; see "Header versions" below.

#include "eager_ffi.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/c_api.h"

//===----------------------------------------------------------------------===//
// Header versions.
//===----------------------------------------------------------------------===//

// FFI API 0.4 renamed XLA_FFI_ExecutionContext to XLA_FFI_InvokeContext (the
// old name stays as an alias), XLA_FFI_Error_GetMessage to _GetDetails (which
// also returns the code) and XLA_FFI_ExecutionContext_Get to
// XLA_FFI_InvokeContext_Get, and appended XLA_FFI_InvokeContext_FindExtension.
#if XLA_FFI_API_MAJOR > 0 || XLA_FFI_API_MINOR >= 4
#define XK_FFI_API_0_4 1
#define XK_CONTEXT_STRUCT XLA_FFI_InvokeContext
#define XK_ERROR_GET_FN XLA_FFI_Error_GetDetails
#define XK_CONTEXT_GET_FN XLA_FFI_InvokeContext_Get
#define XK_LAST_API_FN XLA_FFI_InvokeContext_FindExtension
using XkErrorGetArgs = XLA_FFI_Error_GetDetails_Args;
using XkContextGetArgs = XLA_FFI_InvokeContext_Get_Args;
constexpr size_t kContextGetArgsSize = XLA_FFI_InvokeContext_Get_Args_STRUCT_SIZE;
#else
#define XK_FFI_API_0_4 0
#define XK_CONTEXT_STRUCT XLA_FFI_ExecutionContext
#define XK_ERROR_GET_FN XLA_FFI_Error_GetMessage
#define XK_CONTEXT_GET_FN XLA_FFI_ExecutionContext_Get
#define XK_LAST_API_FN XLA_FFI_DeviceOrdinal_Get
using XkErrorGetArgs = XLA_FFI_Error_GetMessage_Args;
using XkContextGetArgs = XLA_FFI_ExecutionContext_Get_Args;
constexpr size_t kContextGetArgsSize = XLA_FFI_ExecutionContext_Get_Args_STRUCT_SIZE;
#endif
#define XK_STR_(x) #x
#define XK_STR(x) XK_STR_(x)

//===----------------------------------------------------------------------===//
// Opaque C API types, defined by the runtime.
//===----------------------------------------------------------------------===//

struct XLA_FFI_Error {
  XLA_FFI_Error_Code errc;
  std::string message;
};

// Handler state: what the instantiate, prepare and initialize stages set with
// XLA_FFI_State_Set, one slot per stage (as XLA keeps it per instance).
struct XkState {
  struct Slot {
    bool set = false;
    int64_t type_id = 0;
    void* object = nullptr;
  };
  Slot slots[XLA_FFI_ExecutionStage_EXECUTE];
};

struct XK_CONTEXT_STRUCT {
  const XkDevice* device;
  XkState* state;  // null: the call has no state (xk_eager_call)
};
using XkContext = XK_CONTEXT_STRUCT;

// The Python side (eager.py) packs these structs with `struct`: keep them fixed.
static_assert(sizeof(void*) == 8, "the eager runtime assumes a 64-bit platform");
static_assert(sizeof(XkCall) == 80 && sizeof(XkDevice) == 40 && sizeof(XkBuffer) == 32 &&
                  sizeof(XkAttr) == 48,
              "eager_ffi.h struct layout changed: update eager.py and XK_EAGER_ABI_VERSION");

namespace {

constexpr XkDevice kHostDevice = {XK_PLATFORM_HOST, 0, nullptr,
                                  nullptr,          nullptr, nullptr};

XLA_FFI_Error* MakeError(XLA_FFI_Error_Code errc, std::string message) {
  return new XLA_FFI_Error{errc, std::move(message)};
}

// XLA checks `actual >= expected` for argument structs (newer callers may pass
// bigger structs; ffi.h's RunId decoding even passes a larger struct size).
bool SizeOk(size_t actual, size_t expected) { return actual >= expected; }

XLA_FFI_Error* SizeError(const char* what, size_t expected, size_t actual) {
  return MakeError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                   std::string("Unexpected ") + what + " size: expected at least " +
                       std::to_string(expected) + ", got " + std::to_string(actual) +
                       ". The xla-kernels eager runtime implements XLA FFI API " +
                       std::to_string(XLA_FFI_API_MAJOR) + "." +
                       std::to_string(XLA_FFI_API_MINOR) + ".");
}

#define XK_CHECK_ARGS_SIZE(name, expected)                                   \
  do {                                                                       \
    if (args == nullptr) {                                                   \
      return MakeError(XLA_FFI_Error_Code_INVALID_ARGUMENT,                  \
                       std::string(name) + " must not be null");             \
    }                                                                        \
    if (!SizeOk(args->struct_size, expected)) {                              \
      return SizeError(name, expected, args->struct_size);                   \
    }                                                                        \
  } while (false)

#define XK_CHECK_ARGS(Type) XK_CHECK_ARGS_SIZE(#Type, Type##_STRUCT_SIZE)

const XkDevice& DeviceOf(XkContext* ctx) {
  return (ctx != nullptr && ctx->device != nullptr) ? *ctx->device : kHostDevice;
}

XLA_FFI_Error* NotInEager(const char* what) {
  return MakeError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                   std::string(what) + " is not available in eager mode");
}

//===----------------------------------------------------------------------===//
// XLA_FFI_Api implementation.
//===----------------------------------------------------------------------===//

XLA_FFI_Error* ErrorCreate(XLA_FFI_Error_Create_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_Error_Create_Args);
  return MakeError(args->errc, args->message ? args->message : "");
}

// XLA_FFI_Error_GetMessage (API 0.3) or XLA_FFI_Error_GetDetails (0.4).
void ErrorGet(XkErrorGetArgs* args) {
  if (args == nullptr) return;
  args->message = args->error ? args->error->message.c_str() : "";
#if XK_FFI_API_0_4
  args->errc = args->error ? args->error->errc : XLA_FFI_Error_Code_OK;
#endif
}

// Returned by API functions newer than the headers the runtime was built with
// (see FillUnknownApiSlots); never deleted.
XLA_FFI_Error kUnknownFunctionError = {
    XLA_FFI_Error_Code_UNIMPLEMENTED,
    "this XLA FFI API function is newer than the xla-kernels eager runtime "
    "(rebuild it against the same XLA FFI headers as the handler)"};

void ErrorDestroy(XLA_FFI_Error_Destroy_Args* args) {
  if (args == nullptr || args->error == &kUnknownFunctionError) return;
  delete args->error;
}

XLA_FFI_Error* HandlerRegister(XLA_FFI_Handler_Register_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_Handler_Register_Args);
  return MakeError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "the eager runtime cannot register FFI handlers; register "
                   "them with XLA (jax.ffi.register_ffi_target)");
}

XLA_FFI_Error* StreamGet(XLA_FFI_Stream_Get_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_Stream_Get_Args);
  const XkDevice& device = DeviceOf(args->ctx);
  args->stream = device.platform == XK_PLATFORM_HOST ? nullptr : device.stream;
  return nullptr;
}

XLA_FFI_Error* TypeRegister(XLA_FFI_Type_Register_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_Type_Register_Args);
  return MakeError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "the eager runtime cannot register FFI types; register them "
                   "with XLA");
}

// XLA_FFI_ExecutionContext_Get (API 0.3) or XLA_FFI_InvokeContext_Get (0.4).
XLA_FFI_Error* ContextGet(XkContextGetArgs* args) {
  XK_CHECK_ARGS_SIZE(XK_STR(XK_CONTEXT_GET_FN) "_Args", kContextGetArgsSize);
  return NotInEager("user data (" XK_STR(XK_CONTEXT_GET_FN) ")");
}

#if XK_FFI_API_0_4
// Extensions attach backend data to the context; the eager runtime has none.
XLA_FFI_Error* InvokeContextFindExtension(XLA_FFI_InvokeContext_FindExtension_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_InvokeContext_FindExtension_Args);
  args->extension = nullptr;
  return nullptr;
}
#endif

const char* StageName(int stage) {
  static const char* const kNames[] = {"instantiate", "prepare", "initialize", "execute"};
  return stage >= 0 && stage <= XLA_FFI_ExecutionStage_EXECUTE ? kNames[stage] : "unknown";
}

// The state slot of `stage`, or an error naming what is missing.
XLA_FFI_Error* StateSlot(XkContext* ctx, XLA_FFI_ExecutionStage stage,
                         const XLA_FFI_TypeId* type_id, const char* what,
                         XkState::Slot** slot) {
  if (ctx == nullptr || ctx->state == nullptr) {
    return MakeError(XLA_FFI_Error_Code_FAILED_PRECONDITION,
                     std::string("handler state (") + what +
                         ") is not available in eager mode to a call without state: only "
                         "kernels that declare an instantiate handler get one "
                         "(Kernel(handler={'instantiate': ..., 'execute': ...}))");
  }
  if (stage < 0 || stage >= XLA_FFI_ExecutionStage_EXECUTE) {
    return MakeError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                     std::string(what) + ": no state belongs to stage " + StageName(stage));
  }
  if (type_id == nullptr || type_id->type_id <= 0) {
    return MakeError(XLA_FFI_Error_Code_FAILED_PRECONDITION,
                     std::string(what) + ": the state type is not registered (type id 0); "
                     "declare it in Kernel(types=...)");
  }
  *slot = &ctx->state->slots[stage];
  return nullptr;
}

XLA_FFI_Error* StateSet(XLA_FFI_State_Set_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_State_Set_Args);
  XkState::Slot* slot = nullptr;
  if (XLA_FFI_Error* e = StateSlot(args->ctx, args->stage, args->type_id,
                                   "XLA_FFI_State_Set", &slot)) {
    return e;
  }
  if (slot->set) {
    return MakeError(XLA_FFI_Error_Code_ALREADY_EXISTS,
                     std::string("the ") + StageName(args->stage) + " state is already set");
  }
  *slot = XkState::Slot{true, args->type_id->type_id, args->state};
  return nullptr;
}

XLA_FFI_Error* StateGet(XLA_FFI_State_Get_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_State_Get_Args);
  XkState::Slot* slot = nullptr;
  if (XLA_FFI_Error* e = StateSlot(args->ctx, args->stage, args->type_id,
                                   "XLA_FFI_State_Get", &slot)) {
    return e;
  }
  if (!slot->set) {
    return MakeError(XLA_FFI_Error_Code_NOT_FOUND,
                     std::string("no ") + StageName(args->stage) + " state is set: " +
                         "declare an " + StageName(args->stage) + " handler that returns " +
                         "one (Kernel(handler={'" + StageName(args->stage) +
                         "': ..., 'execute': ...}))");
  }
  if (slot->type_id != args->type_id->type_id) {
    return MakeError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                     std::string("the ") + StageName(args->stage) + " state has type id " +
                         std::to_string(slot->type_id) + ", the handler asks for " +
                         std::to_string(args->type_id->type_id));
  }
  args->state = slot->object;
  return nullptr;
}

// Deleters of registered state types (XLA_FFI_TypeInfo), by type id.
std::mutex g_types_mu;
std::unordered_map<int64_t, void (*)(void*)>& TypeDeleters() {
  static auto* deleters = new std::unordered_map<int64_t, void (*)(void*)>();
  return *deleters;
}

bool IsPowerOfTwo(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

XLA_FFI_Error* DeviceMemoryAllocate(XLA_FFI_DeviceMemory_Allocate_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_DeviceMemory_Allocate_Args);
  args->data = nullptr;
  if (!IsPowerOfTwo(args->alignment)) {
    return MakeError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                     "Unsupported alignment: " + std::to_string(args->alignment));
  }
  if (args->size == 0) return nullptr;  // nothing to allocate, data stays NULL

  const XkDevice& device = DeviceOf(args->ctx);
  if (device.platform == XK_PLATFORM_HOST) {
    void* ptr = nullptr;
    size_t alignment = std::max(args->alignment, sizeof(void*));
    if (posix_memalign(&ptr, alignment, args->size) != 0) {
      return MakeError(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                       "failed to allocate " + std::to_string(args->size) +
                           " bytes of host scratch memory");
    }
    args->data = ptr;
    return nullptr;
  }

  if (device.alloc == nullptr || device.free == nullptr) {
    return MakeError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                     "device scratch memory (XLA_FFI_DeviceMemory_Allocate) is "
                     "not available in eager mode without an allocator; pass "
                     "one to the eager call (allocator=...)");
  }
  void* ptr = device.alloc(device.alloc_user, args->size, args->alignment,
                           device.device_ordinal, device.stream);
  if (ptr == nullptr) {
    return MakeError(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                     "failed to allocate " + std::to_string(args->size) +
                         " bytes of device scratch memory");
  }
  if (reinterpret_cast<uintptr_t>(ptr) % args->alignment != 0) {
    device.free(device.alloc_user, ptr, args->size, device.device_ordinal,
                device.stream);
    return MakeError(XLA_FFI_Error_Code_INTERNAL,
                     "the eager allocator returned memory that is not " +
                         std::to_string(args->alignment) + "-byte aligned");
  }
  args->data = ptr;
  return nullptr;
}

XLA_FFI_Error* DeviceMemoryFree(XLA_FFI_DeviceMemory_Free_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_DeviceMemory_Free_Args);
  if (args->data == nullptr) return nullptr;
  const XkDevice& device = DeviceOf(args->ctx);
  if (device.platform == XK_PLATFORM_HOST) {
    std::free(args->data);
    return nullptr;
  }
  if (device.free == nullptr) {
    return MakeError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                     "device memory free without an eager allocator");
  }
  device.free(device.alloc_user, args->data, args->size, device.device_ordinal,
              device.stream);
  return nullptr;
}

// There is no thread pool: tasks run inline on the calling thread, which the
// C API explicitly allows ("Tasks can be executed in the caller thread").
XLA_FFI_Error* ThreadPoolSchedule(XLA_FFI_ThreadPool_Schedule_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_ThreadPool_Schedule_Args);
  if (args->task == nullptr) {
    return MakeError(XLA_FFI_Error_Code_INVALID_ARGUMENT, "task must not be null");
  }
  args->task(args->data);
  return nullptr;
}

XLA_FFI_Error* ThreadPoolNumThreads(XLA_FFI_ThreadPool_NumThreads_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_ThreadPool_NumThreads_Args);
  if (args->num_threads != nullptr) *args->num_threads = 0;
  return nullptr;
}

XLA_FFI_Error* FutureCreate(XLA_FFI_Future_Create_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_Future_Create_Args);
  args->future = nullptr;
  return MakeError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "asynchronous handlers (returning xla::ffi::Future) are not "
                   "supported in eager mode");
}

XLA_FFI_Error* FutureSetAvailable(XLA_FFI_Future_SetAvailable_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_Future_SetAvailable_Args);
  return NotInEager("XLA_FFI_Future_SetAvailable");
}

XLA_FFI_Error* FutureSetError(XLA_FFI_Future_SetError_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_Future_SetError_Args);
  // The error's ownership is transferred to us: do not leak it.
  XLA_FFI_Error_Destroy_Args destroy = {XLA_FFI_Error_Destroy_Args_STRUCT_SIZE,
                                        nullptr, args->error};
  ErrorDestroy(&destroy);
  return NotInEager("XLA_FFI_Future_SetError");
}

XLA_FFI_Error* RunIdGet(XLA_FFI_RunId_Get_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_RunId_Get_Args);
  args->run_id = 0;
  return nullptr;
}

XLA_FFI_Error* DeviceOrdinalGet(XLA_FFI_DeviceOrdinal_Get_Args* args) {
  XK_CHECK_ARGS(XLA_FFI_DeviceOrdinal_Get_Args);
  args->device_ordinal = DeviceOf(args->ctx).device_ordinal;
  return nullptr;
}

// Every API function takes one pointer and returns XLA_FFI_Error* (or void).
XLA_FFI_Error* UnknownApiFunction(void*) { return &kUnknownFunctionError; }

// Offset just past the last API function this file knows about.
constexpr size_t kKnownApiEnd = offsetof(XLA_FFI_Api, XK_LAST_API_FN) + sizeof(void*);
static_assert(XLA_FFI_Api_STRUCT_SIZE >= kKnownApiEnd,
              "XLA_FFI_Api lost a function: update eager_ffi.cc");
static_assert((XLA_FFI_Api_STRUCT_SIZE - kKnownApiEnd) % sizeof(void*) == 0,
              "unexpected XLA_FFI_Api layout: update eager_ffi.cc");

XLA_FFI_Api MakeApi() {
  XLA_FFI_Api api;
  std::memset(&api, 0, sizeof(api));
  api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
  api.extension_start = nullptr;
  api.api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
  api.api_version.extension_start = nullptr;
  api.api_version.major_version = XLA_FFI_API_MAJOR;
  api.api_version.minor_version = XLA_FFI_API_MINOR;
  // Only handlers built against XLA's internal headers (xla/ffi/ffi.h) use the
  // internal API, and those cannot run outside XLA anyway.
  api.internal_api = nullptr;

  api.XLA_FFI_Error_Create = ErrorCreate;
  api.XK_ERROR_GET_FN = ErrorGet;
  api.XLA_FFI_Error_Destroy = ErrorDestroy;
  api.XLA_FFI_Handler_Register = HandlerRegister;
  api.XLA_FFI_Stream_Get = StreamGet;
  api.XLA_FFI_Type_Register = TypeRegister;
  api.XK_CONTEXT_GET_FN = ContextGet;
  api.XLA_FFI_State_Set = StateSet;
  api.XLA_FFI_State_Get = StateGet;
  api.XLA_FFI_DeviceMemory_Allocate = DeviceMemoryAllocate;
  api.XLA_FFI_DeviceMemory_Free = DeviceMemoryFree;
  api.XLA_FFI_ThreadPool_Schedule = ThreadPoolSchedule;
  api.XLA_FFI_ThreadPool_NumThreads = ThreadPoolNumThreads;
  api.XLA_FFI_Future_Create = FutureCreate;
  api.XLA_FFI_Future_SetAvailable = FutureSetAvailable;
  api.XLA_FFI_Future_SetError = FutureSetError;
  api.XLA_FFI_RunId_Get = RunIdGet;
  api.XLA_FFI_DeviceOrdinal_Get = DeviceOrdinalGet;
#if XK_FFI_API_0_4
  api.XLA_FFI_InvokeContext_FindExtension = InvokeContextFindExtension;
#endif

  // Headers newer than this file may append functions: fill them with a stub
  // returning an UNIMPLEMENTED error, so that the table has no null entries.
  auto* stub = &UnknownApiFunction;
  for (size_t off = kKnownApiEnd; off < XLA_FFI_Api_STRUCT_SIZE; off += sizeof(void*)) {
    std::memcpy(reinterpret_cast<char*>(&api) + off, &stub, sizeof(stub));
  }
  return api;
}

const XLA_FFI_Api kApi = MakeApi();

//===----------------------------------------------------------------------===//
// Call frame construction.
//===----------------------------------------------------------------------===//

// A buffer of `n` uninitialized PODs: inline up to N, on the heap past it.
template <typename T, size_t N>
class Storage {
 public:
  explicit Storage(size_t n) {
    if (n > N) heap_.reset(new T[n]);
  }
  T* get() { return heap_ ? heap_.get() : inline_; }

 private:
  T inline_[N];
  std::unique_ptr<T[]> heap_;
};

constexpr size_t kInlineBuffers = 16;
constexpr size_t kInlineAttrs = 32;

int32_t Report(XLA_FFI_Error_Code errc, std::string_view message, char* err_buf,
               int64_t err_len) {
  if (err_buf != nullptr && err_len > 0) {
    size_t n = std::min(message.size(), static_cast<size_t>(err_len - 1));
    std::memcpy(err_buf, message.data(), n);
    err_buf[n] = '\0';
  }
  int32_t code = static_cast<int32_t>(errc);
  return code == 0 ? static_cast<int32_t>(XLA_FFI_Error_Code_UNKNOWN) : code;
}

int32_t ReportAndDestroy(XLA_FFI_Error* error, char* err_buf, int64_t err_len) {
  int32_t code = Report(error->errc, error->message, err_buf, err_len);
  if (error != &kUnknownFunctionError) delete error;
  return code;
}

// Fills `out` (types/pointers) from caller buffers; returns false on bad input.
template <typename TypeEnum>
bool FillBuffers(const XkBuffer* in, int64_t n, TypeEnum buffer_type, XLA_FFI_Buffer* bufs,
                 TypeEnum* types, void** ptrs, std::string* error, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const XkBuffer& b = in[i];
    if (b.rank < 0 || (b.rank > 0 && b.dims == nullptr)) {
      *error = std::string("eager runtime: ") + what + " " + std::to_string(i) +
               " has an invalid rank/dims";
      return false;
    }
    // Handlers print dtypes in decode errors, and api.h's operator<< has no
    // case for values outside the enum: reject the obviously invalid ones.
    if (b.dtype <= 0) {
      *error = std::string("eager runtime: ") + what + " " + std::to_string(i) +
               " has an invalid dtype " + std::to_string(b.dtype);
      return false;
    }
    XLA_FFI_Buffer& out = bufs[i];
    out.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
    out.extension_start = nullptr;
    out.dtype = static_cast<XLA_FFI_DataType>(b.dtype);
    out.data = b.data;
    out.rank = b.rank;
    out.dims = const_cast<int64_t*>(b.dims);  // handlers only read dims
    types[i] = buffer_type;
    ptrs[i] = &out;
  }
  return true;
}

// One attribute's C API value: which member is used depends on its kind.
union AttrValue {
  XLA_FFI_Scalar scalar;
  XLA_FFI_Array array;
  XLA_FFI_ByteSpan string;
};

// The C API structs of one nested dictionary (XLA_FFI_AttrType_DICTIONARY).
struct NestedAttrs {
  XLA_FFI_Attrs attrs;
  std::unique_ptr<XLA_FFI_AttrType[]> types;
  std::unique_ptr<XLA_FFI_ByteSpan[]> names;
  std::unique_ptr<XLA_FFI_ByteSpan*[]> name_ptrs;
  std::unique_ptr<AttrValue[]> values;
  std::unique_ptr<void*[]> ptrs;
};

// Owns the nested dictionaries of one call (empty unless a dictionary is passed).
using DictArena = std::vector<std::unique_ptr<NestedAttrs>>;

// An XkAttr's pointer field: an address at the top level (`block` is null), an
// offset from `block` inside a dictionary block (offset 0: none).
const void* Resolve(const char* block, const void* field) {
  if (block == nullptr || field == nullptr) return field;
  return block + reinterpret_cast<uintptr_t>(field);
}

bool FillNested(const XkAttr& a, std::string_view name, const char* block, int depth,
                DictArena* arena, void** ptr, std::string* error);

// Fills one attribute's value and C API pointer; false (and `error`) on bad input.
bool FillAttr(const XkAttr& a, std::string_view name, const char* block, int depth,
              AttrValue* value, void** ptr, DictArena* arena, std::string* error) {
  auto fail = [&](const std::string& problem) {
    *error = "eager runtime: attribute '" + std::string(name) + "' " + problem;
    return false;
  };
  if (a.kind != XLA_FFI_AttrType_STRING && a.kind != XLA_FFI_AttrType_DICTIONARY &&
      a.dtype <= 0) {
    return fail("has an invalid dtype " + std::to_string(a.dtype));
  }
  const void* data = Resolve(block, a.data);
  switch (a.kind) {
    case XLA_FFI_AttrType_SCALAR:
      value->scalar.dtype = static_cast<XLA_FFI_DataType>(a.dtype);
      value->scalar.value = const_cast<void*>(data != nullptr ? data : a.inline_value);
      break;
    case XLA_FFI_AttrType_ARRAY:
      if (a.size < 0 || (a.size > 0 && data == nullptr)) return fail("has an invalid array");
      value->array.dtype = static_cast<XLA_FFI_DataType>(a.dtype);
      value->array.size = static_cast<size_t>(a.size);
      value->array.data = const_cast<void*>(data);
      break;
    case XLA_FFI_AttrType_STRING:
      if (a.size < 0 || (a.size > 0 && data == nullptr)) return fail("has an invalid string");
      value->string.ptr = static_cast<const char*>(data);
      value->string.len = static_cast<size_t>(a.size);
      break;
    case XLA_FFI_AttrType_DICTIONARY:
      return FillNested(a, name, block, depth, arena, ptr, error);
    default:
      return fail("has unsupported kind " + std::to_string(a.kind) +
                  " (expected scalar, array, string or dictionary)");
  }
  *ptr = value;
  return true;
}

// A DICTIONARY attribute: its block's entries become a nested XLA_FFI_Attrs.
bool FillNested(const XkAttr& a, std::string_view name, const char* block, int depth,
                DictArena* arena, void** ptr, std::string* error) {
  auto fail = [&](const std::string& problem) {
    *error = "eager runtime: dictionary attribute '" + std::string(name) + "' " + problem;
    return false;
  };
  const char* inner = static_cast<const char*>(Resolve(block, a.data));
  if (a.size < 0 || (a.size > 0 && inner == nullptr)) return fail("has an invalid block");
  if (depth >= XK_EAGER_MAX_DICT_DEPTH) {
    return fail("is nested deeper than " + std::to_string(XK_EAGER_MAX_DICT_DEPTH) + " levels");
  }
  const size_t n = static_cast<size_t>(a.size);
  auto dict = std::make_unique<NestedAttrs>();
  dict->types.reset(new XLA_FFI_AttrType[n]);
  dict->names.reset(new XLA_FFI_ByteSpan[n]);
  dict->name_ptrs.reset(new XLA_FFI_ByteSpan*[n]);
  dict->values.reset(new AttrValue[n]);
  dict->ptrs.reset(new void*[n]);
  const XkAttr* entries = reinterpret_cast<const XkAttr*>(inner);
  std::string_view previous;
  for (size_t k = 0; k < n; ++k) {
    const XkAttr& e = entries[k];
    const char* entry_name = static_cast<const char*>(Resolve(inner, e.name));
    if (entry_name == nullptr || e.name_len <= 0) {
      return fail("has an entry without a name (entry " + std::to_string(k) + ")");
    }
    std::string_view entry(entry_name, static_cast<size_t>(e.name_len));
    if (k > 0 && !(previous < entry)) {
      return fail("has entries that are not sorted by name or repeat one ('" +
                  std::string(entry) + "')");
    }
    previous = entry;
    if (!FillAttr(e, entry, inner, depth + 1, &dict->values[k], &dict->ptrs[k], arena,
                  error)) {
      return false;
    }
    dict->types[k] = static_cast<XLA_FFI_AttrType>(e.kind);
    dict->names[k] = XLA_FFI_ByteSpan{entry_name, static_cast<size_t>(e.name_len)};
    dict->name_ptrs[k] = &dict->names[k];
  }
  dict->attrs = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr, static_cast<int64_t>(n),
                              dict->types.get(), dict->name_ptrs.get(), dict->ptrs.get()};
  *ptr = &dict->attrs;
  arena->push_back(std::move(dict));
  return true;
}

int32_t Call(XLA_FFI_Handler* handler, const XkDevice* device, const XkBuffer* args,
             int64_t nargs, const XkBuffer* rets, int64_t nrets, const XkAttr* attrs,
             int64_t nattrs, char* err_buf, int64_t err_len,
             XLA_FFI_ExecutionStage stage = XLA_FFI_ExecutionStage_EXECUTE,
             XkState* state = nullptr) {
  auto invalid = [&](const std::string& message) {
    return Report(XLA_FFI_Error_Code_INVALID_ARGUMENT, message, err_buf, err_len);
  };
  if (handler == nullptr) return invalid("eager runtime: handler is null");
  if (nargs < 0 || nrets < 0 || nattrs < 0 || (nargs > 0 && args == nullptr) ||
      (nrets > 0 && rets == nullptr) || (nattrs > 0 && attrs == nullptr)) {
    return invalid("eager runtime: invalid argument/result/attribute arrays");
  }

  // Arguments and results.
  Storage<XLA_FFI_Buffer, kInlineBuffers> arg_bufs(nargs), ret_bufs(nrets);
  Storage<XLA_FFI_ArgType, kInlineBuffers> arg_types(nargs);
  Storage<XLA_FFI_RetType, kInlineBuffers> ret_types(nrets);
  Storage<void*, kInlineBuffers> arg_ptrs(nargs), ret_ptrs(nrets);
  std::string error;
  if (!FillBuffers(args, nargs, XLA_FFI_ArgType_BUFFER, arg_bufs.get(), arg_types.get(),
                   arg_ptrs.get(), &error, "argument") ||
      !FillBuffers(rets, nrets, XLA_FFI_RetType_BUFFER, ret_bufs.get(), ret_types.get(),
                   ret_ptrs.get(), &error, "result")) {
    return invalid(error);
  }

  // Attributes, sorted by name: the typed-FFI decoder looks each bound
  // attribute up by its index in the sorted names (see api.h, Handler).
  Storage<size_t, kInlineAttrs> order(nattrs);
  Storage<XLA_FFI_AttrType, kInlineAttrs> attr_types(nattrs);
  Storage<XLA_FFI_ByteSpan, kInlineAttrs> attr_names(nattrs);
  Storage<XLA_FFI_ByteSpan*, kInlineAttrs> attr_name_ptrs(nattrs);
  Storage<AttrValue, kInlineAttrs> attr_values(nattrs);
  Storage<void*, kInlineAttrs> attr_ptrs(nattrs);

  DictArena arena;
  size_t* idx = order.get();
  auto name_of = [attrs](size_t i) {
    return std::string_view(attrs[i].name, static_cast<size_t>(attrs[i].name_len));
  };
  for (int64_t i = 0; i < nattrs; ++i) {
    if (attrs[i].name == nullptr || attrs[i].name_len <= 0) {
      return invalid("eager runtime: attribute " + std::to_string(i) + " has no name");
    }
    idx[i] = static_cast<size_t>(i);
  }
  if (nattrs <= 8) {  // insertion sort: the common, tiny case
    for (int64_t i = 1; i < nattrs; ++i) {
      size_t v = idx[i];
      int64_t j = i - 1;
      while (j >= 0 && name_of(v) < name_of(idx[j])) {
        idx[j + 1] = idx[j];
        --j;
      }
      idx[j + 1] = v;
    }
  } else {
    std::sort(idx, idx + nattrs, [&](size_t a, size_t b) { return name_of(a) < name_of(b); });
  }

  for (int64_t k = 0; k < nattrs; ++k) {
    const XkAttr& a = attrs[idx[k]];
    if (k > 0 && name_of(idx[k]) == name_of(idx[k - 1])) {
      return invalid("eager runtime: duplicate attribute '" + std::string(name_of(idx[k])) +
                     "'");
    }
    if (!FillAttr(a, name_of(idx[k]), nullptr, 0, &attr_values.get()[k], &attr_ptrs.get()[k],
                  &arena, &error)) {
      return invalid(error);
    }
    attr_types.get()[k] = static_cast<XLA_FFI_AttrType>(a.kind);
    attr_names.get()[k] = XLA_FFI_ByteSpan{a.name, static_cast<size_t>(a.name_len)};
    attr_name_ptrs.get()[k] = &attr_names.get()[k];
  }

  XkContext ctx{device != nullptr ? device : &kHostDevice, state};

  XLA_FFI_CallFrame frame;
  std::memset(&frame, 0, sizeof(frame));
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.extension_start = nullptr;
  frame.api = &kApi;
  frame.ctx = &ctx;
  frame.stage = stage;
  frame.args = XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr, nargs, arg_types.get(),
                            arg_ptrs.get()};
  frame.rets = XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr, nrets, ret_types.get(),
                            ret_ptrs.get()};
  frame.attrs = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr, nattrs, attr_types.get(),
                              attr_name_ptrs.get(), attr_ptrs.get()};
  frame.future = nullptr;

  XLA_FFI_Error* result = nullptr;
  // Handlers may throw (e.g. std::bad_alloc): XLA turns that into an error too.
  try {
    result = handler(&frame);
  } catch (const std::exception& e) {
    return Report(XLA_FFI_Error_Code_UNKNOWN, std::string("XLA FFI call failed: ") + e.what(),
                  err_buf, err_len);
  } catch (...) {
    return Report(XLA_FFI_Error_Code_UNKNOWN, "XLA FFI call failed: unknown C++ exception",
                  err_buf, err_len);
  }
  if (result != nullptr) return ReportAndDestroy(result, err_buf, err_len);
  if (frame.future != nullptr) {  // impossible: FutureCreate never succeeds
    return Report(XLA_FFI_Error_Code_INTERNAL, "handler returned a future in eager mode",
                  err_buf, err_len);
  }
  return 0;
}

}  // namespace

//===----------------------------------------------------------------------===//
// C entry points.
//===----------------------------------------------------------------------===//

extern "C" {

int32_t xk_eager_abi_version(void) { return XK_EAGER_ABI_VERSION; }

void xk_eager_ffi_api_version(int32_t* major, int32_t* minor) {
  if (major != nullptr) *major = XLA_FFI_API_MAJOR;
  if (minor != nullptr) *minor = XLA_FFI_API_MINOR;
}

const void* xk_eager_api(void) { return &kApi; }

int32_t xk_eager_call(void* handler, const XkDevice* device, const XkBuffer* args,
                      int64_t nargs, const XkBuffer* rets, int64_t nrets, const XkAttr* attrs,
                      int64_t nattrs, char* err_buf, int64_t err_len) {
  try {
    return Call(reinterpret_cast<XLA_FFI_Handler*>(handler), device, args, nargs, rets, nrets,
                attrs, nattrs, err_buf, err_len);
  } catch (const std::bad_alloc&) {  // from building error messages / big frames
    return Report(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "eager runtime: out of memory",
                  err_buf, err_len);
  }
}

int32_t xk_eager_call_packed(const XkCall* call) {
  if (call == nullptr) return static_cast<int32_t>(XLA_FFI_Error_Code_INVALID_ARGUMENT);
  return xk_eager_call(call->handler, call->device, call->args, call->nargs, call->rets,
                       call->nrets, call->attrs, call->nattrs, call->err_buf, call->err_len);
}

int32_t xk_eager_call_stage(const XkCall* call, int32_t stage, void* state) {
  if (call == nullptr) return static_cast<int32_t>(XLA_FFI_Error_Code_INVALID_ARGUMENT);
  if (stage < XLA_FFI_ExecutionStage_INSTANTIATE || stage > XLA_FFI_ExecutionStage_EXECUTE) {
    return Report(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                  "eager runtime: unknown stage " + std::to_string(stage), call->err_buf,
                  call->err_len);
  }
  try {
    return Call(reinterpret_cast<XLA_FFI_Handler*>(call->handler), call->device, call->args,
                call->nargs, call->rets, call->nrets, call->attrs, call->nattrs,
                call->err_buf, call->err_len, static_cast<XLA_FFI_ExecutionStage>(stage),
                static_cast<XkState*>(state));
  } catch (const std::bad_alloc&) {
    return Report(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "eager runtime: out of memory",
                  call->err_buf, call->err_len);
  }
}

void* xk_eager_state_create(void) { return new (std::nothrow) XkState(); }

void xk_eager_state_destroy(void* state) {
  auto* s = static_cast<XkState*>(state);
  if (s == nullptr) return;
  // Later stages' states may refer to earlier ones: delete them first, as XLA does.
  for (int stage = XLA_FFI_ExecutionStage_EXECUTE - 1; stage >= 0; --stage) {
    XkState::Slot& slot = s->slots[stage];
    if (!slot.set || slot.object == nullptr) continue;
    void (*deleter)(void*) = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_types_mu);
      auto it = TypeDeleters().find(slot.type_id);
      if (it != TypeDeleters().end()) deleter = it->second;
    }
    if (deleter != nullptr) deleter(slot.object);
  }
  delete s;
}

int32_t xk_eager_register_type(int64_t type_id, const void* type_info) {
  auto* info = static_cast<const XLA_FFI_TypeInfo*>(type_info);
  if (type_id <= 0) return static_cast<int32_t>(XLA_FFI_Error_Code_INVALID_ARGUMENT);
  std::lock_guard<std::mutex> lock(g_types_mu);
  TypeDeleters()[type_id] = info != nullptr ? info->deleter : nullptr;
  return 0;
}

int32_t xk_eager_handler_metadata(void* handler, int32_t* api_major, int32_t* api_minor,
                                  uint32_t* traits, int64_t* state_type_id, char* err_buf,
                                  int64_t err_len) {
  if (handler == nullptr) {
    return Report(XLA_FFI_Error_Code_INVALID_ARGUMENT, "eager runtime: handler is null",
                  err_buf, err_len);
  }
  XLA_FFI_Metadata metadata;
  std::memset(&metadata, 0, sizeof(metadata));
  metadata.struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
  metadata.api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;

  XLA_FFI_Metadata_Extension extension;
  std::memset(&extension, 0, sizeof(extension));
  extension.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
  extension.extension_base.type = XLA_FFI_Extension_Metadata;
  extension.extension_base.next = nullptr;
  extension.metadata = &metadata;

  XkContext ctx{&kHostDevice, nullptr};
  XLA_FFI_CallFrame frame;
  std::memset(&frame, 0, sizeof(frame));
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.extension_start = &extension.extension_base;
  frame.api = &kApi;
  frame.ctx = &ctx;
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  frame.args = XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr, 0, nullptr, nullptr};
  frame.rets = XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr, 0, nullptr, nullptr};
  frame.attrs = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 0, nullptr, nullptr, nullptr};

  XLA_FFI_Error* result = nullptr;
  try {
    result = reinterpret_cast<XLA_FFI_Handler*>(handler)(&frame);
  } catch (const std::exception& e) {
    return Report(XLA_FFI_Error_Code_UNKNOWN,
                  std::string("Fetching XLA FFI metadata failed: ") + e.what(), err_buf,
                  err_len);
  } catch (...) {
    return Report(XLA_FFI_Error_Code_UNKNOWN, "Fetching XLA FFI metadata failed", err_buf,
                  err_len);
  }
  if (result != nullptr) return ReportAndDestroy(result, err_buf, err_len);
  if (api_major != nullptr) *api_major = metadata.api_version.major_version;
  if (api_minor != nullptr) *api_minor = metadata.api_version.minor_version;
  if (traits != nullptr) *traits = metadata.traits;
  if (state_type_id != nullptr) *state_type_id = metadata.state_type_id.type_id;
  return 0;
}

}  // extern "C"
