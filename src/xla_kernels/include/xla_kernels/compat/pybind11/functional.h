// xla-kernels' compile-only stand-in for pybind11/functional.h: see ../xk_compat_bindings.h.
#pragma once

#include "pybind11.h"
