"""Small linear calls covering every path of the CUDA kernel, for compute-sanitizer
(scripts/sanitize_kernels.py) and the GPU tests.

Example:
    >>> CASES[0]
    (1, 4096, 4096)
"""

from __future__ import annotations

import numpy as np

# (tokens, in, out): a Llama decode split over a cluster; a partial last chunk and rows past
# out; each tile of the token table (16, 32, 64) and two token tiles past 64; the Hopper
# path's large tile (past 128 tokens; bf16 on compute capability 9.0 takes every aligned
# case above it too); rows that are not whole 16 bytes (the CUDA-core kernel).
CASES = [(1, 4096, 4096), (7, 1040, 72), (17, 512, 200), (40, 520, 136), (100, 256, 64),
         (150, 256, 136), (3, 29, 13)]


def sanitize_cases(platform: str = "gpu") -> None:
    """Every case in bf16, f16 and f32."""
    import jax

    from . import linear

    rng = np.random.default_rng(0)
    device = jax.devices(platform)[0]
    for tokens, k, out in CASES:
        for dtype in ("bfloat16", "float16", "float32"):
            x = rng.standard_normal((tokens, k)).astype(jax.numpy.dtype(dtype))
            w = rng.standard_normal((out, k)).astype(jax.numpy.dtype(dtype))
            jax.block_until_ready(linear(*(jax.device_put(a, device) for a in (x, w))))
