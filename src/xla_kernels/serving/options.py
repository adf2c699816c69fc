"""serve-bench's options and their checks: a bad value is refused before anything is built
or compiled, in one line that names the option and the fix.

:func:`check_options` takes what needs no device (ranges, lengths against the model's
context, limits against the workload, paths, conflicting options); :func:`check_memory`
takes the caches against the device's memory once the device is known. The words that pick
an implementation (``--frontend``, ``--attention``, ``--moe``) are checked where they are
resolved, in :mod:`~xla_kernels.serving.backend`.

Example:
    >>> from xla_kernels.serving.config import preset_entry
    >>> try:
    ...     check_options(BenchOptions(new_tokens=0), preset_entry("tiny"))
    ... except ServingConfigError as e:
    ...     print(e)
    --new-tokens 0: must be 1 or more. Fix: pass --new-tokens 1 or more.
    >>> try:
    ...     check_options(BenchOptions(new_tokens=10**6), preset_entry("tiny"))
    ... except ServingConfigError as e:
    ...     print(e)                                      # doctest: +NORMALIZE_WHITESPACE
    --new-tokens 1000000: the model's context is 32768 tokens (prompt + output). Fix: pass
    --new-tokens 32767 or less.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from xla_kernels.kernels.paged_cache import BLOCK_SIZES as PAGED_BLOCK_SIZES
from xla_kernels.serving.config import (
    EngineConfig,
    ModelConfig,
    Preset,
    ServingConfigError,
    Workload,
)
from xla_kernels.serving.sampling import Sampling

MAX_SEED = 2**32 - 1
"""The largest seed: 32 bits, which NumPy's generator and ``jax.random.key`` both take."""

MAX_REQUESTS = 100_000
"""Requests one run takes: the presets send 8 or 64; every prompt is held in memory, and a
run of more would take hours even on the tiny preset."""

BLOCK_SIZES = PAGED_BLOCK_SIZES
"""Tokens per cache block that the kernels take (``kernels.paged_cache.BLOCK_SIZES``, from
the attention kernels' limits header)."""
BLOCK_SIZES_TEXT = ", ".join(map(str, BLOCK_SIZES[:-1])) + f" or {BLOCK_SIZES[-1]}"

@dataclasses.dataclass
class BenchOptions:
    """serve-bench's options; ``None`` takes the preset's default."""

    preset: str = "tiny"
    frontend: str = "jax"
    attention: str = "xla-kernels"
    moe: str = "auto"                    # the experts: auto (as --attention), xla-kernels,
                                         # ragged-dot or plain-xla; MoE presets only
    platform: str | None = None          # None: JAX's default backend
    requests: int | None = None
    prompt_len: int | None = None
    new_tokens: int | None = None
    dtype: str | None = None
    check_dtype: str | None = None       # the equality check's dtype; None: float32
    weights: str = "model"               # projections: model dtype, fp8 or fp8-dynamic
    kv_cache_dtype: str = "auto"         # the KV cache: auto (the model's dtype) or fp8
    seed: int = 0
    block_size: int | None = None
    num_blocks: int | None = None        # None: every admitted request fits at once
    max_num_seqs: int | None = None
    token_budget: int | None = None
    arrival_every: int | None = None
    shuffle_blocks: bool = False
    reference: bool = True
    breakdown: bool = True
    progress: bool = True
    json_path: str | None = None
    plot_path: str | None = None         # None: next to the JSON, .svg
    profile_dir: str | None = None
    tp: int = 1                          # tensor parallel degree (kv heads split)
    async_scheduling: bool = False       # one step in flight (see the engine's module doc)
    temperature: float = 0.0             # 0: greedy; > 0: drawn by the sample op
    top_k: int | None = None             # None or 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    sampling_seed: int | None = None     # None: 0


def parse_whole(option: str, text: str) -> int:
    """``text`` as an int, else a :class:`ServingConfigError` naming ``option``.

    Example:
        >>> parse_whole("--requests", "8")
        8
        >>> try:
        ...     parse_whole("--requests", "8.5")
        ... except ServingConfigError as e:
        ...     print(e)
        --requests '8.5': not a whole number. Fix: pass --requests as digits, e.g. --requests 8.
    """
    try:
        return int(text)
    except ValueError:
        raise ServingConfigError(f"{option} {text!r}: not a whole number. Fix: pass {option} "
                                 f"as digits, e.g. {option} 8.") from None


def parse_real(option: str, text: str) -> float:
    """``text`` as a finite float, else a :class:`ServingConfigError` naming ``option``.

    Example:
        >>> parse_real("--top-p", "0.9")
        0.9
        >>> try:
        ...     parse_real("--top-p", "nan")
        ... except ServingConfigError as e:
        ...     print(e)
        --top-p 'nan': not a finite number. Fix: pass --top-p as a decimal, e.g. --top-p 0.5.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ServingConfigError(f"{option} {text!r}: not a finite number. Fix: pass {option} "
                                 f"as a decimal, e.g. {option} 0.5.")
    return value


def sampling_of(options: BenchOptions) -> Sampling:
    """How the run picks tokens (greedy unless ``--temperature`` is above 0)."""
    return Sampling(temperature=options.temperature, top_k=options.top_k or 0,
                    top_p=options.top_p, min_p=options.min_p, seed=options.sampling_seed or 0)


def workload_of(options: BenchOptions, entry: Preset) -> Workload:
    """The preset's workload with the options that were given."""
    given = (("requests", options.requests), ("prompt_len", options.prompt_len),
             ("new_tokens", options.new_tokens), ("arrival_every", options.arrival_every))
    return dataclasses.replace(entry.workload, **{k: v for k, v in given if v is not None})


def longest_prompt(workload: Workload) -> int:
    """The longest prompt :func:`~xla_kernels.serving.bench.make_requests` may draw.

    Example:
        >>> longest_prompt(Workload(8, prompt_len=24, new_tokens=12, prompt_spread=0.75))
        42
    """
    lo = max(1, round(workload.prompt_len * (1 - workload.prompt_spread)))
    return max(lo, round(workload.prompt_len * (1 + workload.prompt_spread)))


def check_options(options: BenchOptions, entry: Preset) -> None:
    """Refuse what is wrong with ``options`` on preset ``entry`` before any device work."""
    _check_ranges(options)
    workload = workload_of(options, entry)
    _check_context(options, workload, entry.model)
    _check_engine(options, workload, entry)
    _check_paths(options)
    _check_conflicts(options)
    _check_sampling(options)


def _check_at_least(option: str, value: int | None, low: int) -> None:
    if value is not None and value < low:
        raise ServingConfigError(f"{option} {value}: must be {low} or more. Fix: pass "
                                 f"{option} {low} or more.")


def _check_ranges(options: BenchOptions) -> None:
    for option, value, low in (("--requests", options.requests, 1),
                               ("--prompt-len", options.prompt_len, 1),
                               ("--new-tokens", options.new_tokens, 1),
                               ("--arrival-every", options.arrival_every, 0),
                               ("--max-num-seqs", options.max_num_seqs, 1),
                               ("--token-budget", options.token_budget, 1),
                               ("--num-blocks", options.num_blocks, 1),
                               ("--seed", options.seed, 0)):
        _check_at_least(option, value, low)
    if options.requests is not None and options.requests > MAX_REQUESTS:
        raise ServingConfigError(
            f"--requests {options.requests}: more than {MAX_REQUESTS} would run for hours and "
            f"hold every prompt in memory. Fix: pass --requests {MAX_REQUESTS} or less.")
    if options.seed > MAX_SEED:
        raise ServingConfigError(f"--seed {options.seed}: must be {MAX_SEED} or less (a 32-bit "
                                 f"seed). Fix: pass --seed 0 to {MAX_SEED}.")
    if options.block_size is not None and options.block_size not in BLOCK_SIZES:
        raise ServingConfigError(f"--block-size {options.block_size}: the kernels take "
                                 f"{BLOCK_SIZES_TEXT} tokens per block. Fix: pass --block-size "
                                 f"{BLOCK_SIZES_TEXT}.")


def _check_context(options: BenchOptions, workload: Workload, model: ModelConfig) -> None:
    """The longest request (prompt + new tokens) must fit the model's context."""
    context = model.max_context
    if workload.new_tokens >= context:
        raise ServingConfigError(
            f"--new-tokens {workload.new_tokens}: the model's context is {context} tokens "
            f"(prompt + output). Fix: pass --new-tokens {context - 1} or less.")
    longest = longest_prompt(workload) + workload.new_tokens
    if longest <= context:
        return
    fits = int((context - workload.new_tokens) / (1 + workload.prompt_spread)) + 1
    while longest_prompt(dataclasses.replace(workload, prompt_len=fits)) \
            + workload.new_tokens > context:
        fits -= 1
    raise ServingConfigError(
        f"--prompt-len {workload.prompt_len}: prompts of up to "
        f"{longest - workload.new_tokens} tokens + {workload.new_tokens} new tokens exceed the "
        f"model's context of {context} tokens. Fix: pass --prompt-len {fits} or less, or "
        "fewer --new-tokens.")


def _check_engine(options: BenchOptions, workload: Workload, entry: Preset) -> None:
    """Limits the workload can use: more sequences than requests, or more rows than all
    sequences' tokens, only pad every step (and --max-num-seqs 10**9 would not fit memory);
    fewer blocks than the longest request needs could never run it."""
    if options.max_num_seqs is not None and options.max_num_seqs > workload.requests:
        raise ServingConfigError(
            f"--max-num-seqs {options.max_num_seqs}: more than the {workload.requests} "
            f"requests, so never filled. Fix: pass --max-num-seqs {workload.requests} or less.")
    max_num_seqs = entry.max_num_seqs if options.max_num_seqs is None else options.max_num_seqs
    longest = longest_prompt(workload) + workload.new_tokens
    rows = min(max_num_seqs, workload.requests) * longest
    if options.token_budget is not None and options.token_budget > max(rows, max_num_seqs):
        raise ServingConfigError(
            f"--token-budget {options.token_budget}: a step never has more than {rows} rows "
            f"here ({min(max_num_seqs, workload.requests)} sequences of up to {longest} "
            f"tokens). Fix: pass --token-budget {max(rows, max_num_seqs)} or less.")
    block_size = entry.block_size if options.block_size is None else options.block_size
    needed = -(-longest // block_size)
    if options.num_blocks is not None and options.num_blocks < needed:
        raise ServingConfigError(
            f"--num-blocks {options.num_blocks}: the longest request ({longest} tokens) needs "
            f"{needed} blocks of {block_size}. Fix: pass --num-blocks {needed} or more, or "
            "leave it unset (every admitted request fits).")


def _check_paths(options: BenchOptions) -> None:
    """Output paths, checked before the run rather than after it."""
    if options.json_path is not None and Path(options.json_path).is_dir():
        raise ServingConfigError(f"--json {options.json_path}: is a directory. Fix: pass a "
                                 "file path, e.g. --json out.json.")
    if options.plot_path is not None:
        from xla_kernels.serving.plot import check_plot_path

        check_plot_path(options.plot_path)
    if options.profile_dir is not None and Path(options.profile_dir).is_file():
        raise ServingConfigError(f"--profile {options.profile_dir}: is a file. Fix: pass a "
                                 "directory (it is created if missing).")


def _check_conflicts(options: BenchOptions) -> None:
    if options.profile_dir is not None and not options.breakdown:
        raise ServingConfigError("--profile traces the breakdown's replay, which "
                                 "--no-breakdown skips. Fix: drop one of them.")
    if options.check_dtype is not None and not options.reference:
        raise ServingConfigError("--check-dtype sets the reference check's dtype, which "
                                 "--no-reference skips. Fix: drop one of them.")


def _check_sampling(options: BenchOptions) -> None:
    """Ranges of the sampling options, filters that greedy would ignore, and the reference
    check, which compares greedy tokens."""
    for option, value, low, high in (("--temperature", options.temperature, 0.0, None),
                                     ("--top-p", options.top_p, 0.0, 1.0),
                                     ("--min-p", options.min_p, 0.0, 1.0)):
        if value < low or (high is not None and value > high):
            span = f"{low:g} or more" if high is None else f"{low:g} to {high:g}"
            raise ServingConfigError(f"{option} {value:g}: must be {span}. Fix: pass "
                                     f"{option} {span}.")
    _check_at_least("--top-k", options.top_k, 0)
    _check_at_least("--sampling-seed", options.sampling_seed, 0)
    if options.sampling_seed is not None and options.sampling_seed > MAX_SEED:
        raise ServingConfigError(
            f"--sampling-seed {options.sampling_seed}: must be {MAX_SEED} or less (a 32-bit "
            f"seed). Fix: pass --sampling-seed 0 to {MAX_SEED}.")
    sampling = sampling_of(options)
    if sampling.greedy:
        given = [name for name, on in (("--top-k", sampling.top_k > 0),
                                       ("--top-p", sampling.top_p < 1),
                                       ("--min-p", sampling.min_p > 0),
                                       ("--sampling-seed", options.sampling_seed is not None))
                 if on]
        if given:
            raise ServingConfigError(f"{given[0]} has no effect at --temperature 0 (greedy). "
                                     f"Fix: pass --temperature above 0 too, or drop "
                                     f"{given[0]}.")
    elif options.reference:
        raise ServingConfigError(f"--temperature {options.temperature:g} draws tokens, and the "
                                 "reference check compares greedy tokens. Fix: pass "
                                 "--no-reference, or --temperature 0.")


def memory_bytes(device: Any) -> int | None:
    """Memory of ``device``: a GPU's allocator limit, the host's RAM for the CPU; ``None``
    when unknown."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    if getattr(device, "platform", None) == "cpu" and hasattr(os, "sysconf"):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def check_memory(model: ModelConfig, engine: EngineConfig, tp: int, device: Any) -> None:
    """Refuse caches larger than one device's memory (each of ``tp`` devices holds
    ``1 / tp`` of them), rather than fail in the allocator or swap for hours."""
    available = memory_bytes(device)
    if available is None:
        return
    per_block = engine.block_size * model.kv_bytes_per_token(tp)
    if engine.num_blocks * per_block <= available:
        return
    raise ServingConfigError(
        f"--num-blocks {engine.num_blocks}: the caches take "
        f"{engine.num_blocks * per_block / 2**30:.1f} GiB, more than the "
        f"{available / 2**30:.1f} GiB of the {device.platform} device. Fix: pass --num-blocks "
        f"{available // per_block} or less, or leave it unset.")


__all__ = ["BLOCK_SIZES", "MAX_REQUESTS", "MAX_SEED", "BenchOptions", "check_memory",
           "check_options", "longest_prompt", "memory_bytes", "parse_real", "parse_whole",
           "sampling_of", "workload_of"]
