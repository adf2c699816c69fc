"""One profiled call each of fp8_linear, fused_moe, sample and their XLA peers, for Nsight tools.

Each case builds its data with the benchmark scripts' own helpers (``fp8_linear.py``,
``moe.py``), compiles and warms up all its variants, then runs each once between
``cuProfilerStart`` and ``cuProfilerStop``. Run it under ``ncu --profile-from-start off``
(only those calls' kernels are profiled) or ``nsys profile --capture-range=cudaProfilerApi``.

Cases:

* ``fp8_linear``: Llama-3-8B's gate/up projection (14336 x 4096, e4m3, per-channel scales)
  at 1 and 64 tokens: ours W8A16 (``ours``) and W8A8 (``ours_w8a8``), XLA's fp8 dot
  (``xla_fp8``, dynamic activation scales) and dequantize + bf16 dot (``dequant_bf16``).
* ``moe``: one expert layer of Mixtral-8x7B and Qwen3-30B-A3B (bf16) at 1 and 64 tokens
  (decode) and 4096 (prefill): ours (``fused_moe``) and the ragged_dot MoE.
* ``sampling``: ``sample`` on 128256-token f32 rows at batch 16, 64 and 256, top-k 50 +
  top-p 0.9 and plain temperature sampling (``benchmarks/sampling.py``'s settings).

``--smoke`` runs the tiny shapes of those scripts on any device, without the profiler (a
check of this script).

Example (on the GPU machine):
    $ ncu --profile-from-start off --set full -o fp8 \\
        python benchmarks/profile_ops.py --cases fp8_linear
"""

from __future__ import annotations

import argparse
import ctypes
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from xla_kernels.bench import load_script

HERE = Path(__file__).parent
FP8_SHAPE = "gate_up"
FP8_TOKENS = (1, 64)
FP8_PEERS = ("ours", "ours_w8a8", "xla_fp8", "dequant_bf16")
MOE_MODELS = ("mixtral", "qwen3")
MOE_TOKENS = (1, 64, 4096)
MOE_PEERS = ("ours", "ragged_dot")
SAMPLING_VOCAB = 128256
SAMPLING_BATCHES = (16, 64, 256)
SAMPLING_SETTINGS = {"k50_p0.9": (50, 0.9), "plain": (0, 1.0)}


def fp8_linear_calls(smoke: bool) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(label, call) of every fp8_linear variant at every token count."""
    fb = load_script(HERE / "fp8_linear.py")
    shape = "tiny" if smoke else FP8_SHAPE
    out, k = fb.SHAPES[shape]
    w = jax.random.normal(jax.random.PRNGKey(0), (out, k), jnp.bfloat16) / k ** 0.5
    q, s = fb.quantize(w, fb.SCALES["channel"])
    for tokens in (1, 4) if smoke else FP8_TOKENS:
        x = jax.random.normal(jax.random.PRNGKey(tokens), (tokens, k), jnp.bfloat16)
        for peer in FP8_PEERS:
            fn = jax.jit(fb.op_of(peer, fb.SCALES["channel"]))
            yield f"{peer} {shape} {tokens} tokens", lambda fn=fn, x=x: fn(x, q, s)


def moe_calls(smoke: bool, tokens_list: tuple[int, ...] = MOE_TOKENS,
              peers: tuple[str, ...] = MOE_PEERS) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(label, call) of every MoE variant at every model and token count."""
    mb = load_script(HERE / "moe.py")
    for model in ("tiny",) if smoke else MOE_MODELS:
        experts, top_k, hidden, _ = mb.MODELS[model]
        w = mb.weights(model, fp8=False)
        for tokens in (1, 4) if smoke else tokens_list:
            kx, kr = jax.random.split(jax.random.PRNGKey(tokens))
            x = jax.random.normal(kx, (tokens, hidden), jnp.bfloat16)
            logits = jax.random.normal(kr, (tokens, experts), jnp.float32)
            for peer in peers:
                fn = mb.layer(peer, False, top_k)
                yield (f"{peer} {model} {tokens} tokens",
                       lambda fn=fn, x=x, r=logits, w=w: fn(x, r, w["w13"], w["w2"]))


def sampling_calls(smoke: bool) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(label, call) of ``sample`` at every batch and setting."""
    from xla_kernels.kernels.sampling import sample

    vocab = 4096 if smoke else SAMPLING_VOCAB
    fn = jax.jit(sample)
    for batch in (2,) if smoke else SAMPLING_BATCHES:
        logits = 2 * jax.random.normal(jax.random.PRNGKey(batch), (batch, vocab), jnp.float32)
        for setting, (top_k, top_p) in SAMPLING_SETTINGS.items():
            args = (logits, jnp.ones(batch), jnp.full(batch, top_k, jnp.int32),
                    jnp.full(batch, top_p), jnp.zeros(batch), jnp.arange(batch, dtype=jnp.uint32),
                    jnp.zeros(batch, jnp.int32))
            yield f"sample {setting} f32 batch {batch}", lambda args=args: fn(*args)


CASES = {"fp8_linear": fp8_linear_calls, "moe": moe_calls, "sampling": sampling_calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, no profiler (runs on the CPU)")
    parser.add_argument("--moe-tokens", nargs="+", type=int, default=list(MOE_TOKENS),
                        help="token counts of the moe case")
    parser.add_argument("--moe-peers", nargs="+", choices=MOE_PEERS, default=list(MOE_PEERS),
                        help="the moe case's variants (ours alone: a shorter profile)")
    args = parser.parse_args()
    cases = {**CASES, "moe": partial(moe_calls, tokens_list=tuple(args.moe_tokens),
                                     peers=tuple(args.moe_peers))}
    cuda = None if args.smoke else ctypes.CDLL("libcuda.so.1")
    for case in args.cases:
        calls = list(cases[case](args.smoke))
        # Every variant is compiled (and XLA's GEMMs autotuned) before the first profiled
        # call: an XLA autotuning run after a profiled range crashed under ncu.
        for _, call in calls:
            jax.block_until_ready(call())
            jax.block_until_ready(call())
        for label, call in calls:
            if cuda is not None:
                cuda.cuProfilerStart()
            jax.block_until_ready(call())
            if cuda is not None:
                cuda.cuProfilerStop()
            print(f"profiled {label}", flush=True)


if __name__ == "__main__":
    main()
