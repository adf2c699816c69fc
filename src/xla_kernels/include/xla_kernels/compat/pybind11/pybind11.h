// xla-kernels' compile-only stand-in for pybind11/pybind11.h: see ../xk_compat_bindings.h.
// Found only when the real pybind11 is not on the include path. PYBIND11_MODULE(name, m)
// { ... } becomes an unused function; the handlers are registered through xk.Op.
#pragma once

#include "../xk_compat_bindings.h"

#define XLA_KERNELS_COMPAT_PYBIND11 1

namespace pybind11 {
using namespace ::xla_kernels::compat;  // NOLINT: the stand-in's whole surface
}  // namespace pybind11

#define PYBIND11_MODULE(name, variable, ...) \
  [[maybe_unused]] static void xla_kernels_compat_pybind11_module_##name(::pybind11::module_& variable)
#define PYBIND11_MAKE_OPAQUE(...)
