"""What a serving run is made of: the model's shape (presets), the engine's limits, the
workload, and the names the command line accepts.

Example:
    >>> model = preset("tiny")
    >>> model.num_layers, model.num_q_heads, model.num_kv_heads, model.head_dim, model.dtype
    (2, 4, 2, 64, 'float32')
    >>> round(preset("1b").num_params() / 1e9, 2)
    1.02
    >>> try:
    ...     preset("7b")
    ... except ServingConfigError as e:
    ...     print(e)
    unknown preset '7b'. Fix: pass --preset tiny, 1b, 8b, tiny-moe or moe.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from xla_kernels.errors import XlaKernelsError

FRONTENDS = ("jax", "torchax")
"""Who writes the model: the JAX functions of ``model_jax`` or the torch modules of
``model_torch`` run through torchax."""

ATTENTIONS = ("xla-kernels", "plain-xla")
"""The paged attention implementation: the library's custom calls (``reshape_and_cache``,
``ragged_paged_attention``) or their plain-XLA fallbacks (``*_xla``)."""

MOE_IMPLEMENTATIONS = ("auto", "xla-kernels", "ragged-dot", "plain-xla")
"""How a mixture-of-experts model computes its experts (``--moe``; see
:mod:`xla_kernels.serving.moe`): ``xla-kernels`` the library's ``fused_moe`` custom call;
``ragged-dot`` ``fused_moe_ragged_dot`` (the (token, expert) pairs sorted by expert, two
``jax.lax.ragged_dot`` grouped GEMMs, a scatter-add); ``plain-xla`` ``fused_moe_xla`` (every
expert over every token); ``auto`` the one ``--attention`` names."""

PLATFORMS = ("cpu", "gpu")
DTYPES = ("float32", "bfloat16", "float16")

WEIGHT_FORMATS = ("model", "fp8", "fp8-dynamic")
"""How the decoder's linear projections (q/k/v/o, gate/up/down) are stored and run:
``model`` in the model's dtype; ``fp8`` as e4m3 values with one f32 scale per output
channel, weight-only (W8A16); ``fp8-dynamic`` the same weights with the activations
quantized per token (W8A8). See :mod:`xla_kernels.serving.quantize`."""


KV_CACHE_DTYPES = ("auto", "fp8")
"""How the paged K and V caches are stored: ``auto`` in the model's dtype; ``fp8`` as
``float8_e4m3fn`` (vLLM's ``kv_cache_dtype="fp8"``), written with per-tensor scales of 1.0 and
read by attention with 16-bit queries. See :mod:`xla_kernels.serving.attention`."""

FP8_CACHE_DTYPE = "float8_e4m3fn"
"""The NumPy name of an fp8 cache's dtype."""

ITEMSIZES = {"float32": 4, "bfloat16": 2, "float16": 2, FP8_CACHE_DTYPE: 1}
"""Bytes per element of each model or cache dtype."""


class ServingConfigError(XlaKernelsError, ValueError):
    """A bad serving option: the message names the option and the fix."""


def check_choice(option: str, value: str, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else a :class:`ServingConfigError` naming them.

    Example:
        >>> check_choice("--frontend", "jax", FRONTENDS)
        'jax'
        >>> try:
        ...     check_choice("--frontend", "tf", FRONTENDS)
        ... except ServingConfigError as e:
        ...     print(e)
        unknown --frontend 'tf'. Fix: pass --frontend jax or torchax.
    """
    if value not in choices:
        spelled = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 \
            else choices[0]
        raise ServingConfigError(f"unknown {option} {value!r}. Fix: pass {option} {spelled}.")
    return value


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, rotary embeddings, GQA attention, SwiGLU MLP, or with
    ``num_experts > 0`` a mixture of SwiGLU experts in every layer (Qwen3-MoE / Mixtral
    style: a linear router, softmax, the top ``experts_per_token``, renormalized; experts of
    ``moe_intermediate_size``), computed by the ``fused_moe`` op or, with ``--moe``, another
    implementation (:data:`MOE_IMPLEMENTATIONS`).

    ``dtype`` is the dtype of the weights and activations (a NumPy name); ``weights`` (one
    of :data:`WEIGHT_FORMATS`) how the linear projections are stored; ``kv_cache`` (one of
    :data:`KV_CACHE_DTYPES`) how the KV cache is (:attr:`cache_dtype`).
    ``max_context`` is the longest sequence (prompt + output) the model is run at: rotary
    embeddings have no hard limit, so this bounds a run (its steps and its cache) instead;
    32768 is the longest context the kernels are benchmarked at.
    """

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_context: int = 32768
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    weights: str = "model"
    kv_cache: str = "auto"

    def __post_init__(self) -> None:
        if self.num_experts and not (1 <= self.experts_per_token <= self.num_experts
                                     and self.moe_intermediate_size >= 1):
            raise ServingConfigError(
                f"model {self.name!r}: {self.num_experts} experts need 1 to "
                f"{self.num_experts} experts per token and an expert size >= 1. Fix: set "
                "experts_per_token and moe_intermediate_size.")
        if self.num_q_heads % self.num_kv_heads:
            raise ServingConfigError(
                f"model {self.name!r}: {self.num_q_heads} q heads are not a multiple of "
                f"{self.num_kv_heads} kv heads. Fix: pick a kv head count that divides them.")
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("--weights", self.weights, WEIGHT_FORMATS)
        check_choice("--kv-cache-dtype", self.kv_cache, KV_CACHE_DTYPES)
        if self.weights != "model" and self.num_experts:
            raise ServingConfigError(
                f"--weights {self.weights}: model {self.name!r} is a mixture of experts, and "
                "serve-bench quantizes only dense decoders' projections (fp8 experts would "
                "need fused_moe_fp8). Fix: pass --weights model, or a dense preset (tiny, 1b "
                "or 8b).")

    @property
    def cache_dtype(self) -> str:
        """The K and V caches' dtype (a NumPy name): the model's, or ``float8_e4m3fn``."""
        return FP8_CACHE_DTYPE if self.kv_cache == "fp8" else self.dtype

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """Cache bytes one token's K and V take over all layers (on each of ``tp`` devices,
        which split the kv heads): what attention reads per context token.

        Example:
            >>> m = preset("8b")
            >>> m.kv_bytes_per_token(), m.with_kv_cache("fp8").kv_bytes_per_token(tp=2)
            (131072, 32768)
        """
        elements = 2 * self.num_layers * self.num_kv_heads * self.head_dim
        return elements * ITEMSIZES[self.cache_dtype] // tp

    def num_params(self) -> int:
        """Parameters, embedding and LM head counted separately (they are not tied); every
        expert counts (not only the routed ones)."""
        q, kv = self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (2 * q + 2 * kv)
        mlp = 3 * self.hidden_size * self.intermediate_size
        if self.num_experts:
            mlp = self.num_experts * (3 * self.moe_intermediate_size + 1) * self.hidden_size
        per_layer = attention + mlp + 2 * self.hidden_size
        return (self.num_layers * per_layer + 2 * self.vocab_size * self.hidden_size
                + self.hidden_size)

    def with_dtype(self, dtype: str) -> ModelConfig:
        """The same model in another dtype."""
        return dataclasses.replace(self, dtype=check_choice("--dtype", dtype, DTYPES))

    def with_weights(self, weights: str) -> ModelConfig:
        """The same model with its projections stored as ``weights`` says."""
        return dataclasses.replace(self, weights=weights)

    def with_kv_cache(self, kv_cache: str) -> ModelConfig:
        """The same model with its KV cache stored as ``kv_cache`` says ("auto" or "fp8")."""
        return dataclasses.replace(self, kv_cache=kv_cache)


@dataclasses.dataclass(frozen=True)
class Workload:
    """The requests a benchmark sends: lengths drawn uniformly, seeded.

    Prompt lengths lie in ``[prompt_len * (1 - prompt_spread), prompt_len * (1 +
    prompt_spread)]``, output lengths in ``[new_tokens * (1 - output_spread), new_tokens]``;
    request ``i`` arrives before engine step ``i * arrival_every`` (0: all at once).
    """

    requests: int
    prompt_len: int
    new_tokens: int
    prompt_spread: float = 0.25
    output_spread: float = 0.0
    arrival_every: int = 0


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The engine's static limits, which fix the jitted step's shapes.

    * ``block_size``: tokens per cache block (one of ``kernels.paged_cache.BLOCK_SIZES``).
    * ``num_blocks``: blocks in each layer's cache (the pool the allocator hands out).
    * ``max_num_seqs``: sequences in one step (rows of ``block_tables``).
    * ``max_model_len``: the longest prompt + output; fixes the block table's width.
    * ``token_budget``: most query rows in one step (decode tokens + prefill chunks).
    * ``min_bucket``: the smallest padded row count; buckets double from it up to the budget.
    """

    block_size: int = 16
    num_blocks: int = 256
    max_num_seqs: int = 8
    max_model_len: int = 256
    token_budget: int = 64
    min_bucket: int = 16

    def __post_init__(self) -> None:
        if self.token_budget < self.max_num_seqs:
            raise ServingConfigError(
                f"token_budget {self.token_budget} is below max_num_seqs "
                f"{self.max_num_seqs}: a step could not hold one decode token per sequence. "
                "Fix: raise --token-budget or lower --max-num-seqs.")

    @property
    def max_blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    def buckets(self) -> tuple[int, ...]:
        """Padded row counts the step is compiled for: ``min_bucket`` doubling up to the
        token budget (which is always the last).

        Example:
            >>> EngineConfig(token_budget=100, min_bucket=16).buckets()
            (16, 32, 64, 100)
        """
        sizes, size = [], self.min_bucket
        while size < self.token_budget:
            sizes.append(size)
            size *= 2
        return (*sizes, self.token_budget)

    def bucket(self, num_tokens: int) -> int:
        """The smallest bucket holding ``num_tokens`` rows.

        Example:
            >>> EngineConfig(token_budget=100).bucket(17)
            32
        """
        for size in self.buckets():
            if num_tokens <= size:
                return size
        raise ValueError(f"{num_tokens} rows exceed the token budget {self.token_budget}")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A model and the engine and workload defaults that go with it."""

    model: ModelConfig
    workload: Workload
    block_size: int
    max_num_seqs: int
    token_budget: int


PRESETS: dict[str, Preset] = {
    # Runs on the CPU in seconds: CI. head_dim 64 is the kernels' smallest.
    "tiny": Preset(
        ModelConfig("tiny", vocab_size=512, hidden_size=128, intermediate_size=256,
                    num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=64,
                    dtype="float32"),
        Workload(requests=8, prompt_len=24, new_tokens=12, prompt_spread=0.75,
                 output_spread=0.75, arrival_every=2),
        block_size=16, max_num_seqs=4, token_budget=32),
    # About 1.0B parameters: the target model.
    "1b": Preset(
        ModelConfig("1b", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                    num_layers=16, num_q_heads=32, num_kv_heads=8, head_dim=128),
        Workload(requests=64, prompt_len=2000, new_tokens=256),
        block_size=16, max_num_seqs=64, token_budget=2048),
    # Llama-3-8B's shape (8.0B parameters; bf16 weights take 16 GB).
    "8b": Preset(
        ModelConfig("8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                    num_layers=32, num_q_heads=32, num_kv_heads=8, head_dim=128,
                    rope_theta=500000.0),
        Workload(requests=64, prompt_len=2000, new_tokens=256),
        block_size=16, max_num_seqs=64, token_budget=2048),
    # tiny with 8 experts, top 2, in every layer: the MoE path in CI.
    "tiny-moe": Preset(
        ModelConfig("tiny-moe", vocab_size=512, hidden_size=128, intermediate_size=256,
                    num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=64,
                    dtype="float32", num_experts=8, experts_per_token=2,
                    moe_intermediate_size=64),
        Workload(requests=8, prompt_len=24, new_tokens=12, prompt_spread=0.75,
                 output_spread=0.75, arrival_every=2),
        block_size=16, max_num_seqs=4, token_budget=32),
    # Qwen3-30B-A3B's layer shape (128 experts, top 8, hidden 2048, experts of 768, 32 q /
    # 4 kv heads of 128, vocabulary 151936) with 12 of its 48 layers: 8.1B parameters, so
    # that the bf16 weights (16 GB), the float32 check's copy (32 GB) and both runs' caches
    # fit one 80 GB H100. No q/k norms.
    "moe": Preset(
        ModelConfig("moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                    num_layers=12, num_q_heads=32, num_kv_heads=4, head_dim=128,
                    rope_theta=1000000.0, rms_eps=1e-6, num_experts=128,
                    experts_per_token=8, moe_intermediate_size=768),
        Workload(requests=64, prompt_len=2000, new_tokens=256),
        block_size=16, max_num_seqs=64, token_budget=2048),
}


def preset(name: str) -> ModelConfig:
    """The model of preset ``name`` (see :data:`PRESETS`)."""
    return preset_entry(name).model


def preset_entry(name: str) -> Preset:
    """Preset ``name`` with its engine and workload defaults."""
    if name not in PRESETS:
        raise ServingConfigError(f"unknown preset {name!r}. Fix: pass --preset "
                                 f"{', '.join(list(PRESETS)[:-1])} or {list(PRESETS)[-1]}.")
    return PRESETS[name]


def cache_shape(config: ModelConfig, engine: EngineConfig) -> tuple[int, int, int, int]:
    """One layer's K (or V) cache in vLLM layout: [num_blocks, block_size, kv_heads, dim]."""
    return (engine.num_blocks, engine.block_size, config.num_kv_heads, config.head_dim)


__all__ = ["ATTENTIONS", "DTYPES", "FP8_CACHE_DTYPE", "FRONTENDS", "ITEMSIZES", "KV_CACHE_DTYPES",
           "MOE_IMPLEMENTATIONS", "PLATFORMS", "PRESETS", "WEIGHT_FORMATS",
           "EngineConfig", "ModelConfig", "Preset", "ServingConfigError", "Workload",
           "cache_shape", "check_choice", "preset", "preset_entry"]
