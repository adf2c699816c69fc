"""Loading built kernels and registering their handlers with XLA runtimes."""

from xla_kernels.runtime.library import LoadedKernel, kernel_of, load_kernel
from xla_kernels.runtime.registry import Registration, ensure_registered, registrations

__all__ = ["LoadedKernel", "Registration", "ensure_registered", "kernel_of", "load_kernel",
           "registrations"]
