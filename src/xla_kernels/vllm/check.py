"""Run ``vllm.LLM.generate`` through xla-kernels' attention and check its greedy tokens.

::

    python -m xla_kernels.vllm.check --model tiny --platform cpu --json out.json
    python -m xla_kernels.vllm.check --model smollm2 --model-impl vllm --json out.json
    python -m xla_kernels.vllm.check --model tiny-moe --platform cpu --json out.json
    python -m xla_kernels.vllm.check --model tiny --model-impl vllm --weights fp8 --json out.json

writes (and prints) ``{"tokens": ..., "reference_tokens": ..., "matches_transformers": ...,
"attention": {...}, ...}`` and exits 0 only if the model ran xla-kernels' attention and vLLM's
greedy tokens agree with Hugging Face transformers' (f32, same weights): equal, or, scored by
the reference on vLLM's own prefixes (:func:`reference.logit_deficits`), every token within
``--logit-tolerance`` of the best logit (default 0 for the model's dtype, so equal tokens;
:data:`LOGIT_TOLERANCE` for an fp8 cache). The model ran xla-kernels' attention when
:data:`xla_kernels.vllm.attention.TRACES` counts our ops in the traced model (the engine
runs in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``); for an MoE model
(:data:`models.MOE_MODELS`) also :data:`xla_kernels.vllm.moe.TRACES` must count
``fused_moe`` (``ran_xla_kernels_moe``); with ``--weights fp8`` or ``fp8-block`` (the
model's linear layers written as an fp8 checkpoint, :func:`models.fp8_weights`; transformers
then runs on the dequantized weights) also :data:`xla_kernels.vllm.fp8.TRACES` must count
``fp8_linear`` (``ran_xla_kernels_fp8_linear``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from . import models

# JAX_PLATFORMS per --platform. tpu-inference accepts only "", "tpu", "cpu" or "proxy" there,
# so the GPU is JAX's default backend (unset), checked once JAX is up.
PLATFORMS = {"cpu": "cpu", "gpu": ""}
MODEL_IMPLS = ("flax_nnx", "vllm")
DEFAULT_MODEL_IMPL = {"tiny-moe": "vllm", "tiny-moe-unnormalized": "vllm"}
"""``--model-impl`` when not given: flax_nnx, except where tpu-inference has no JAX-native
model for the architecture (Qwen3-MoE runs only as vLLM's PyTorch model)."""

DEFAULT_DTYPE = {False: "float32", True: "float16"}
"""vLLM's ``dtype`` (activations) when not given: f32 for the model's own weights, f16 for
fp8 ones (``--weights fp8*``): vLLM's Fp8Config takes bf16 or f16 only, and in bf16 the
tiny model's greedy tokens leave the f32 reference at near-ties (one of 48 steps took a token
0.026 logits below the best, where the reference's top two were 0.026 apart); in f16 they
were equal."""

LOGIT_TOLERANCE = {"auto": 0.0, "fp8": 0.1}
"""Default ``--logit-tolerance`` per ``--kv-cache-dtype``. With an fp8 cache, the GPU kernel
rounds softmax probabilities to bf16 before multiplying them with the values (as FlashAttention
does), which the reference does not model: on the tiny model (logits up to ~5.7) 2 of 48 steps
took a token 0.0097 and 0.0654 below the best logit, every other step the argmax
(docs/vllm.md). A wrong token sits on average several logits below (the test checks it)."""


def configure(platform: str, model_impl: str, tensor_parallel_size: int = 1) -> None:
    """The environment vLLM and tpu-inference read at import; must run before importing them."""
    if platform == "cpu" and tensor_parallel_size > 1:
        flag = f"--xla_force_host_platform_device_count={tensor_parallel_size}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    os.environ["JAX_PLATFORMS"] = PLATFORMS[platform]
    if not PLATFORMS[platform]:
        del os.environ["JAX_PLATFORMS"]
    os.environ["MODEL_IMPL_TYPE"] = model_impl
    # One process, so this process sees the engine's traces and its runner.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # tpu-inference logs the TPU's name and type at import, polling the GCE metadata
    # server for any it is not given; these keep it off the network.
    for name, value in {"TPU_NAME": "none", "TPU_ACCELERATOR_TYPE": "none",
                        "TPU_WORKER_ID": "0"}.items():
        os.environ.setdefault(name, value)


def run_vllm(model_dir: Path, prompts: list[list[int]], max_tokens: int, *,
             max_model_len: int, block_size: int | None, tokenizer: bool,
             tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto",
             dtype: str = "float32") -> dict:
    import vllm

    from . import attention, fp8, moe, patches

    kwargs = {"block_size": block_size} if block_size else {}
    start = time.perf_counter()
    llm = vllm.LLM(model=str(model_dir), dtype=dtype, max_model_len=max_model_len,
                   max_num_seqs=4, max_num_batched_tokens=max_model_len,
                   gpu_memory_utilization=0.5, seed=0, skip_tokenizer_init=not tokenizer,
                   tensor_parallel_size=tensor_parallel_size, kv_cache_dtype=kv_cache_dtype,
                   **kwargs)
    started = time.perf_counter() - start
    params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    generated = time.perf_counter() - start
    engine = llm.llm_engine
    runner = engine.model_executor.driver_worker.worker.model_runner
    import jax
    from vllm.platforms import current_platform

    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "text": [o.outputs[0].text for o in outputs],
        "platform": type(current_platform).__name__,
        "jax_backend": jax.default_backend(),
        "attention": {"backend": type(runner.attention_backend).__name__,
                      "traces": dict(attention.TRACES)},
        "moe": {"traces": dict(moe.TRACES)},
        "fp8_linear": {"traces": dict(fp8.TRACES)},
        "block_size": engine.vllm_config.cache_config.block_size,
        "patches": patches.applied(),
        "seconds": {"engine_start": round(started, 1), "generate": round(generated, 1)},
    }


def _check_weights(model: str, model_impl: str, weights: str) -> None:
    """Refuse, before anything is set up, an fp8 run that upstream cannot load."""
    if weights != "checkpoint" and model in models.MOE_MODELS:
        raise ValueError(f"xla_kernels.vllm.check: --weights {weights} quantizes the dense "
                         f"linear layers; {model}'s experts would be fp8 too, which the MoE "
                         "path refuses. Fix: --model tiny or smollm2")
    if weights != "checkpoint" and model_impl == "flax_nnx":
        if model not in models.FP8_JAX_MODELS:
            raise ValueError(f"xla_kernels.vllm.check: tpu-inference's JAX-native {model} "
                             "(Llama) reads safetensors through NumPy, which has no e4m3 "
                             "dtype (AttributeError at load). Fix: --model-impl vllm, or "
                             f"--model {' or '.join(models.FP8_JAX_MODELS)}")
        if models.FP8_WEIGHTS[weights].scales == "tensor":
            raise ValueError("xla_kernels.vllm.check: tpu-inference's JAX-native fp8 layers "
                             "take one scale per output channel, not a per-tensor checkpoint's "
                             "(RuntimeError at load). Fix: --weights fp8-block, or "
                             "--model-impl vllm")


def check(model: str, platform: str, model_impl: str, max_tokens: int, *,
          max_model_len: int = 1024, block_size: int | None = None,
          tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto",
          logit_tolerance: float | None = None, weights: str = "checkpoint",
          dtype: str | None = None) -> dict:
    _check_weights(model, model_impl, weights)
    if logit_tolerance is None:
        logit_tolerance = LOGIT_TOLERANCE[kv_cache_dtype]
    configure(platform, model_impl, tensor_parallel_size)
    from . import platform as vllm_platform
    from . import reference

    problem = vllm_platform.plugin_problem()
    if problem:  # the engine runs in this process: select our platform by hand
        print(f"xla_kernels.vllm.check: {problem.split(': ', 1)[0]}; "
              "this check calls xla_kernels.vllm.activate()", file=sys.stderr)
        vllm_platform.activate()

    dtype = dtype or DEFAULT_DTYPE[weights != "checkpoint"]
    with tempfile.TemporaryDirectory(prefix=f"xk-vllm-{model}-") as tmp:
        kwargs = models.FP8_MODEL_KWARGS.get(model, {}) if weights != "checkpoint" else {}
        checkpoint = models.MODELS[model](Path(tmp) / "model", **kwargs)
        if weights != "checkpoint":
            checkpoint = models.fp8_weights(checkpoint, Path(tmp), models.FP8_WEIGHTS[weights])
        ref_path = checkpoint.reference_path or checkpoint.path
        start = time.perf_counter()
        ref_model = reference.load(ref_path, kv_cache_dtype)
        ref_tokens, margins = reference.greedy_tokens(ref_path,
                                                      checkpoint.prompt_token_ids, max_tokens,
                                                      kv_cache_dtype=kv_cache_dtype,
                                                      model=ref_model)
        ref_seconds = time.perf_counter() - start
        result = run_vllm(checkpoint.path, checkpoint.prompt_token_ids, max_tokens,
                          max_model_len=max_model_len, block_size=block_size,
                          tokenizer=checkpoint.prompts is not None,
                          tensor_parallel_size=tensor_parallel_size,
                          kv_cache_dtype=kv_cache_dtype, dtype=dtype)
        deficits = reference.logit_deficits(ref_path, checkpoint.prompt_token_ids,
                                            result["tokens"], kv_cache_dtype=kv_cache_dtype,
                                            model=ref_model)
        del ref_model
    worst = max((d for row in deficits for d in row), default=0.0)
    traces = result["attention"]["traces"]
    ours = (traces.get("attend", 0) > 0 and traces.get("ragged_paged_attention", 0) > 0
            and result["jax_backend"] == platform)
    ran_moe = result["moe"]["traces"].get("fused_moe", 0) > 0
    ran_fp8 = result["fp8_linear"]["traces"].get("fp8_linear", 0) > 0
    result["seconds"]["transformers"] = round(ref_seconds, 1)
    return {
        "model": model, "platform": platform, "model_impl": model_impl,
        "tensor_parallel_size": tensor_parallel_size, "kv_cache_dtype": kv_cache_dtype,
        "weights": weights, "dtype": dtype,
        "prompts": checkpoint.prompts or checkpoint.prompt_token_ids,
        "max_tokens": max_tokens,
        "matches_transformers": result["tokens"] == ref_tokens,
        "agrees_with_transformers": worst <= logit_tolerance,
        "logit_tolerance": logit_tolerance,
        "max_logit_deficit": worst,
        "steps_off_argmax": sum(d > 0 for row in deficits for d in row),
        "ran_xla_kernels_attention": ours,
        "ran_xla_kernels_moe": ran_moe if model in models.MOE_MODELS else None,
        "ran_xla_kernels_fp8_linear": ran_fp8 if weights != "checkpoint" else None,
        "reference_tokens": ref_tokens,
        "reference_min_top2_logit_gap": margins,
        **result,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xla_kernels.vllm.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=tuple(models.MODELS), default="tiny")
    parser.add_argument("--platform", choices=tuple(PLATFORMS), default="cpu")
    parser.add_argument("--model-impl", choices=MODEL_IMPLS, default=None,
                        help="tpu-inference's JAX-native model (flax_nnx) or vLLM's PyTorch "
                             "model through torchax (vllm); default flax_nnx, for "
                             + ", ".join(f"{m} {i}" for m, i in DEFAULT_MODEL_IMPL.items()))
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=1024,
                        help="tpu-inference picks the page size from it (1024: 64)")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="devices the model's heads are split over (on the CPU, that "
                             "many host devices are made)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"),
                        help="fp8: an e4m3 cache (the reference then reads keys and values "
                             "rounded to e4m3 too)")
    parser.add_argument("--logit-tolerance", type=float, default=None,
                        help="how far below the reference's best logit (on vLLM's own prefix) a "
                             "token may be; default per --kv-cache-dtype: "
                             + ", ".join(f"{k} {v}" for k, v in LOGIT_TOLERANCE.items()))
    parser.add_argument("--weights", default="checkpoint",
                        choices=("checkpoint", *models.FP8_WEIGHTS),
                        help="fp8: the model's linear layers written as an fp8 checkpoint "
                             "(e4m3, one scale per weight), fp8-block: with 128x128 block "
                             "scales, fp8-channel: one scale per output channel, in the "
                             "compressed-tensors format (llm-compressor's FP8_DYNAMIC); vLLM "
                             "then runs in f16 (--dtype), transformers in f32 on the "
                             "dequantized weights")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="vLLM's activation dtype; default float32, float16 with fp8 "
                             "weights")
    parser.add_argument("--json", type=Path, help="write the result here too")
    args = parser.parse_args(argv)
    model_impl = args.model_impl or DEFAULT_MODEL_IMPL.get(args.model, "flax_nnx")
    result = check(args.model, args.platform, model_impl, args.max_tokens,
                   max_model_len=args.max_model_len, block_size=args.block_size,
                   tensor_parallel_size=args.tensor_parallel_size,
                   kv_cache_dtype=args.kv_cache_dtype, logit_tolerance=args.logit_tolerance,
                   weights=args.weights, dtype=args.dtype)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    ok = ((result["matches_transformers"] or result["agrees_with_transformers"])
          and result["ran_xla_kernels_attention"] and result["ran_xla_kernels_moe"] is not False
          and result["ran_xla_kernels_fp8_linear"] is not False)
    print(f"xla_kernels.vllm.check: {args.model} ({model_impl}) on {args.platform}: "
          f"{'OK' if ok else 'FAILED'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
