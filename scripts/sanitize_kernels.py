"""Small runs of every shipped CUDA kernel, for compute-sanitizer (memcheck, racecheck).

Run as ``compute-sanitizer --tool memcheck python3 scripts/sanitize_kernels.py``. One kernel's
cases alone, e.g. sample's: ``compute-sanitizer --tool racecheck python3 -c "import sys;
sys.path.insert(0, 'scripts'); import numpy, sanitize_kernels as s;
s.sample_cases(numpy.random.default_rng(0))"``.
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
    from xla_kernels.kernels.paged_attention.testing import sanitize_cases

    sanitize_cases()
    from xla_kernels.kernels.kv_cache import reshape_and_cache

    for dim, dtype in ((128, jnp.bfloat16), (40, jnp.float32), (3, jnp.float16)):
        key = jnp.asarray(rng.standard_normal((9, 2, dim)), dtype)
        cache = jnp.zeros((4, 16, 2, dim), dtype)
        slots = jnp.array([0, 63, -1, 64, 5, 17, 30, 31, 2], jnp.int32)
        jax.block_until_ready(reshape_and_cache(key, key, cache, cache, slots))
    # fp8 caches: quantized writes from every key dtype, both layouts.
    for dim, dtype, layout in ((128, jnp.bfloat16, "vllm"), (40, jnp.float32, "pallas"),
                               (3, jnp.float16, "vllm")):
        key = jnp.asarray(rng.standard_normal((9, 2, dim)) * 100, dtype)
        shape = (4, 16, 2, dim) if layout == "vllm" else (2, 4, 16, dim)
        cache = jnp.zeros(shape, jnp.float8_e4m3fn)
        slots = jnp.array([0, 63, -1, 64, 5, 17, 30, 31, 2], jnp.int32)
        jax.block_until_ready(reshape_and_cache(key, key, cache, cache, slots, layout=layout,
                                                k_scale=0.05, v_scale=0.5))
    from xla_kernels.kernels.rms_norm import rms_norm

    cases = (((3, 129), jnp.float32), ((2, 4, 64), jnp.bfloat16), ((1, 7), jnp.float16))
    for shape, dtype in cases:
        x = jnp.asarray(rng.standard_normal(shape), dtype)
        w = jnp.asarray(rng.standard_normal(shape[-1]), dtype)
        jax.block_until_ready(jax.grad(lambda x, w: rms_norm(x, w).sum(), (0, 1))(x, w))
    from xla_kernels.kernels.rms_norm import fused_add_rms_norm

    # fused_add_rms_norm: odd hidden, fewer and more columns than threads, the serving shape.
    for shape, dtype in (*cases, ((64, 4096), jnp.bfloat16), ((2, 300), jnp.float16)):
        x, r = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(2))
        w = jnp.asarray(rng.standard_normal(shape[-1]), dtype)
        jax.block_until_ready(fused_add_rms_norm(x, r, w))
    sample_cases(rng)
    from xla_kernels.kernels.ragged_paged_attention.testing import sanitize_cases as ragged_cases
    from xla_kernels.kernels.ragged_paged_attention.testing import sanitize_fused_cases

    ragged_cases()
    sanitize_fused_cases()
    from xla_kernels.kernels.moe.testing import sanitize_cases as moe_cases

    moe_cases()
    from xla_kernels.kernels.fp8_linear.testing import sanitize_cases as fp8_linear_cases

    fp8_linear_cases()
    from xla_kernels.kernels.linear.testing import sanitize_cases as linear_cases

    linear_cases()
    print("sanitize run finished")


def sample_cases(rng: np.random.Generator) -> None:
    """sample's CUDA kernel: odd (unaligned) and 128k vocabularies, every dtype; greedy, each
    filter, all together, top-k sets in shared memory (<= 1024 tokens) and not; on an H100
    or H200 (132 SMs) clusters of 8, 4 (24 rows) and 2 (40 rows) blocks, and a block per row
    (70 rows)."""
    from xla_kernels.kernels.sampling import sample

    for rows, vocab, dtype in ((3, 7, jnp.float32), (5, 1001, jnp.bfloat16),
                               (2, 128256, jnp.float16), (4, 128256, jnp.float32),
                               (24, 4099, jnp.float32), (40, 4099, jnp.bfloat16),
                               (70, 4099, jnp.float32)):
        logits = jnp.asarray(rng.standard_normal((rows, vocab)), dtype)
        f32 = jnp.float32
        top_k = jnp.asarray([(0, 50, 2000, 5, 300)[i % 5] for i in range(rows)], jnp.int32)
        args = (jnp.linspace(0, 1.5, rows, dtype=f32), top_k,
                jnp.linspace(1, 0.5, rows, dtype=f32), jnp.linspace(0, 0.1, rows, dtype=f32),
                jnp.arange(rows, dtype=jnp.uint32), jnp.zeros(rows, jnp.int32))
        jax.block_until_ready(sample(logits, *args))


if __name__ == "__main__":
    main()
