"""``xla-kernels serve-bench``: run the engine on a seeded workload, time it, check it.

What one run does, in order:

1. **Resolves** the options (:func:`resolve`): checks every one and turns them into a
   :class:`Plan`, whose :class:`~xla_kernels.serving.backend.Backend` says what computes
   each role of the step (``attention``, a mixture-of-experts model's ``moe``, the
   ``weights``' projections, the sampling); then (:func:`run`) makes the model (seeded
   random weights) and the runner for ``frontend`` on ``platform``'s first JAX device.
2. **Compiles** every bucket with an empty batch (``compile_s``), so no step of the timed
   run compiles.
3. **Runs** the workload through the engine, a progress bar on stderr, recording every
   step (host time, step time, rows, sequences, context). ``async_scheduling`` keeps one
   step in flight (the host schedules and dispatches step N + 1 while the device runs step
   N; :mod:`~xla_kernels.serving.engine`).
4. **Breaks down** the decode step: the largest decode batch replayed back to back on the
   device (``decode_step_device_ms``: no host work between steps, so the gap to
   ``decode_step_ms`` is the host's scheduling, transfer and dispatch), and the
   cache write + attention replayed alone, for every layer (``attention_ms``,
   ``attention_share`` of the device step). Two more numbers tell where the host's time
   goes: ``dispatch_ms``, the host time of launching the step alone on an idle device, and
   ``decode_step_fresh_batch_ms``, the replay with a new batch put on the device every
   step as the engine does (new input buffers, which XLA's CUDA graphs are updated for).
   ``profile_dir`` writes a ``jax.profiler`` trace of the replay, whose kernel list sums
   the step's kernels. ``config.runtime_env`` records the environment variables that
   change XLA's runtime (``XLA_FLAGS``, ``PJRT_GPU_ENABLE_ASYNC_DISPATCH``, ...).
5. **Checks** the outputs against the dense reference, token for token
   (``matches_reference``; ``first_divergence`` when they differ), in ``check_dtype``
   (float32 unless told otherwise). For a model in another dtype (the bf16 presets),
   where rounding makes exact equality a matter of luck, the check runs a second, untimed
   engine in float32 on the same weights upcast exactly (matmuls at "highest" precision),
   against the float32 reference; the timed run's first divergence from the reference in
   the model's own dtype is reported too (``model_dtype_divergence``).
6. **Reports** (:func:`report`): the run's ``config`` (options resolved), the JSON, the plot.

Example:
    >>> result = serve_bench(BenchOptions(preset="tiny", platform="cpu", requests=2,
    ...                                   progress=False))                 # doctest: +SKIP
    >>> result["matches_reference"], result["tokens_per_s"] > 0             # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from xla_kernels.serving.attention import Attention
from xla_kernels.serving.backend import Backend, Frontend, resolve_backend, resolve_frontend
from xla_kernels.serving.batch import StepBatch, empty_batch
from xla_kernels.serving.blocks import BlockAllocator
from xla_kernels.serving.config import (
    DTYPES,
    PLATFORMS,
    EngineConfig,
    ModelConfig,
    ServingConfigError,
    Workload,
    check_choice,
    preset_entry,
)
from xla_kernels.serving.engine import Engine, Request, StepRecord
from xla_kernels.serving.options import (
    BenchOptions,
    check_memory,
    check_options,
    sampling_of,
    workload_of,
)
from xla_kernels.serving.quantize import weight_bytes
from xla_kernels.serving.tp import check_tp


def make_requests(workload: Workload, vocab_size: int, seed: int) -> list[Request]:
    """The workload's requests: seeded prompt tokens and lengths (see
    :class:`~xla_kernels.serving.config.Workload`).

    Example:
        >>> reqs = make_requests(Workload(3, prompt_len=10, new_tokens=4, output_spread=0.5,
        ...                               arrival_every=2), vocab_size=100, seed=0)
        >>> [(len(r.prompt), r.max_new_tokens, r.arrival) for r in reqs]
        [(12, 3, 0), (12, 4, 2), (11, 4, 4)]
    """
    rng = np.random.default_rng(seed)
    lo = max(1, round(workload.prompt_len * (1 - workload.prompt_spread)))
    hi = max(lo, round(workload.prompt_len * (1 + workload.prompt_spread)))
    out_lo = max(1, round(workload.new_tokens * (1 - workload.output_spread)))
    requests = []
    for i in range(workload.requests):
        length = int(rng.integers(lo, hi + 1))
        new = int(rng.integers(out_lo, workload.new_tokens + 1))
        prompt = rng.integers(0, vocab_size, length).tolist()
        requests.append(Request(i, prompt, new, arrival=i * workload.arrival_every))
    return requests


def _fresh(requests: list[Request]) -> list[Request]:
    return [Request(r.id, list(r.prompt), r.max_new_tokens, r.arrival) for r in requests]


def _devices(platform: str | None) -> list[Any]:
    """The devices of ``platform`` (default: JAX's default backend); the run uses the first
    (the first ``--tp`` with tensor parallelism)."""
    import jax

    if platform is None:
        return jax.devices()
    check_choice("--platform", platform, PLATFORMS)
    try:
        return jax.devices(platform)
    except RuntimeError as e:
        raise ServingConfigError(
            f"--platform {platform}: JAX sees no {platform} device ({e}). Fix: pass "
            f"--platform cpu, or install JAX for your GPU (pip install 'jax[cuda13]').") from e


def make_runner(frontend: Frontend, config: ModelConfig, weights: dict[str, Any],
                engine: EngineConfig, backend: Backend, tp: int = 1,
                devices: list[Any] | None = None) -> Any:
    """The runner of ``frontend`` over ``tp`` of ``devices``, every role of its step
    computed as ``backend`` (:func:`~xla_kernels.serving.backend.resolve_backend`) says."""
    if frontend is Frontend.JAX:
        from xla_kernels.serving.model_jax import JaxRunner

        return JaxRunner(config, weights, engine, backend, tp, devices)
    from xla_kernels.serving.model_torch import TorchaxRunner

    return TorchaxRunner(config, weights, engine, backend, tp, devices)


class Progress:
    """A one-line progress bar on ``stream`` (stderr), redrawn at most every 0.2 s."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True):
        self.total, self.stream, self.enabled = total, stream or sys.stderr, enabled
        self.start = time.perf_counter()
        self.last = 0.0
        self.tokens = 0

    def update(self, engine: Engine, record: StepRecord) -> None:
        self.tokens += record.sampled
        now = time.perf_counter()
        done = len(engine.done)
        if not self.enabled or (now - self.last < 0.2 and done < self.total):
            return
        self.last = now
        width = 30
        filled = width * done // max(self.total, 1)
        rate = self.tokens / max(now - self.start, 1e-9)
        self.stream.write(f"\rserve-bench [{'#' * filled}{'.' * (width - filled)}] "
                          f"{done}/{self.total} requests, {self.tokens} tokens, "
                          f"{rate:.1f} tok/s, step {engine.steps}")
        if done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def replay_ms(fn: Any, calls: int, repeats: int = 5, sync: Any = None) -> float:
    """Median ms per call of ``fn()`` called ``calls`` times back to back, then one
    ``sync(last output)`` (default ``jax.block_until_ready``; a runner's ``fetch``, which
    also waits for torchax tensors, whose leaves ``jax.block_until_ready`` skips)."""
    import jax

    sync = sync or jax.block_until_ready
    sync(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn()
        sync(out)
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


RUNTIME_ENV = ("XLA_FLAGS", "PJRT_GPU_ENABLE_ASYNC_DISPATCH", "XLA_PYTHON_CLIENT_ALLOCATOR",
               "XLA_PYTHON_CLIENT_MEM_FRACTION", "NCCL_LAUNCH_MODE", "CUDA_VISIBLE_DEVICES")


def runtime_env(environ: Any = None) -> dict[str, str]:
    """The variables of ``RUNTIME_ENV`` that are set (in ``environ``, default
    ``os.environ``): what a serve-bench JSON records of the runtime's settings.

    Example:
        >>> runtime_env({"XLA_FLAGS": "--xla_gpu_enable_command_buffer=", "HOME": "/root"})
        {'XLA_FLAGS': '--xla_gpu_enable_command_buffer='}
    """
    import os

    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in RUNTIME_ENV if name in environ}


def _dispatch_ms(runner: Any, prepared: StepBatch, calls: int) -> float:
    """Median host ms of one ``runner.launch(prepared)`` call on an idle device (the launch
    alone; the wait for its tokens is not timed): what a step costs the host to dispatch."""
    times = []
    runner.fetch(runner.launch(prepared))
    for _ in range(calls):
        start = time.perf_counter()
        tokens = runner.launch(prepared)
        times.append((time.perf_counter() - start) * 1e3)
        runner.fetch(tokens)
    return statistics.median(times)


def _attention_ms(config: ModelConfig, engine: EngineConfig, attention: Attention,
                  batch: StepBatch, calls: int, mesh: Any = None) -> float:
    """Median ms of :func:`attention_replay`'s program, its caches donated back each call."""
    jitted, (q, kv, caches, device_batch) = attention_replay(config, engine, attention, batch,
                                                             mesh)
    state = {"caches": caches}

    def call() -> Any:
        out, state["caches"] = jitted(q, kv, state["caches"], device_batch)
        return out

    return replay_ms(call, calls)


def attention_replay(config: ModelConfig, engine: EngineConfig, attention: Attention,
                     batch: StepBatch, mesh: Any = None) -> tuple[Any, tuple[Any, ...]]:
    """The step's attention alone, as a jitted program and its arguments (queries, new K/V,
    the caches, which it donates, and the batch on the device): ``num_layers`` cache writes
    + paged attentions on ``batch`` in one program (one dispatch, like the step), each
    layer's queries the previous layer's output so that none is dropped. The layers share
    one cache pair: the same bytes move as with one pair per layer once the context
    outgrows the GPU's L2. With a tensor-parallel ``mesh`` the heads are split over it as
    in the step.

    Each layer's new K/V are taken from the previous layer's output, as in the model. The
    order this imposes (layer i's attention reads the caches before layer i + 1's write
    updates them in place) is what lets XLA update the shared, donated caches in place:
    with a K/V independent of the attention, the next write may run before the read, and
    XLA copies the whole caches for every write (a time that grows with ``num_blocks``,
    not with the context attended)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from xla_kernels.serving.tp import AXIS

    def put(x: Any, *spec: str | None) -> Any:
        return x if mesh is None else jax.device_put(x, NamedSharding(mesh, P(*spec)))

    from xla_kernels.serving.config import cache_shape

    rows = batch.token_ids.shape[0]
    key = jax.random.key(1)
    q = put(jax.random.normal(key, (rows, config.num_q_heads, config.head_dim), config.dtype),
            None, AXIS)
    kv = put(jax.random.normal(key, (rows, config.num_kv_heads, config.head_dim),
                               config.dtype), None, AXIS)
    shape = cache_shape(config, engine)
    caches = tuple(put(jnp.zeros(shape, config.cache_dtype), None, None, AXIS)
                   for _ in range(2))
    device_batch = put(jax.device_put(batch))

    def layers(q: Any, kv: Any, caches: tuple[Any, Any], batch: StepBatch) -> Any:
        for _ in range(config.num_layers):
            caches = attention.write_kv(kv, kv, *caches, batch.slot_mapping)
            q = attention.attend(q, *caches, batch, scale=config.head_dim ** -0.5)
            # The next write waits for this attention. Each kv head takes the first q head
            # of its group, which tensor parallelism keeps on the same device.
            kv = q.reshape(rows, config.num_kv_heads, -1, config.head_dim)[:, :, 0]
        return q, caches

    return jax.jit(layers, donate_argnums=(2,)), (q, kv, caches, device_batch)


def _reference_check(config: ModelConfig, weights: dict[str, Any],
                     requests: list[Request], outputs: dict[int, list[int]]
                     ) -> dict[str, Any] | None:
    from xla_kernels.serving.reference import dense_outputs, divergence_report

    ref = dense_outputs(config, weights, [r.prompt for r in requests],
                        [r.max_new_tokens for r in requests])
    return divergence_report(outputs, [r.id for r in requests], ref)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One serve-bench run resolved from its options (:func:`resolve`): every option
    checked, every word turned into what it names; nothing below this asks again."""

    options: BenchOptions
    frontend: Frontend
    model: ModelConfig
    backend: Backend
    check_dtype: str
    devices: list[Any]
    workload: Workload
    requests: list[Request]
    engine: EngineConfig

    @property
    def device(self) -> Any:
        return self.devices[0]


def serve_bench(options: BenchOptions) -> dict[str, Any]:
    """Run the benchmark (see the module doc); returns the result dictionary (also written
    to ``options.json_path``)."""
    plan = resolve(options)
    return report(plan, run(plan))


def resolve(options: BenchOptions) -> Plan:
    """Check ``options`` and resolve them into a :class:`Plan` (step 1 of the module doc,
    before any weight is made); a bad one is a :class:`ServingConfigError` naming it."""
    entry = preset_entry(options.preset)
    frontend = resolve_frontend(options.frontend)
    model = entry.model.with_dtype(options.dtype) if options.dtype else entry.model
    model = model.with_weights(options.weights).with_kv_cache(options.kv_cache_dtype)
    check_dtype = check_choice("--check-dtype", options.check_dtype or "float32", DTYPES)
    backend = resolve_backend(model, options.attention, options.moe, sampling_of(options))
    check_options(options, entry)
    devices = _devices(options.platform)
    check_tp(model, options.tp, devices)
    workload = workload_of(options, entry)
    requests = make_requests(workload, model.vocab_size, options.seed)
    engine = _engine_config(options, entry, requests)
    check_memory(model, engine, options.tp, devices[0])
    return Plan(options, frontend, model, backend, check_dtype, devices, workload, requests,
                engine)


def run(plan: Plan) -> dict[str, Any]:
    """Compile, run, break down and check ``plan`` (steps 2 to 5 of the module doc); the
    result without its ``config``."""
    import jax

    from xla_kernels.serving.weights import cast_weights, init_weights

    options, model = plan.options, plan.model
    with jax.default_device(plan.device):
        weights = init_weights(model, options.seed)
        runner = make_runner(plan.frontend, model, weights, plan.engine, plan.backend,
                             options.tp, plan.devices)
        engine, outputs, result = _timed_run(plan, runner)
        result["weights"] = weight_bytes(weights, model, options.tp)
        result["kv_cache"] = kv_cache_bytes(model, options.tp, engine.records)
        if options.breakdown:
            result["breakdown"] = _breakdown(runner, engine, model, plan.engine,
                                             plan.backend.attention, options.profile_dir)
        del runner, engine                       # frees the caches before the check

        check: dict[str, Any] = {"dtype": plan.check_dtype, "ran": options.reference}
        result["matches_reference"] = None
        if options.reference:
            if plan.check_dtype == model.dtype:
                divergence = _reference_check(model, weights, plan.requests, outputs)
            else:
                check["model_dtype_divergence"] = _reference_check(model, weights,
                                                                   plan.requests, outputs)
                exact_weights = cast_weights(weights, plan.check_dtype)
                del weights
                divergence = _exact_check(plan, exact_weights)
            check["first_divergence"] = divergence
            result["matches_reference"] = divergence is None
        result["reference_check"] = check
    return result


def _timed_run(plan: Plan, runner: Any) -> tuple[Engine, dict[int, list[int]], dict[str, Any]]:
    """Compile every bucket, then run the workload through the engine, timed: (the engine,
    its outputs, the result's timings)."""
    options, engine_config = plan.options, plan.engine
    start = time.perf_counter()
    for bucket in engine_config.buckets():
        batch = empty_batch(bucket, engine_config.max_num_seqs, engine_config.max_blocks_per_seq)
        tokens = runner.launch(runner.prepare(batch))
        if options.async_scheduling:     # compiles the bucket's token feed too
            tokens = runner.launch(runner.feed(runner.prepare(batch), [], [], tokens))
        runner.fetch(tokens)
    compile_s = time.perf_counter() - start
    compiled = runner.compiled_buckets()

    allocator = BlockAllocator(engine_config.num_blocks,
                               shuffle_seed=options.seed if options.shuffle_blocks else None)
    engine = Engine(runner, engine_config, allocator, async_scheduling=options.async_scheduling)
    progress = Progress(len(plan.requests), enabled=options.progress)
    start = time.perf_counter()
    outputs = engine.run(_fresh(plan.requests), on_step=progress.update)
    wall_s = time.perf_counter() - start
    if runner.compiled_buckets() != compiled:
        raise AssertionError("a bucket compiled during the timed run")
    result = _metrics(engine, outputs, wall_s)
    result.update(compile_s=round(compile_s, 3), compiled_programs=compiled)
    return engine, outputs, result


def _exact_check(plan: Plan, exact_weights: dict[str, Any]) -> dict[str, Any] | None:
    """The reference check in ``plan.check_dtype``: a second, untimed engine on the weights
    upcast exactly (matmuls at "highest" precision) against the reference in that dtype."""
    import jax

    exact = plan.model.with_dtype(plan.check_dtype)
    with jax.default_matmul_precision("highest"):
        exact_runner = make_runner(plan.frontend, exact, exact_weights, plan.engine,
                                   plan.backend, plan.options.tp, plan.devices)
        exact_out = Engine(exact_runner, plan.engine,
                           async_scheduling=plan.options.async_scheduling
                           ).run(_fresh(plan.requests))
        del exact_runner
        return _reference_check(exact, exact_weights, plan.requests, exact_out)


def report(plan: Plan, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with the run's ``config`` (and ``plot``), written to ``--json``."""
    import jax

    options, model, engine_config, device = plan.options, plan.model, plan.engine, plan.device
    moe = plan.backend.experts.value if plan.backend.experts else None
    result["config"] = {
        "preset": options.preset, "frontend": plan.frontend.value,
        "attention": plan.backend.attention.value, "moe": moe, "platform": device.platform,
        "tp": options.tp,
        "async_scheduling": options.async_scheduling,
        "sampling": dataclasses.asdict(plan.backend.sampling),
        "device": device.device_kind, "dtype": model.dtype, "weights": model.weights,
        "kv_cache_dtype": model.kv_cache,
        "seed": options.seed,
        "model": dataclasses.asdict(model), "params": model.num_params(),
        "workload": dataclasses.asdict(plan.workload),
        "engine": {**dataclasses.asdict(engine_config), "buckets": engine_config.buckets(),
                   "shuffle_blocks": options.shuffle_blocks},
        "jax": jax.__version__,
        "runtime_env": runtime_env(),
    }
    if options.json_path:
        path = Path(options.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        plot = options.plot_path or str(path.with_suffix(".svg"))
    else:
        plot = options.plot_path
    if plot:
        from xla_kernels.serving.plot import write_step_plot

        write_step_plot(result["steps"], plot,
                        title=f"{options.preset} {plan.frontend.value} "
                              f"{plan.backend.attention.value}"
                              + (f" MoE {moe}" if moe else "")
                              + f" on {device.device_kind}")
        result["plot"] = plot
        if options.json_path:
            Path(options.json_path).write_text(json.dumps(result, indent=1) + "\n")
    return result


def kv_cache_bytes(model: ModelConfig, tp: int, records: list[StepRecord]) -> dict[str, Any]:
    """What attention reads of the KV cache, for the roofline next to the ``weights``
    record: ``kv_cache_dtype`` ("auto" or "fp8") and ``dtype`` (the cache's elements);
    ``bytes_per_token``, one context token's K and V over all layers (``per_device``: on
    each of ``tp`` devices, which split the kv heads); ``decode_bytes_read_per_step``, the
    median over decode steps of their context tokens (every sequence's K/V once, the new
    token's included) times ``bytes_per_token``, the statistic ``decode_step_ms`` takes of
    the same steps (``None`` without decode steps). A step's own bytes are its record's
    ``context_tokens`` times ``bytes_per_token``. An fp8 cache's scales are two scalars
    (attributes), no bytes.

    Example:
        >>> from xla_kernels.serving.config import preset
        >>> steps = [StepRecord(0, 2, 16, 0, 2, 100, 2, 0, 0.1, 1.0)]
        >>> read = kv_cache_bytes(preset("tiny").with_kv_cache("fp8"), 2, steps)
        >>> read["dtype"], read["bytes_per_token"], read["per_device"]
        ('float8_e4m3fn', 512, 256)
        >>> read["decode_bytes_read_per_step"], read["decode_bytes_read_per_step_per_device"]
        (51200, 25600)
    """
    per_token, per_device = model.kv_bytes_per_token(), model.kv_bytes_per_token(tp)
    contexts = [r.context_tokens for r in records if r.kind == "decode"]
    context = statistics.median(contexts) if contexts else None
    return {"kv_cache_dtype": model.kv_cache, "dtype": model.cache_dtype,
            "bytes_per_token": per_token, "per_device": per_device,
            "decode_bytes_read_per_step": None if context is None else round(context * per_token),
            "decode_bytes_read_per_step_per_device":
                None if context is None else round(context * per_device)}


def _given(value: int | None, default: int) -> int:
    """An option's value, or the default when it was not given (0 is a value, not unset)."""
    return default if value is None else value


def _engine_config(options: BenchOptions, entry: Any, requests: list[Request]) -> EngineConfig:
    """The engine's limits: the options given, else the preset's; by default enough cache
    blocks for every request admitted at once."""
    block_size = _given(options.block_size, entry.block_size)
    max_num_seqs = _given(options.max_num_seqs, entry.max_num_seqs)
    token_budget = _given(options.token_budget, entry.token_budget)
    blocks_per_request = max(r.blocks_needed(block_size) for r in requests)
    return EngineConfig(
        block_size=block_size,
        num_blocks=_given(options.num_blocks,
                          min(max_num_seqs, len(requests)) * blocks_per_request),
        max_num_seqs=max_num_seqs,
        max_model_len=max(len(r.prompt) + r.max_new_tokens for r in requests),
        token_budget=token_budget, min_bucket=min(16, token_budget))


def _metrics(engine: Engine, outputs: dict[int, list[int]], wall_s: float) -> dict[str, Any]:
    records = engine.records
    decode = [r for r in records if r.kind == "decode"]
    prefill = [r for r in records if r.kind == "prefill"]
    generated = sum(map(len, outputs.values()))

    def total_ms(rs: list[StepRecord]) -> float:
        return sum(r.host_ms + r.step_ms for r in rs)

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 4) if values else None

    return {
        "tokens_per_s": round(generated / wall_s, 2),
        "generated_tokens": generated,
        "wall_s": round(wall_s, 3),
        "decode_step_ms": median([r.host_ms + r.step_ms for r in decode]),
        "decode_tokens_per_s": (round(sum(r.decode_tokens for r in decode)
                                      / (total_ms(decode) / 1e3), 2) if decode else None),
        "prefill_tokens_per_s": (round(sum(r.prefill_tokens for r in prefill)
                                       / (total_ms(prefill) / 1e3), 2) if prefill else None),
        "prefill_tokens": sum(r.prefill_tokens for r in records),
        "host_ms_per_step": median([r.host_ms for r in records]),
        "steps_run": len(records),
        "requests": len(outputs),
        "outputs": {str(k): v for k, v in outputs.items()},
        "steps": [{"num_seqs": r.num_seqs, "bucket": r.bucket,
                   "prefill_tokens": r.prefill_tokens, "decode_tokens": r.decode_tokens,
                   "context_tokens": r.context_tokens, "kind": r.kind,
                   "host_ms": round(r.host_ms, 4), "ms": round(r.host_ms + r.step_ms, 4)}
                  for r in records],
    }


def _breakdown(runner: Any, engine: Engine, model: ModelConfig, engine_config: EngineConfig,
               attention: Attention, profile_dir: str | None) -> dict[str, Any] | None:
    """Replay the largest decode step: device-bound step time and the attention's share."""
    decode = [r for r in engine.records if r.kind == "decode"]
    if not decode:
        return None
    widest = max(decode, key=lambda r: (r.num_seqs, r.context_tokens))
    batch = decode_batch(engine_config, widest.num_seqs,
                         widest.context_tokens // widest.num_seqs)
    prepared = runner.prepare(batch)
    calls = 20
    step_ms = replay_ms(lambda: runner.launch(prepared), calls, sync=runner.fetch)
    # The engine prepares a new batch every step: new input buffers (what XLA's command
    # buffers must be updated for) and the host-to-device copies.
    fresh_ms = replay_ms(lambda: runner.launch(runner.prepare(batch)), calls,
                         sync=runner.fetch)
    dispatch_ms = _dispatch_ms(runner, prepared, calls)
    if profile_dir:
        import jax

        with jax.profiler.trace(profile_dir):
            replay_ms(lambda: runner.launch(prepared), calls, repeats=1, sync=runner.fetch)
    attention_ms = _attention_ms(model, engine_config, attention, batch, calls, runner.mesh)
    wall = statistics.median(r.host_ms + r.step_ms for r in decode
                             if r.num_seqs == widest.num_seqs)
    return {
        "replayed_num_seqs": widest.num_seqs,
        "replayed_context_per_seq": widest.context_tokens // widest.num_seqs,
        # the replayed step's KV read (its batch's kv_lens, all layers), next to its device ms
        "replayed_kv_bytes_read": int(batch.kv_lens.sum()) * model.kv_bytes_per_token(),
        "decode_step_ms": round(wall, 4),
        "decode_step_device_ms": round(step_ms, 4),
        "host_and_dispatch_ms": round(wall - step_ms, 4),
        "decode_step_fresh_batch_ms": round(fresh_ms, 4),
        "dispatch_ms": round(dispatch_ms, 4),
        "attention_ms": round(attention_ms, 4),
        "attention_share": round(attention_ms / step_ms, 4) if step_ms > 0 else None,
        "profile_dir": profile_dir,
    }


def decode_batch(cfg: EngineConfig, num_seqs: int, context: int) -> StepBatch:
    """A decode batch of ``num_seqs`` sequences of ``context`` tokens on disjoint blocks."""
    batch = empty_batch(cfg.bucket(num_seqs), cfg.max_num_seqs, cfg.max_blocks_per_seq)
    per_seq = min(math.ceil(context / cfg.block_size), cfg.max_blocks_per_seq,
                  cfg.num_blocks // max(num_seqs, 1))
    context = min(context, per_seq * cfg.block_size)
    for s in range(num_seqs):
        table = np.arange(s * per_seq, (s + 1) * per_seq, dtype=np.int32)
        pos = context - 1
        batch.token_ids[s] = s
        batch.positions[s] = pos
        batch.slot_mapping[s] = table[pos // cfg.block_size] * cfg.block_size \
            + pos % cfg.block_size
        batch.kv_lens[s] = context
        batch.block_tables[s, :per_seq] = table
        batch.cu_q_lens[s + 1] = s + 1
        batch.logits_indices[s] = s
    batch.cu_q_lens[num_seqs + 1:] = num_seqs
    batch.num_seqs[0] = num_seqs
    return batch


__all__ = ["BenchOptions", "Plan", "Progress", "attention_replay", "decode_batch",
           "kv_cache_bytes", "make_requests", "make_runner", "replay_ms", "report", "resolve",
           "run", "runtime_env", "serve_bench"]
