/* xla-kernels eager runtime: a tiny host-side XLA FFI runtime.
 *
 * Calls any typed XLA FFI handler (XLA_FFI_DEFINE_HANDLER_SYMBOL) without XLA:
 * the caller describes buffers (device or host addresses, zero-copy), the
 * attributes and the stream; the runtime builds an XLA_FFI_CallFrame (stage
 * EXECUTE) with its own XLA_FFI_Api function table and calls the handler on the
 * calling thread.
 *
 * Plain C ABI (no CUDA headers, streams are opaque pointers). All structs are
 * read-only inputs, owned by the caller, and only need to live for the call.
 *
 * Example (C++):
 *
 *   int64_t dims[2] = {2, 3};
 *   XkBuffer x = {x_ptr, dims, 2, XLA_FFI_DataType_F32, 0};
 *   XkBuffer y = {y_ptr, dims, 2, XLA_FFI_DataType_F32, 0};
 *   XkAttr eps = {"eps", 3, XLA_FFI_AttrType_SCALAR, XLA_FFI_DataType_F32,
 *                 &eps_value, 0, {0}};
 *   XkDevice dev = {XK_PLATFORM_DEVICE, 0, (void*)cuda_stream, 0, 0, 0};
 *   char err[1024];
 *   if (xk_eager_call((void*)&MyHandler, &dev, &x, 1, &y, 1, &eps, 1, err,
 *                     sizeof err) != 0) { ... err holds the message ... }
 */
#ifndef XLA_KERNELS_RUNTIME_EAGER_FFI_H_
#define XLA_KERNELS_RUNTIME_EAGER_FFI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct below or a function signature changes. */
#define XK_EAGER_ABI_VERSION 2

/* XkDevice.platform */
enum {
  XK_PLATFORM_HOST = 0,   /* CPU: Stream_Get gives NULL, scratch is host memory */
  XK_PLATFORM_DEVICE = 1, /* CUDA/ROCm: Stream_Get gives XkDevice.stream */
};

/* Scratch (XLA_FFI_DeviceMemory_Allocate/Free) callbacks for DEVICE calls.
 * `alloc` returns NULL on failure. Allocations are stream-ordered: the handler
 * frees them before it returns, while kernels it launched on `stream` may still
 * use them, so the allocator must only reuse the memory for work ordered after
 * `stream` (e.g. torch's caching allocator with this stream). */
typedef void* (*XkAllocFn)(void* user, size_t size, size_t alignment,
                           int32_t device_ordinal, void* stream);
typedef void (*XkFreeFn)(void* user, void* ptr, size_t size,
                         int32_t device_ordinal, void* stream);

typedef struct XkDevice {
  int32_t platform;       /* XK_PLATFORM_HOST or XK_PLATFORM_DEVICE */
  int32_t device_ordinal; /* returned by XLA_FFI_DeviceOrdinal_Get */
  void* stream;           /* returned by XLA_FFI_Stream_Get (DEVICE only) */
  XkAllocFn alloc;        /* DEVICE scratch; NULL: scratch requests fail */
  XkFreeFn free;
  void* alloc_user; /* passed back to alloc/free */
} XkDevice;

typedef struct XkBuffer {
  void* data;          /* dense, row-major (XLA default layout) */
  const int64_t* dims; /* `rank` entries; may be NULL when rank == 0 */
  int64_t rank;
  int32_t dtype;    /* XLA_FFI_DataType */
  int32_t reserved; /* must be 0 */
} XkBuffer;

typedef struct XkAttr {
  const char* name; /* UTF-8, need not be NUL-terminated */
  int64_t name_len;
  int32_t kind;     /* XLA_FFI_AttrType: ARRAY (1), DICTIONARY (2), SCALAR (3)
                       or STRING (4) */
  int32_t dtype;    /* XLA_FFI_DataType of the scalar / elements (not STRING,
                       not DICTIONARY) */
  const void* data; /* ARRAY: elements; STRING: bytes; SCALAR: the value, or
                       NULL to use `inline_value`; DICTIONARY: its block */
  int64_t size;     /* ARRAY: element count; STRING: byte length;
                       DICTIONARY: entry count */
  uint8_t inline_value[8]; /* SCALAR value bytes (from byte 0) if data == NULL */
} XkAttr;

/* A DICTIONARY's block is relocatable (position independent): it starts with
 * `size` XkAttr entries, sorted by name, whose `name` and `data` fields hold
 * byte offsets from the start of the block instead of addresses (a `data`
 * offset of 0 means none: the scalar is in `inline_value`), followed by the
 * names and payloads. A nested DICTIONARY entry's `data` is the offset of its
 * own block, whose offsets are relative to that block. Blocks and payloads are
 * 8-byte aligned. Nesting is limited to XK_EAGER_MAX_DICT_DEPTH levels. */
#define XK_EAGER_MAX_DICT_DEPTH 32

/* All arguments of xk_eager_call in one struct (one pointer to pass: cheaper
 * from Python's ctypes than ten arguments). */
typedef struct XkCall {
  void* handler;
  const XkDevice* device;
  const XkBuffer* args;
  int64_t nargs;
  const XkBuffer* rets;
  int64_t nrets;
  const XkAttr* attrs;
  int64_t nattrs;
  char* err_buf;
  int64_t err_len;
} XkCall;

/* XK_EAGER_ABI_VERSION of the loaded library. */
int32_t xk_eager_abi_version(void);

/* The XLA FFI API version (XLA_FFI_API_MAJOR/MINOR) the runtime implements. */
void xk_eager_ffi_api_version(int32_t* major, int32_t* minor);

/* The runtime's `const XLA_FFI_Api*` (for introspection and tests). */
const void* xk_eager_api(void);

/* Calls `handler` (an XLA_FFI_Handler*) at stage EXECUTE. Attributes may come
 * in any order: they are sorted by name as XLA does (duplicates are an error).
 * `device` may be NULL (host, ordinal 0).
 *
 * Returns 0 on success. Otherwise returns the XLA_FFI_Error_Code (> 0) and
 * copies the NUL-terminated, possibly truncated message into err_buf. */
int32_t xk_eager_call(void* handler, const XkDevice* device,
                      const XkBuffer* args, int64_t nargs,
                      const XkBuffer* rets, int64_t nrets,
                      const XkAttr* attrs, int64_t nattrs, char* err_buf,
                      int64_t err_len);

/* xk_eager_call with its arguments in `call`. */
int32_t xk_eager_call_packed(const XkCall* call);

/* Handler stages and state (XLA_FFI_State_Set/Get).
 *
 * xk_eager_call_stage calls `call->handler` at `stage` (XLA_FFI_ExecutionStage:
 * 0 instantiate, 1 prepare, 2 initialize, 3 execute) with `state`, an
 * xk_eager_state_create() object (or NULL: no state). The instantiate,
 * prepare and initialize stages each may set one state object in it; every
 * stage reads them with ffi::State<T, stage>. XLA passes no buffers at
 * instantiate: pass nargs = nrets = 0 there.
 *
 * xk_eager_state_destroy deletes the state objects with the deleters given to
 * xk_eager_register_type (the XLA_FFI_TypeInfo of the type id XLA assigned);
 * objects of types without one are not deleted. */
int32_t xk_eager_call_stage(const XkCall* call, int32_t stage, void* state);
void* xk_eager_state_create(void);
void xk_eager_state_destroy(void* state);
int32_t xk_eager_register_type(int64_t type_id, const void* type_info);

/* Asks `handler` for its metadata, as XLA does at registration: the XLA FFI
 * API version its headers had, its traits (XLA_FFI_Handler_TraitsBits) and the
 * state type id (0 if stateless). Returns 0 or an error code as above. */
int32_t xk_eager_handler_metadata(void* handler, int32_t* api_major,
                                  int32_t* api_minor, uint32_t* traits,
                                  int64_t* state_type_id, char* err_buf,
                                  int64_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* XLA_KERNELS_RUNTIME_EAGER_FFI_H_ */
