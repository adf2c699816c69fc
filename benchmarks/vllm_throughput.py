"""vLLM's own engine on XLA:GPU through xla-kernels (``xla_kernels.vllm``): decode throughput
at Llama-3-8B's shape, to compare with ``xla-kernels serve-bench --preset 8b`` on the same
workload.

The model: Llama-3-8B's dimensions (32 layers, hidden 4096, 32 q / 8 kv heads, head_dim 128,
intermediate 14336, vocab 128256) with vLLM's dummy weights (``load_format="dummy"``: no
checkpoint), bf16. The workload: ``--requests`` prompts of ``--prompt-len`` random token ids,
``--new-tokens`` greedy tokens each (``ignore_eos``), all submitted at once; vLLM's engine
with ``max_num_seqs = requests`` and ``max_num_batched_tokens = --token-budget`` (serve-bench's
defaults: 64, 2000, 256, 2048).

Decode throughput is measured as two runs of the same batch: one with 1 new token (the
prefills and the first token) and one with ``new_tokens``; decode tokens/s = requests *
(new_tokens - 1) / (t_full - t_first). Both runs follow a warm-up run, so no step compiles
(tpu-inference compiles its buckets at start-up; the warm-up catches the rest).

``--kernel-trace`` then runs the two once more under torch.profiler (CUPTI records every
kernel in the process, XLA's included): each device's busy time (the union of its kernel,
memset and copy intervals) in the 1-token and the full run gives the decode step's device
time, ``(busy(full) - busy(first)) / (new_tokens - 1)``, and its host share,
``1 - device / wall`` against the untraced runs' step.

Writes ``vllm_throughput.json`` to ``--out``.

Example:
    $ python benchmarks/vllm_throughput.py --out OUT
    $ python benchmarks/vllm_throughput.py --out OUT --tensor-parallel-size 2
    $ python benchmarks/vllm_throughput.py --out OUT --kernel-trace
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 128000, "eos_token_id": 128001,
}


def busy_us(events: list[dict]) -> dict[str, float]:
    """Per device, the union of the events' intervals (µs): overlapping work counts once.

    Example:
        >>> busy_us([{"ts": 0, "dur": 5, "args": {"device": 0}},
        ...          {"ts": 3, "dur": 4, "args": {"device": 0}},
        ...          {"ts": 20, "dur": 1, "args": {"device": 0}},
        ...          {"ts": 0, "dur": 2, "args": {"device": 1}}])
        {'0': 8.0, '1': 2.0}
    """
    by_device: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        device = str(e.get("args", {}).get("device", 0))
        by_device.setdefault(device, []).append((float(e["ts"]), float(e["ts"] + e["dur"])))
    busy = {}
    for device, spans in sorted(by_device.items()):
        total, reach = 0.0, float("-inf")
        for start, end in sorted(spans):
            start = max(start, reach)
            if end > start:
                total += end - start
                reach = end
        busy[device] = total
    return busy


def device_step(run, new_tokens: int, wall_step_ms: float) -> dict:
    """The decode step's device time per device and host share: ``run(n)`` (a generate of
    ``n`` tokens per request) traced for 1 and ``new_tokens`` tokens."""
    from decode_trace import record

    busy = {n: busy_us(record(lambda n=n: run(n))) for n in (1, new_tokens)}
    per_device = {}
    for device in busy[new_tokens]:
        step_ms = (busy[new_tokens][device] - busy[1].get(device, 0.0)) / (new_tokens - 1) / 1e3
        per_device[device] = {"busy_ms": {"first": round(busy[1].get(device, 0.0) / 1e3, 3),
                                          "full": round(busy[new_tokens][device] / 1e3, 3)},
                              "device_step_ms": round(step_ms, 3),
                              "host_share": round(1 - step_ms / wall_step_ms, 4)}
    return {"method": "torch.profiler CUDA activity (CUPTI), busy = union of kernel, memset "
                      "and copy intervals per device; wall step from the untraced runs",
            "wall_step_ms": wall_step_ms, "devices": per_device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--token-budget", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=None,
                        help="vLLM's page size (default: tpu-inference's choice)")
    parser.add_argument("--memory-fraction", type=float, default=0.85)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    parser.add_argument("--kernel-trace", action="store_true",
                        help="also measure the decode step's device time and host share "
                             "(torch.profiler's CUDA activity, after the timed runs)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for name, value in {"TPU_NAME": "none", "TPU_ACCELERATOR_TYPE": "none",
                        "TPU_WORKER_ID": "0"}.items():
        os.environ.setdefault(name, value)
    import numpy as np

    import vllm
    from xla_kernels.vllm import attention

    model_dir = Path(tempfile.mkdtemp(prefix="xk-llama3-8b-"))
    (model_dir / "config.json").write_text(json.dumps(LLAMA3_8B))
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(1000, 100000, args.prompt_len).tolist()}
               for _ in range(args.requests)]
    kwargs = {"block_size": args.block_size} if args.block_size else {}
    start = time.perf_counter()
    llm = vllm.LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16",
                   skip_tokenizer_init=True, max_model_len=args.prompt_len + args.new_tokens,
                   max_num_seqs=args.requests, max_num_batched_tokens=args.token_budget,
                   gpu_memory_utilization=args.memory_fraction, seed=0,
                   tensor_parallel_size=args.tensor_parallel_size,
                   kv_cache_dtype=args.kv_cache_dtype, **kwargs)
    engine_start = time.perf_counter() - start

    def timed(new_tokens: int) -> tuple[float, list]:
        params = vllm.SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        begin = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - begin, outputs

    warm_s, _ = timed(args.new_tokens)
    first_s, _ = timed(1)
    full_s, outputs = timed(args.new_tokens)
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    decode_tokens = args.requests * (args.new_tokens - 1)
    engine = llm.llm_engine
    from vllm.platforms import current_platform

    result = {
        "engine": "vllm.LLM (vllm-tpu 0.32.0 + tpu-inference 0.32.0) on xla_kernels.vllm",
        "platform": type(current_platform).__name__,
        "device": current_platform.get_device_name(0),
        "model": "Llama-3-8B dimensions, load_format=dummy, bf16",
        "tensor_parallel_size": args.tensor_parallel_size,
        "kv_cache_dtype": args.kv_cache_dtype,
        "requests": args.requests, "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, "token_budget": args.token_budget,
        "block_size": engine.vllm_config.cache_config.block_size,
        "num_gpu_blocks": engine.vllm_config.cache_config.num_gpu_blocks,
        "async_scheduling": bool(getattr(engine.vllm_config.scheduler_config,
                                         "async_scheduling", False)),
        "generated_tokens": generated,
        "seconds": {"engine_start": round(engine_start, 2), "warm_up": round(warm_s, 3),
                    "first_token_run": round(first_s, 3), "full_run": round(full_s, 3)},
        "decode_tokens_per_s": round(decode_tokens / (full_s - first_s), 1),
        "decode_step_ms": round((full_s - first_s) / (args.new_tokens - 1) * 1e3, 3),
        "tokens_per_s": round(generated / full_s, 1),
        "attention_traces": dict(attention.TRACES),
        "runtime_env": {name: os.environ.get(name) for name in
                        ("PJRT_GPU_ENABLE_ASYNC_DISPATCH", "XLA_FLAGS",
                         "XLA_PYTHON_CLIENT_PREALLOCATE")},
    }
    if args.kernel_trace:
        result["device_step"] = device_step(lambda n: timed(n), args.new_tokens,
                                            result["decode_step_ms"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm_throughput.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
