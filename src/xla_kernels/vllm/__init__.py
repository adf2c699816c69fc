"""vLLM's own engine (vllm-tpu + tpu-inference, its JAX backend) on xla-kernels' attention.

Installed beside vLLM (``pip install xla-kernels[vllm]``), this package is found through two
entry points in xla-kernels' metadata, so nothing in vLLM or tpu-inference is edited:

* ``vllm.platform_plugins``: :func:`xla_kernels.vllm.platform.detect` selects
  :class:`~xla_kernels.vllm.platform.XlaKernelsPlatform`, tpu-inference's platform and
  runner, wherever JAX has no TPU (an NVIDIA GPU, or the CPU for tests);
* ``vllm.general_plugins``: :func:`register`, run by vLLM in every process, applies
  :mod:`xla_kernels.vllm.patches`, which (among TPU-only assumptions) make tpu-inference's
  default attention backend run xla-kernels' ops.

Both do nothing on a TPU host (or with ``XLA_KERNELS_VLLM=0``). The core of xla-kernels never
imports this package; it is the only part that imports vllm.
"""

from __future__ import annotations

from .platform import activate, register

__all__ = ["activate", "register"]
