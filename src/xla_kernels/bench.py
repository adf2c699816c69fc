"""Timing jitted functions the same way everywhere: warm up, then the median of many runs.

Example:
    >>> import jax.numpy as jnp
    >>> t = median_seconds(lambda x: x + 1, jnp.ones(4), warmup=2, iters=5)
    >>> t > 0
    True
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[..., Any], *args: Any, warmup: int = 5, iters: int = 50) -> float:
    """Median wall time of ``jax.jit(fn)(*args)`` until its result is ready.

    Compilation and first-run costs stay in the warm-up; each timed run waits with
    ``block_until_ready``, so the number includes one dispatch.
    """
    import jax

    jitted = jax.jit(fn)
    for _ in range(warmup):
        jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def chained_seconds(fn: Callable[..., Any], *args: Any, feed: int = 0, chain: int = 20,
                    repeats: int = 15, warmup: int = 2) -> float:
    """Median device time of one call of ``fn``, measured over a chain of calls in one program.

    ``chain`` calls run inside a single jitted ``lax.fori_loop`` whose result feeds back
    into argument ``feed`` (so none can be skipped or hoisted); the program's wall time,
    waited on with ``block_until_ready``, is divided by ``chain``. This removes the
    per-dispatch overhead that dominates small kernels. The output must have the shape
    and dtype of ``args[feed]``.

    Example:
        >>> import jax.numpy as jnp
        >>> chained_seconds(lambda x, y: x + y, jnp.ones(8), jnp.ones(8), chain=3, repeats=3) > 0
        True
    """
    import jax
    from jax import lax

    def loop(*xs: Any) -> Any:
        def body(_: Any, carry: Any) -> Any:
            call = list(xs)
            call[feed] = carry
            return fn(*call)

        return lax.fori_loop(0, chain, body, xs[feed])

    jitted = jax.jit(loop)
    for _ in range(warmup):
        jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) / chain


def device_description() -> dict[str, str]:
    """The JAX backend, device kind and library versions, for result files."""
    import platform

    import jax
    import jaxlib

    device = jax.devices()[0]
    return {"backend": jax.default_backend(), "device": device.device_kind,
            "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "python": platform.python_version()}


def copy_bandwidth_gbs(nbytes: int = 1 << 30, iters: int = 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read plus written.

    Uses ``torch.Tensor.copy_`` on CUDA when torch sees a GPU (a plain memcpy), else a
    jitted JAX negation (one read and one write per element).
    """
    try:
        import torch

        if torch.cuda.is_available():
            src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
            dst = torch.empty_like(src)
            for _ in range(5):
                dst.copy_(src)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(iters):
                start.record()
                dst.copy_(src)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            return 2 * nbytes / statistics.median(times) / 1e9
    except ImportError:
        pass
    import jax.numpy as jnp

    x = jnp.arange(nbytes // 4, dtype=jnp.float32)
    return 2 * nbytes / median_seconds(lambda v: -v, x, iters=iters) / 1e9
