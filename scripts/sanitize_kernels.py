"""Small runs of every shipped CUDA kernel, for compute-sanitizer (memcheck, racecheck).

Run as ``compute-sanitizer --tool memcheck python3 scripts/sanitize_kernels.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.kernels.simple_add import simple_add


def main() -> None:
    rng = np.random.default_rng(0)
    for size in (1, 7, 1029):
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
            a = jnp.asarray(rng.standard_normal(size), dtype)
            jax.block_until_ready(simple_add(a, a))
    try:
        from xla_kernels.kernels.paged_attention import sanitize_cases
    except ImportError:
        print("paged attention: no sanitize_cases yet")
    else:
        sanitize_cases()
    from xla_kernels.kernels.ragged_paged_attention import sanitize_cases as ragged_cases

    ragged_cases()
    print("sanitize run finished")


if __name__ == "__main__":
    main()
