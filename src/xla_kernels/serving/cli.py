"""``xla-kernels serve-bench``: its options, the
:class:`~xla_kernels.serving.options.BenchOptions` they make, and the summary printed after
the run. :mod:`xla_kernels.cli` registers it
(:func:`add_parser`) and prints the summary's rows (:func:`run`).

Example:
    $ xla-kernels serve-bench --preset tiny --platform cpu --frontend torchax --json out.json
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def add_parser(sub: Any) -> None:
    """Add ``serve-bench`` and its options to the subcommands ``sub``."""
    srv = sub.add_parser(
        "serve-bench", help="run a Llama-style model in the paged-KV serving loop; time it",
        description="Generate greedily for a seeded workload with continuous batching over "
                    "a paged KV cache, time it, and check the tokens against a dense "
                    "(unpaged) reference. Unset options take the preset's defaults.")
    srv.add_argument("--preset", default="tiny",
                     help="tiny, 1b, 8b, tiny-moe or moe (default tiny)")
    srv.add_argument("--frontend", default="jax", help="jax or torchax (default jax)")
    srv.add_argument("--attention", default="xla-kernels",
                     help="xla-kernels (the library's custom calls) or plain-xla (their "
                          "plain-XLA fallbacks); default xla-kernels")
    srv.add_argument("--moe", default="auto",
                     help="a mixture-of-experts preset's expert layer: auto (default: as "
                          "--attention, fused_moe under xla-kernels, fused_moe_xla under "
                          "plain-xla), xla-kernels (the fused_moe custom call), ragged-dot "
                          "(fused_moe_ragged_dot: two jax.lax.ragged_dot grouped GEMMs) or "
                          "plain-xla (fused_moe_xla: every expert over every token); the "
                          "attention stays as --attention says. Dense presets take only auto")
    srv.add_argument("--platform", default=None,
                     help="cpu or gpu (default: JAX's default backend)")
    # Whole numbers are parsed by options_of, so a bad one gets the same one-line error
    # (naming the option and the fix) as a bad value of the right type.
    srv.add_argument("--requests", help="number of requests")
    srv.add_argument("--prompt-len", help="mean prompt length (tokens)")
    srv.add_argument("--new-tokens", help="most tokens generated per request")
    srv.add_argument("--arrival-every",
                     help="request i arrives before step i * N (0: all at once)")
    srv.add_argument("--dtype", help="float32, bfloat16 or float16 (default: the preset's)")
    srv.add_argument("--weights", default="model",
                     help="the decoder's q/k/v/o and gate/up/down projections: model (the "
                          "model's dtype; default), fp8 (e4m3, per-channel scales, weight-only "
                          "W8A16) or fp8-dynamic (W8A8, per-token activation scales)")
    srv.add_argument("--kv-cache-dtype", default="auto",
                     help="the paged K and V caches: auto (the model's dtype; default) or fp8 "
                          "(float8_e4m3fn, per-tensor scales 1.0, as vLLM's "
                          "kv_cache_dtype=\"fp8\")")
    srv.add_argument("--check-dtype",
                     help="dtype of the token-for-token reference check (default float32; "
                          "a model in another dtype is re-run untimed in it)")
    srv.add_argument("--no-reference", action="store_true",
                     help="skip the dense reference check")
    srv.add_argument("--no-breakdown", action="store_true",
                     help="skip the decode-step replay (device time, attention share)")
    srv.add_argument("--max-num-seqs", help="most sequences per step")
    srv.add_argument("--token-budget", help="most query rows per step")
    srv.add_argument("--block-size", help="tokens per cache block: 16, 32, 64, 128 or 256 "
                     "(the attention kernels' block sizes)")
    srv.add_argument("--num-blocks",
                     help="cache blocks per layer (default: all admitted requests fit)")
    srv.add_argument("--shuffle-blocks", action="store_true",
                     help="hand cache blocks out in a random order")
    srv.add_argument("--seed", default="0", help="weights and workload seed")
    srv.add_argument("--json", dest="json_path", metavar="PATH", help="write the results here")
    srv.add_argument("--plot", dest="plot_path", metavar="PATH",
                     help="step time plot, .svg or .png (default: the JSON path with .svg)")
    srv.add_argument("--profile", dest="profile_dir", metavar="DIR",
                     help="write a jax.profiler trace of the replayed decode step")
    srv.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    srv.add_argument("--tp", default="1",
                     help="tensor parallel degree: split the kv heads over the platform's "
                          "first N devices (default 1)")
    srv.add_argument("--temperature", default="0",
                     help="sampling temperature; 0 (default) picks greedily, above 0 draws with "
                          "the sample op (needs --no-reference)")
    srv.add_argument("--top-k", help="keep the k most likely tokens (default: off)")
    srv.add_argument("--top-p", default="1", help="keep the most likely tokens of this mass "
                                                  "(default 1: off)")
    srv.add_argument("--min-p", default="0", help="keep tokens at least this times as likely as "
                                                  "the most likely (default 0: off)")
    srv.add_argument("--sampling-seed", help="request i draws with seed SEED + i (default 0)")
    srv.add_argument("--async-scheduling", action="store_true",
                     help="keep one step in flight: schedule and dispatch step N + 1 while "
                          "the device runs step N; with --frontend jax on a GPU this also "
                          "turns on the PjRt client's async dispatch "
                          "(PJRT_GPU_ENABLE_ASYNC_DISPATCH=1) unless that variable is set")


ASYNC_DISPATCH_ENV = "PJRT_GPU_ENABLE_ASYNC_DISPATCH"


def async_dispatch_env(async_scheduling: bool, platform: str | None, frontend: str,
                       environ: dict[str, str]) -> dict[str, str]:
    """The variables serve-bench sets before JAX creates its GPU client: with
    ``--async-scheduling --frontend jax`` on a GPU (or the default platform), the PjRt GPU
    client's asynchronous dispatch (``PJRT_GPU_ENABLE_ASYNC_DISPATCH=1``: a jitted call
    returns before its work is launched), unless ``environ`` already sets it (``0`` keeps
    it off).

    Measured on 2 H200s, 1b preset, JAX, async scheduling: the tp 2 decode step 4.81 ->
    2.76 ms (the host's dispatch was the limit), tp 1 tokens/s +2.6 %
    (``benchmarks/results/latest/h200x2/dispatch_variants.md``). Left alone where it was not
    shown to help: the synchronous engine waits every step (JAX gained nothing; torchax lost
    6-14 %), and torchax with async scheduling was not measured with it.

    Example:
        >>> async_dispatch_env(True, "gpu", "jax", {})
        {'PJRT_GPU_ENABLE_ASYNC_DISPATCH': '1'}
        >>> async_dispatch_env(True, "gpu", "jax", {"PJRT_GPU_ENABLE_ASYNC_DISPATCH": "0"})
        {}
        >>> [async_dispatch_env(*case, {}) for case in
        ...  ((False, "gpu", "jax"), (True, "cpu", "jax"), (True, "gpu", "torchax"))]
        [{}, {}, {}]
    """
    if not async_scheduling or platform == "cpu" or frontend != "jax" \
            or ASYNC_DISPATCH_ENV in environ:
        return {}
    return {ASYNC_DISPATCH_ENV: "1"}


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Run ``serve-bench`` on the parsed ``args``; returns the summary's rows (the JSON goes
    to ``--json``)."""
    # Before anything creates JAX's GPU client, which reads it once.
    os.environ.update(async_dispatch_env(args.async_scheduling, args.platform, args.frontend,
                                         dict(os.environ)))
    from xla_kernels.serving.bench import serve_bench

    return summary(serve_bench(options_of(args)), args.json_path)


def options_of(args: argparse.Namespace) -> Any:
    """The :class:`~xla_kernels.serving.options.BenchOptions` of the parsed ``args``; a bad
    number is a one-line error naming its option."""
    from xla_kernels.serving.options import BenchOptions

    return BenchOptions(
        preset=args.preset, frontend=args.frontend, attention=args.attention, moe=args.moe,
        platform=args.platform, dtype=args.dtype, check_dtype=args.check_dtype,
        weights=args.weights, kv_cache_dtype=args.kv_cache_dtype,
        shuffle_blocks=args.shuffle_blocks, reference=not args.no_reference,
        breakdown=not args.no_breakdown, progress=not args.no_progress,
        json_path=args.json_path, plot_path=args.plot_path, profile_dir=args.profile_dir,
        async_scheduling=args.async_scheduling, **_whole_numbers(args), **_reals(args))


def summary(result: dict[str, Any], json_path: str | None) -> list[tuple[str, str]]:
    """The rows serve-bench prints of ``result`` (its JSON written to ``json_path``)."""
    config = result["config"]
    weights = "" if config["weights"] == "model" else f" {config['weights']} weights"
    if config["kv_cache_dtype"] != "auto":
        weights += f" {config['kv_cache_dtype']} KV cache"
    moe = f", MoE {config['moe']}" if config["moe"] else ""
    rows = [("config", f"{config['preset']} {config['dtype']}{weights}, {config['frontend']}, "
                       f"{config['attention']}{moe}, {config['device']}"
                       + (f" x {config['tp']} (tp)" if config["tp"] > 1 else "")
                       + (", async scheduling" if config["async_scheduling"] else "")
                       + _sampling_text(config["sampling"])),
            ("tokens/s", f"{result['tokens_per_s']} ({result['generated_tokens']} tokens "
                         f"in {result['wall_s']} s, {result['steps_run']} steps)"),
            ("decode step", f"{result['decode_step_ms']} ms"),
            ("weights read", _weights_line(result["weights"], config["tp"])),
            ("KV cache read", _kv_cache_line(result["kv_cache"], config["tp"])),
            ("prefill", f"{result['prefill_tokens_per_s']} tokens/s"),
            ("matches_reference", str(result["matches_reference"]))]
    divergence = result["reference_check"].get("first_divergence")
    if divergence:
        rows.append(("first divergence", _divergence_line(divergence)))
    breakdown = result.get("breakdown")
    if breakdown:
        rows.append(("breakdown", f"device step {breakdown['decode_step_device_ms']} ms, "
                                  f"attention {breakdown['attention_ms']} ms "
                                  f"({breakdown['attention_share']:.0%})"))
        rows.append(("host", f"dispatch {breakdown['dispatch_ms']} ms; device step with a "
                             f"new batch each step {breakdown['decode_step_fresh_batch_ms']} ms"))
    for key in ("plot",):
        if key in result:
            rows.append((key, result[key]))
    if json_path:
        rows.append(("json", json_path))
    return rows


def _weights_line(read: dict[str, Any], tp: int) -> str:
    """What a step reads of the weights (serve-bench's ``weights`` record).

    Example:
        >>> _weights_line({"bytes_read_per_step": 3 * 2**20, "per_device": 2**21}, 2)
        '3.0 MiB per step (all but the embedding), 2.0 MiB per device'
    """
    line = f"{read['bytes_read_per_step'] / 2**20:.1f} MiB per step (all but the embedding)"
    return line + (f", {read['per_device'] / 2**20:.1f} MiB per device" if tp > 1 else "")


def _kv_cache_line(read: dict[str, Any], tp: int) -> str:
    """What a decode step reads of the KV cache (serve-bench's ``kv_cache`` record).

    Example:
        >>> _kv_cache_line({"dtype": "float8_e4m3fn", "bytes_per_token": 65536,
        ...                 "decode_bytes_read_per_step": 3 * 2**20, "per_device": 32768,
        ...                 "decode_bytes_read_per_step_per_device": 3 * 2**19}, 2)
        '3.0 MiB per decode step (median; float8_e4m3fn, 64.0 KiB per token), 1.5 MiB per device'
    """
    kind = f"{read['dtype']}, {read['bytes_per_token'] / 2**10:.1f} KiB per token"
    step = read["decode_bytes_read_per_step"]
    if step is None:
        return f"no decode step ({kind})"
    line = f"{step / 2**20:.1f} MiB per decode step (median; {kind})"
    return line + (f", {read['decode_bytes_read_per_step_per_device'] / 2**20:.1f} MiB per "
                   "device" if tp > 1 else "")


def _sampling_text(sampling: dict[str, Any]) -> str:
    """``, sampled (...)`` for a run that draws tokens, empty for a greedy one.

    Example:
        >>> _sampling_text({"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.0,
        ...                 "seed": 3})
        ', sampled (temperature 0.7, top-k 50, top-p 0.9, min-p 0, seed 3)'
    """
    if not sampling["temperature"] > 0:
        return ""
    return (f", sampled (temperature {sampling['temperature']:g}, top-k {sampling['top_k']}, "
            f"top-p {sampling['top_p']:g}, min-p {sampling['min_p']:g}, seed "
            f"{sampling['seed']})")


SERVE_BENCH_WHOLE_NUMBERS = ("requests", "prompt_len", "new_tokens", "arrival_every", "seed",
                             "block_size", "num_blocks", "max_num_seqs", "token_budget", "tp",
                             "top_k", "sampling_seed")
SERVE_BENCH_REALS = ("temperature", "top_p", "min_p")


def _reals(args: argparse.Namespace) -> dict[str, float]:
    """serve-bench's decimal options, parsed; a bad one is a one-line error naming it."""
    from xla_kernels.serving.options import parse_real

    return {name: parse_real("--" + name.replace("_", "-"), getattr(args, name))
            for name in SERVE_BENCH_REALS}


def _whole_numbers(args: argparse.Namespace) -> dict[str, int | None]:
    """serve-bench's whole-number options, parsed; a bad one is a one-line error naming it."""
    from xla_kernels.serving.options import parse_whole

    return {name: None if getattr(args, name) is None
            else parse_whole("--" + name.replace("_", "-"), getattr(args, name))
            for name in SERVE_BENCH_WHOLE_NUMBERS}


def _divergence_line(divergence: dict[str, Any]) -> str:
    """One line for serve-bench's first divergence from the reference.

    Example:
        >>> print(_divergence_line({"request": 3, "index": 9, "engine": 5, "reference": 7,
        ...                         "diverged_requests": 1, "engine_took_runner_up": True,
        ...                         "reference_margin": 2e-06, "margin_quantile": 0.0001}))
        ... # doctest: +NORMALIZE_WHITESPACE
        request 3, token 9: 5 instead of 7 (the runner-up, by a margin of 2e-06, smaller than
        99.99% of margins); 1 request(s) differ
    """
    line = (f"request {divergence['request']}, token {divergence['index']}: "
            f"{divergence['engine']} instead of {divergence['reference']}")
    if "reference_margin" in divergence:
        which = "the runner-up" if divergence["engine_took_runner_up"] else "not the runner-up"
        line += (f" ({which}, by a margin of {divergence['reference_margin']:.3g}, smaller than "
                 f"{1 - divergence['margin_quantile']:.2%} of margins)")
    return line + f"; {divergence['diverged_requests']} request(s) differ"


__all__ = ["ASYNC_DISPATCH_ENV", "add_parser", "async_dispatch_env", "options_of", "run",
           "summary"]
