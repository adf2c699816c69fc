"""Timing jitted functions the same way everywhere: warm up, then the median of many runs.

Example:
    >>> import jax.numpy as jnp
    >>> t = pipelined_seconds(lambda x: x + 1, jnp.ones(4), calls=3, repeats=3)
    >>> t > 0
    True
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def pipelined_seconds(fn: Callable[..., Any], *args: Any, calls: int = 50, repeats: int = 15,
                      warmup: int = 3) -> float:
    """Median time per call of ``jax.jit(fn)`` when ``calls`` calls are queued back to back.

    JAX dispatches asynchronously: the host queues the next call while the device runs
    the previous one, and only the last result is waited for. For kernels that run longer
    than one dispatch (tens of microseconds) this is device time, as a real program sees
    it; shorter ones measure the dispatch. Every implementation gets the same treatment:
    one op per compiled program, nothing to fuse it with. (Chaining calls inside one
    program is not fair: XLA fuses chains of its own elementwise ops into one pass, and
    a ``fori_loop`` copies a custom call's result into the loop-carried buffer.)

    Example:
        >>> import jax.numpy as jnp
        >>> pipelined_seconds(lambda x, y: x + y, jnp.ones(8), jnp.ones(8), calls=3,
        ...                   repeats=3) > 0
        True
    """
    import jax

    jitted = jax.jit(fn)
    for _ in range(warmup):
        jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls - 1):
            jitted(*args)
        jax.block_until_ready(jitted(*args))
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def barrier_chain(fn: Callable[..., Any], n_sets: int, calls: int) -> Any:
    """One jitted program of ``calls`` calls ``fn(x, *weights)``: call i on ``xs[i]`` and
    weight set ``i % n_sets``, every result returned (nothing to drop). Each call's operands
    pass through an optimization barrier of their own, so that calls sharing a weight set
    cannot be computed together (without it XLA's own dots ran faster per call in a chain than
    one call does). The program takes ``(xs, sets)``.

    Example:
        >>> import jax.numpy as jnp
        >>> program = barrier_chain(lambda x, w: x * w, n_sets=1, calls=2)
        >>> [float(y[0]) for y in program([jnp.ones(1), 2 * jnp.ones(1)], [(jnp.ones(1),)])]
        [1.0, 2.0]
    """
    import jax

    def program(xs: list[Any], sets: list[tuple[Any, ...]]) -> tuple:
        return tuple(fn(*jax.lax.optimization_barrier((xs[i], *sets[i % n_sets])))
                     for i in range(calls))

    return jax.jit(program)


def budgeted_seconds(fn: Callable[..., Any], args: tuple, budget: float, *, calls: int = 1,
                     warmup: int = 1) -> float:
    """Median seconds per op call of the jitted ``fn`` (one program making ``calls`` op
    calls), with programs queued back to back in 5 windows sized to take about ``budget``
    seconds together (1 to 200 programs each, from one timed call after ``warmup``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> budgeted_seconds(jax.jit(lambda x: x + 1), (jnp.ones(4),), budget=0.01) > 0
        True
    """
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    one = time.perf_counter() - start
    per_window = max(1, min(200, int(budget / 5 / max(one, 1e-6))))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        out = None
        for _ in range(per_window):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / per_window / calls)
    return statistics.median(samples)


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Sets environment variables (``None`` removes one) for the ``with`` block and restores
    their previous values after it, e.g. ``XLA_KERNELS_RAGGED_WGMMA=0`` (read at launch) for
    one variant of a timing.

    Example:
        >>> with environment(BENCH_DOCTEST_VARIABLE="0"):
        ...     os.environ["BENCH_DOCTEST_VARIABLE"]
        '0'
        >>> "BENCH_DOCTEST_VARIABLE" in os.environ
        False
    """
    def apply(settings: dict[str, str | None]) -> None:
        for k, v in settings.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    saved = {k: os.environ.get(k) for k in values}
    try:
        apply(values)
        yield
    finally:
        apply(saved)


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

    Uses ``torch.Tensor.copy_`` on CUDA when torch sees a GPU (a plain memcpy, each of
    ``iters`` copies timed alone: :func:`copy_chain_gbs` with one call per chain), else a
    jitted JAX negation (one read and one write per element).
    """
    gbs = copy_chain_gbs(2 * nbytes, calls=1, repeats=iters, warmup=5)
    if gbs is not None:
        return gbs
    import jax.numpy as jnp

    x = jnp.arange(nbytes // 4, dtype=jnp.float32)
    return 2 * nbytes / pipelined_seconds(lambda v: -v, x, repeats=iters) / 1e9


def rotation_sets(set_bytes: int, footprint: int, calls: int) -> int:
    """How many disjoint buffer sets of ``set_bytes`` a chain of ``calls`` rotates over so
    that they hold at least ``footprint`` bytes (one set per call at most).

    Example:
        >>> rotation_sets(67_108_864, 150_000_000, 16), rotation_sets(1 << 20, 150_000_000, 16)
        (3, 16)
        >>> rotation_sets(4_294_967_296, 150_000_000, 16)
        1
    """
    return max(1, min(calls, -(-footprint // set_bytes)))


def copy_chain_gbs(moved_bytes: int, footprint: int = 150_000_000, calls: int = 16,
                   repeats: int = 7, warmup: int = 1) -> float | None:
    """Copy bandwidth (read + write) at one size: ``calls`` back-to-back copies that each
    move ``moved_bytes`` (half read, half written), CUDA events around the chain, median
    of ``repeats`` chains after ``warmup`` untimed ones. The copies rotate over disjoint
    buffers that together hold at least ``footprint`` bytes, so a copy's source is not in
    L2 from the call before.

    The fair bound for a kernel that reads ``moved_bytes`` once at that size, timed the way
    ``benchmarks/paged_attention.py`` times its chains: a copy pays the same launch, ramp
    and tail, which :func:`copy_bandwidth_gbs` (1 GiB, one copy per timing) does not show.
    ``None`` when torch sees no CUDA GPU.

    Example:
        >>> copy_chain_gbs(1 << 20) is None or copy_chain_gbs(1 << 20) > 0
        True
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    elems = max(1, moved_bytes // 8)  # float32 elements per buffer: moved = read + write
    sets = rotation_sets(8 * elems, footprint, calls)
    src = [torch.empty(elems, dtype=torch.float32, device="cuda").uniform_() for _ in range(sets)]
    dst = [torch.empty_like(x) for x in src]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(warmup + repeats):
        start.record()
        for i in range(calls):
            dst[i % sets].copy_(src[i % sets])
        end.record()
        end.synchronize()
        if r >= warmup:
            times.append(start.elapsed_time(end) / 1e3 / calls)
    del src, dst
    return 8 * elems / statistics.median(times) / 1e9


def load_script(path: Path) -> Any:
    """The module of a script file that is not in a package (e.g. a sibling benchmark),
    imported under its file name's stem and registered in ``sys.modules`` (so that
    dataclasses and pickling inside it work).

    Example:
        >>> fd = load_script(Path("benchmarks/flashinfer_decode.py"))  # doctest: +SKIP
        >>> fd.matrix(quick=True, smoke=False)[0]["name"]               # doctest: +SKIP
        '32x2048 32/8 bf16'
    """
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
