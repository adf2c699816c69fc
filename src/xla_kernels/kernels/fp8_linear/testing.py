"""Small fp8_linear calls covering every path of the CUDA kernel, for compute-sanitizer
(scripts/sanitize_kernels.py) and the GPU tests.

Example:
    >>> CASES[0]
    (1, 4096, 4096, (128, 128))
"""

from __future__ import annotations

import numpy as np

# (tokens, in, out, block_shape): a Llama decode (16-byte loads, one scale per load); per
# channel with two token tiles and a partial one; in not a multiple of 16 (byte loads) and
# out not a multiple of the CTA's 16 rows; blocks narrower than a load (a scale per weight);
# partial 128x128 blocks in both axes; the tensor-core path (bf16/f16, in a multiple of 128)
# with three token tiles, the last partial, and rows past out; the skinny GEMM (per channel,
# up to 16 tokens) with a partial last chunk and rows past out, on a cluster split; the Hopper
# path (bf16, per channel; "none" and W8A8's "dynamic") with each of its tiles partial in both
# axes, its stream-K scheduler (in >= 8192) splitting the K loop of 8 row tiles, and the wide
# tile at 65-128 tokens where its tiles fill the SMs (8448 rows: 66 of 128, 132 of 64); W8A8
# with 128x128 block scales on the Hopper path at each token tile (1, 40 and 70 tokens; 70
# not a multiple of 4); W8A8 beyond 128 tokens on the cooperative 128 x 128 tile, where its
# tiles fill the SMs (4200 rows x 150 tokens: 33 x 2 tiles), both scale kinds.
CASES = [(1, 4096, 4096, (128, 128)), (19, 256, 64, (0, 0)), (3, 29, 13, (0, 0)),
         (9, 96, 40, (8, 8)), (5, 200, 136, (128, 128)), (70, 512, 200, (128, 128)),
         (7, 1040, 72, (0, 0)), (33, 1024, 200, (0, 0)), (129, 512, 264, (0, 0)),
         (40, 8192, 1024, (0, 0)), (97, 256, 8448, (0, 0)), (40, 1024, 200, (128, 128)),
         (150, 256, 4200, (0, 0)), (150, 256, 4200, (128, 128))]


def sanitize_cases(platform: str = "gpu") -> None:
    """Every case in bf16 (f16 and f32 at the smaller ones), both activation schemes."""
    import jax

    from xla_kernels.kernels.fp8_weights import fp8_quantize

    from . import fp8_linear

    rng = np.random.default_rng(0)
    device = jax.devices(platform)[0]
    for tokens, k, out, block in CASES:
        w, s = fp8_quantize(rng.standard_normal((out, k)).astype(np.float32), block)
        for dtype in ("bfloat16",) if k >= 4096 else ("bfloat16", "float16", "float32"):
            x = rng.standard_normal((tokens, k)).astype(jax.numpy.dtype(dtype))
            args = [jax.device_put(a, device) for a in (x, w, s)]
            for scheme in ("none", "dynamic"):
                jax.block_until_ready(fp8_linear(*args, block_shape=block,
                                                 activation_scheme=scheme))
