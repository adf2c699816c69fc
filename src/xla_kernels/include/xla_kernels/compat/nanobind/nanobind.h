// xla-kernels' compile-only stand-in for nanobind/nanobind.h: see ../xk_compat_bindings.h.
// Found only when the real nanobind is not on the include path. NB_MODULE(name, m) { ... }
// becomes an unused function; the handlers are registered through xk.Op.
#pragma once

#include "../xk_compat_bindings.h"

#define XLA_KERNELS_COMPAT_NANOBIND 1

namespace nanobind {
using namespace ::xla_kernels::compat;  // NOLINT: the stand-in's whole surface
}  // namespace nanobind

#define NB_MODULE(name, variable, ...) \
  [[maybe_unused]] static void xla_kernels_compat_nb_module_##name(::nanobind::module_& variable)
#define NB_MAKE_OPAQUE(...)
