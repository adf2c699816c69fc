// xla-kernels' compile-only stand-in for nanobind/stl/map.h: see ../../xk_compat_bindings.h.
#pragma once

#include "../nanobind.h"
