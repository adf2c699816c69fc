// The translation unit that turns a legacy custom-call function into a typed XLA FFI handler.
// xla-kernels compiles this file (it is never copied or generated) with
//   -DXK_LEGACY_SOURCE="\"/abs/path/kernel.cc\""   the legacy source, included unchanged
//   -DXK_LEGACY_HANDLER=XlaKernelsLegacy_Fn         the FFI symbol to define
//   -DXK_LEGACY_FUNCTION=Fn                         the legacy function it calls
//   -DXK_LEGACY_ADAPTER=XLA_KERNELS_LEGACY_..._HANDLER   (optional) which calling convention
// Including the real source (rather than a generated copy) lets the compiler's depfile list
// the source and every header it includes, so editing any of them rebuilds the library.
#ifndef XK_LEGACY_SOURCE
#error "legacy_adapter.cc is compiled by xla-kernels with -DXK_LEGACY_SOURCE=\"path\""
#endif

#include XK_LEGACY_SOURCE

#include "xla_kernels/legacy.h"

#ifndef XK_LEGACY_ADAPTER
#ifdef __CUDACC__
#define XK_LEGACY_ADAPTER XLA_KERNELS_LEGACY_CUDA_HANDLER
#else
#define XK_LEGACY_ADAPTER XLA_KERNELS_LEGACY_CPU_HANDLER
#endif
#endif

// One level of indirection so the -D names are expanded before the adapter pastes them.
#define XK_LEGACY_EXPAND(adapter, handler, function) adapter(handler, function)
XK_LEGACY_EXPAND(XK_LEGACY_ADAPTER, XK_LEGACY_HANDLER, XK_LEGACY_FUNCTION);
