"""Serving latency of ``vllm serve`` on xla-kernels (``xla_kernels.vllm``): a request-rate
sweep of streamed OpenAI completions, like ``vllm bench serve``.

Starts ``vllm serve MODEL`` (vLLM's OpenAI server and its spawned EngineCore; our platform
through the installed package's entry points) or attaches to one (``--url``), waits for
``/health``, sends ``--warmup`` requests, then for each rate of ``--rates`` sends
``--num-requests`` streaming ``/v1/completions`` requests through ``httpx``: arrivals are a
Poisson process at that rate (exponential gaps from ``random.Random(--seed)``), ``inf`` sends
them all at once. Each prompt is ``--input-len`` random token ids; each request asks for
``--output-len`` tokens with ``ignore_eos`` (so every request generates exactly that many),
greedy. The server runs with ``--skip-tokenizer-init``: token ids in, token ids out
(``return_token_ids``), so a model needs no tokenizer and ``--model 8b`` can be vLLM's dummy
weights at Llama-3-8B's shape.

Definitions (those of vLLM's ``vllm bench serve``, ``vllm/benchmarks/lib/
endpoint_request_func.py`` and ``serve.py``, re-implemented here):

- TTFT: from sending the request to the first streamed chunk that carries a token.
- ITL: the gap between consecutive token-carrying chunks; p50/p99 over the gaps of all
  requests of a rate pooled. vLLM records one gap per chunk; a chunk that carries k > 1
  tokens (the server merges outputs when the client lags) is recorded here as k gaps of
  gap/k, so each request has exactly output_tokens - 1 gaps and they sum to e2e - TTFT, as
  vLLM's do. ``chunks_with_several_tokens`` counts how often that happened.
- e2e: from sending the request to its last token-carrying chunk.
- request throughput and output tokens/s: completed requests and generated tokens over the
  rate's duration (first request sent to last request finished).

Writes ``vllm_latency.json`` (settings, per-rate summary, per-request records) and
``vllm_latency.md`` (the table) to ``--out``.

Example:
    $ python benchmarks/vllm_latency.py --model tiny --out OUT --rates 2 inf \\
        --num-requests 8 --input-len 32 --output-len 16
    $ python benchmarks/vllm_latency.py --model 8b --out OUT      # Llama-3-8B shape, dummy
    $ python benchmarks/vllm_latency.py --url http://127.0.0.1:8000 --model-name M --out OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PERCENTILES = (50, 99)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile by linear interpolation between order statistics (NumPy's
    default method); None for no values.

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
        2.5
        >>> percentile([5.0], 99)
        5.0
    """
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Send times (s from the start) of ``n`` requests: a Poisson process at ``rate``
    requests/s (the first at 0), or all at 0 for ``rate = inf``.

    Example:
        >>> arrival_offsets(3, float("inf"), 0)
        [0.0, 0.0, 0.0]
        >>> offsets = arrival_offsets(1000, 10.0, 0)
        >>> offsets[0], round(offsets[-1] / 999, 2)
        (0.0, 0.1)
    """
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        offsets.append(t)
    return offsets


def token_intervals(start: float, arrivals: list[tuple[float, int]]) -> dict:
    """A request's TTFT, ITLs and e2e from its token-carrying chunks ``(time, tokens)``
    (see the module's definitions).

    Example:
        >>> r = token_intervals(0.0, [(1.0, 1), (1.5, 1), (2.5, 2)])
        >>> r["ttft_s"], r["itl_s"], r["e2e_s"], r["output_tokens"]
        (1.0, [0.5, 0.5, 0.5], 2.5, 4)
    """
    first_time, first_tokens = arrivals[0]
    itl = [0.0] * (first_tokens - 1)
    previous = first_time
    for when, tokens in arrivals[1:]:
        itl += [(when - previous) / tokens] * tokens
        previous = when
    return {"ttft_s": first_time - start, "itl_s": itl, "e2e_s": previous - start,
            "output_tokens": sum(tokens for _, tokens in arrivals),
            "chunks_with_several_tokens": sum(tokens > 1 for _, tokens in arrivals)}


def summarize(rate: float, duration: float, records: list[dict]) -> dict:
    """One rate's row: counts, throughputs and p50/p99 of TTFT, ITL and e2e (ms)."""
    done = [r for r in records if r["ok"]]
    tokens = sum(r["output_tokens"] for r in done)
    row = {"rate": "inf" if math.isinf(rate) else rate, "requests": len(records),
           "completed": len(done), "failed": len(records) - len(done),
           "duration_s": round(duration, 3),
           "request_throughput": round(len(done) / duration, 3) if duration else None,
           "output_tokens": tokens,
           "output_tokens_per_s": round(tokens / duration, 2) if duration else None,
           "chunks_with_several_tokens": sum(r["chunks_with_several_tokens"] for r in done)}
    series = {"ttft": [r["ttft_s"] for r in done], "e2e": [r["e2e_s"] for r in done],
              "itl": [gap for r in done for gap in r["itl_s"]]}
    for name, values in series.items():
        for q in PERCENTILES:
            value = percentile(values, q)
            row[f"{name}_p{q}_ms"] = None if value is None else round(value * 1e3, 3)
    return row


async def one_request(client, url: str, body: dict, start_at: float) -> dict:
    """Sends one streamed completion at ``start_at`` (perf_counter) and times its chunks."""
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    start = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return {"ok": False, "error": f"HTTP {response.status_code}: {text[:300]}"}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                choices = json.loads(line[len("data: "):]).get("choices") or []
                tokens = sum(len(c.get("token_ids") or []) for c in choices)
                if tokens:
                    arrivals.append((now, tokens))
    except Exception as e:  # recorded per request: a failed request is a result too
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    if not arrivals:
        return {"ok": False, "error": "no chunk carried a token"}
    return {"ok": True, **token_intervals(start, arrivals)}


async def run_rate(base_url: str, model: str, prompts: list[list[int]], output_len: int,
                   rate: float, seed: int) -> tuple[float, list[dict]]:
    import httpx

    body = {"model": model, "max_tokens": output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    offsets = arrival_offsets(len(prompts), rate, seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        begin = time.perf_counter()
        records = await asyncio.gather(*(
            one_request(client, f"{base_url}/v1/completions", {**body, "prompt": p},
                        begin + offset) for p, offset in zip(prompts, offsets, strict=True)))
        duration = time.perf_counter() - begin
    return duration, list(records)


def write_model(kind: str, directory: Path) -> dict:
    """The model for ``--model tiny`` (the check's 2-layer Llama, f32) or ``8b``
    (Llama-3-8B's config, vLLM's dummy weights, bf16): its folder and serve options."""
    if kind == "tiny":
        from xla_kernels.vllm.models import tiny_llama

        tiny_llama(directory, seed=0)
        return {"name": "tiny Llama (2 layers, seeded random weights)", "dtype": "float32",
                "options": []}
    from vllm_throughput import LLAMA3_8B

    (directory / "config.json").write_text(json.dumps(LLAMA3_8B))
    return {"name": "Llama-3-8B dimensions, load_format=dummy", "dtype": "bfloat16",
            "options": ["--load-format", "dummy"]}


def served_platform() -> str:
    """Which platform the server's vLLM will select: ours where the installed package
    declares the entry point and no TPU is seen (vLLM does not log the platform's name)."""
    from xla_kernels.vllm import platform

    problem = platform.plugin_problem()
    if problem or not platform.active():
        return f"not xla-kernels' ({problem or 'a TPU is seen, or XLA_KERNELS_VLLM=0'})"
    return "xla_kernels.vllm (XlaKernelsPlatform)"


def memory_lines(server_log: str) -> list[str]:
    """The engine's KV cache sizing, as tpu-inference logs it (its budget and the cache)."""
    keys = ("Memory statistics", "KV cache size", "num_blocks=")
    return [line.split("] ", 1)[-1] for line in server_log.splitlines()
            if any(k in line for k in keys)]


STARTUP_KEYS = ("took", "Precompile all", "Warm-up call pass finished", "Enabling JAX compile",
                "Starting vLLM API server", "Application startup complete")
COMPILATION = re.compile(r"Compilation of .* finished in ([\d.]+) \[secs\]")
LOG_TIME = re.compile(r"\d\d-\d\d (\d\d:\d\d:\d\d)")


def startup_lines(server_log: str) -> dict:
    """Where the server's start-up went, from its log: the phase lines vLLM and tpu-inference
    write (``... took X s``, the precompile's start and warm-up, the API server's start), each
    as ``HH:MM:SS message``, and the count and summed time of tpu-inference's per-program
    ``Compilation of NAME finished in X [secs]`` lines (a program loaded from the persistent
    cache is logged the same way, with its load time), up to the API server's "Application
    startup complete" (what the log says after it belongs to the benchmark)."""
    phases, seconds = [], []
    for line in server_log.splitlines():
        if m := COMPILATION.search(line):
            seconds.append(float(m.group(1)))
        elif any(k in line for k in STARTUP_KEYS):
            stamp = LOG_TIME.search(line)
            phases.append(((stamp.group(1) + " ") if stamp else "") + line.split("] ", 1)[-1])
            if "Application startup complete" in line:
                break
    return {"phases": phases, "compilations": len(seconds),
            "compilation_s": round(sum(seconds), 2)}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# vLLM serving latency: {s['model']}", "",
             f"`vllm serve` on {s['platform']}; dtype {s['dtype']}, max_num_seqs "
             f"{s['max_num_seqs']}, max_model_len {s['max_model_len']}, "
             f"gpu_memory_utilization {s['gpu_memory_utilization']}; {s['num_requests']} "
             f"requests per rate, {s['input_len']} random prompt tokens, {s['output_len']} "
             f"output tokens (ignore_eos), greedy, Poisson arrivals (seed {s['seed']}).", "",
             "| rate (req/s) | completed | req/s | output tok/s | TTFT p50 | TTFT p99 | "
             "ITL p50 | ITL p99 | e2e p50 | e2e p99 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result.get("rates", []):
        lines.append(f"| {r['rate']} | {r['completed']}/{r['requests']} | "
                     f"{r['request_throughput']} | {r['output_tokens_per_s']} | "
                     + " | ".join(f"{r[f'{m}_p{q}_ms']} ms" for m in ("ttft", "itl", "e2e")
                                  for q in PERCENTILES) + " |")
    if s.get("server_memory"):
        lines += ["", "The engine's KV cache sizing (its log):", "",
                  *(f"- `{line}`" for line in s["server_memory"])]
    if start := s.get("server_startup"):
        lines += ["", f"Start-up ({result.get('startup_s', '?')} s until the server was "
                  f"healthy; its log): {start['compilations']} programs compiled or loaded "
                  f"from the cache in {start['compilation_s']} s together; the phases:", "",
                  *(f"- `{line}`" for line in start["phases"])]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tiny",
                        help="tiny, 8b, or a model folder (served with --skip-tokenizer-init)")
    parser.add_argument("--url", default=None,
                        help="attach to this running server instead of starting one (its "
                             "settings below are then recorded as given, not checked)")
    parser.add_argument("--model-name", default=None,
                        help="the served model's name (with --url; default: the server's "
                             "first model)")
    parser.add_argument("--rates", nargs="+", type=float, default=[1, 4, 16, math.inf],
                        help="request rates (requests/s) to sweep; inf: all at once")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2, help="requests before the sweep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="prompt ids are drawn below this (default: the model's)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="default: input-len + output-len")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="passed to vllm serve when given; default: vLLM's own (0.9)")
    parser.add_argument("--port", type=int, default=8777)
    parser.add_argument("--startup-timeout", type=float, default=600)
    args = parser.parse_args()
    for name, value in {"TPU_NAME": "none", "TPU_ACCELERATOR_TYPE": "none",
                        "TPU_WORKER_ID": "0"}.items():
        os.environ.setdefault(name, value)
    args.out.mkdir(parents=True, exist_ok=True)
    max_model_len = args.max_model_len or args.input_len + args.output_len
    settings = {"model": args.model, "dtype": None, "max_num_seqs": args.max_num_seqs,
                "max_model_len": max_model_len,
                "gpu_memory_utilization": args.gpu_memory_utilization or 0.9,
                "gpu_memory_utilization_passed": args.gpu_memory_utilization is not None,
                "platform": None, "num_requests": args.num_requests,
                "input_len": args.input_len, "output_len": args.output_len,
                "seed": args.seed, "warmup": args.warmup, "rates": args.rates}
    server = log = None
    vocab = args.vocab_size
    if args.url:
        base_url = args.url.rstrip("/")
        settings["platform"] = "as served at " + base_url + " (not checked)"
        model_name = args.model_name
    else:
        base_url = f"http://127.0.0.1:{args.port}"
        folder = Path(args.model)
        served = {"name": str(folder), "dtype": "auto", "options": []}
        if args.model in ("tiny", "8b"):
            folder = Path(tempfile.mkdtemp(prefix=f"xk-latency-{args.model}-"))
            served = write_model(args.model, folder)
        vocab = vocab or json.loads((folder / "config.json").read_text())["vocab_size"]
        settings.update(model=served["name"], dtype=served["dtype"])
        model_name = str(folder)
        command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(folder),
                   "--dtype", served["dtype"], "--max-model-len", str(max_model_len),
                   "--max-num-seqs", str(args.max_num_seqs), "--port", str(args.port),
                   "--seed", "0", "--skip-tokenizer-init", *served["options"]]
        if args.gpu_memory_utilization is not None:
            command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
        settings["command"] = command[2:]
        settings["platform"] = served_platform()
        log = open(args.out / "vllm_latency_server.log", "w")  # noqa: SIM115 (the server's life)
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                  env=os.environ.copy())
    result: dict = {"benchmark": "benchmarks/vllm_latency.py", "settings": settings}
    from vllm_serve import stop_server, wait_healthy  # benchmarks/, first on sys.path

    try:
        result["startup_s"] = round(wait_healthy(base_url, server, args.startup_timeout), 1)
        if model_name is None:
            with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as r:
                model_name = json.load(r)["data"][0]["id"]
        if vocab is None:
            raise SystemExit("vllm_latency: --url needs --vocab-size (the prompts' id range)")
        rng = random.Random(args.seed)
        # Ids from 10 up: clear of the usual special tokens (BOS, EOS, padding).
        prompts = [[rng.randrange(10, vocab) for _ in range(args.input_len)]
                   for _ in range(args.num_requests)]
        if args.warmup:
            asyncio.run(run_rate(base_url, model_name, prompts[:args.warmup],
                                 args.output_len, math.inf, args.seed))
        rows, requests = [], {}
        for rate in args.rates:
            duration, records = asyncio.run(run_rate(base_url, model_name, prompts,
                                                     args.output_len, rate, args.seed))
            rows.append(summarize(rate, duration, records))
            requests[str(rows[-1]["rate"])] = records
            print(json.dumps(rows[-1]), flush=True)
        result["rates"], result["requests"] = rows, requests
    finally:
        if server is not None:
            stop_server(server, log)
            text = (args.out / "vllm_latency_server.log").read_text(errors="replace")
            settings["server_memory"] = memory_lines(text)
            settings["server_startup"] = startup_lines(text)
        (args.out / "vllm_latency.json").write_text(json.dumps(result, indent=1) + "\n")
        # Also when the server never became healthy: the md then says where its start went.
        (args.out / "vllm_latency.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(r["failed"] == 0 for r in result["rates"]) else 1


if __name__ == "__main__":
    sys.exit(main())
