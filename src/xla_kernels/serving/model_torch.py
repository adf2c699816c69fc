"""The Llama-style decoder as PyTorch modules, run on XLA through torchax.

The modules are ordinary torch code (``nn.Linear``, ``nn.Embedding``, ``F.silu``) that calls
the library's ops as torch operators: ``torch.ops.xla_kernels.rms_norm``,
``torch.ops.xla_kernels.reshape_and_cache`` (which updates the layer's caches in place and
returns nothing, like vLLM's ``reshape_and_cache_flash``) and
``torch.ops.xla_kernels.ragged_paged_attention`` (and ``torch.ops.xla_kernels.fused_moe`` in
a mixture-of-experts model, unless ``--moe`` picks another implementation), lowered by
:func:`~xla_kernels.frontends.torchax.register_torchax` to the same custom calls JAX emits.
The torchax lowering of the cache write rebinds the cache tensors to the custom call's
results; under the jitted step, whose cache argument is donated, the custom call's output
aliases its operand: the cache is updated in place, exactly as in the JAX frontend.
``--attention plain-xla`` calls both plain-XLA fallbacks with ``torchax.interop.call_jax``
(they are JAX functions, not torch operators), the way vLLM's TPU backend calls its Pallas
kernels from torch model code; so does ``--moe ragged-dot`` (``fused_moe_ragged_dot``) and
``--moe plain-xla`` (``fused_moe_xla``).

:class:`TorchaxRunner` builds the modules on torch's ``meta`` device (no host memory for a
1B model) and runs them with ``torch.func.functional_call`` on the weights of
:mod:`xla_kernels.serving.weights`, viewed as torchax tensors: the very arrays the JAX model
uses, so both frontends compute the same tokens. The step is jitted with
``torchax.interop.jax_jit(step, kwargs_for_jax_jit={"donate_argnums": (1,)})``.

Example:
    >>> from xla_kernels.serving.config import EngineConfig, preset
    >>> from xla_kernels.serving.batch import empty_batch
    >>> from xla_kernels.serving.weights import init_weights
    >>> from xla_kernels.serving.backend import resolve_backend
    >>> cfg, eng = preset("tiny"), EngineConfig(num_blocks=8, max_num_seqs=2)
    >>> runner = TorchaxRunner(cfg, init_weights(cfg), eng,
    ...                        resolve_backend(cfg))                       # doctest: +SKIP
    >>> runner.step(empty_batch(16, 2, eng.max_blocks_per_seq)).shape         # doctest: +SKIP
    (2,)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xla_kernels.serving.attention import KV_SCALE
from xla_kernels.serving.backend import Backend
from xla_kernels.serving.batch import StepBatch, feed_tokens
from xla_kernels.serving.config import EngineConfig, ModelConfig
from xla_kernels.serving.moe import Experts
from xla_kernels.serving.quantize import Projection
from xla_kernels.serving.sampling import sample_torch

KVCache = tuple[torch.Tensor, torch.Tensor]


def _interop() -> Any:
    from xla_kernels.frontends.torchax import import_torchax

    import_torchax()
    from torchax import interop

    return interop


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x`` [T, heads, dim] at ``positions`` [T] ("rotate_half"), in
    f32 (the JAX model's formula)."""
    dim = x.shape[-1]
    steps = torch.arange(0, dim, 2, dtype=torch.float32, device=x.device)
    inv_freq = 1.0 / theta ** (steps / dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos = torch.cat([torch.cos(angles)] * 2, dim=-1)[:, None, :]
    sin = torch.cat([torch.sin(angles)] * 2, dim=-1)[:, None, :]
    x32 = x.to(torch.float32)
    half = dim // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class FP8Linear(nn.Module):
    """A projection with fp8 weights (``--weights fp8`` / ``fp8-dynamic``): ``weight`` [out,
    in] ``float8_e4m3fn`` and ``weight_scale`` [out, 1] f32, vLLM's parameter names.
    ``torch.ops.xla_kernels.fp8_linear`` computes it (``projection.kernel``), else
    ``fp8_linear_xla`` through ``interop.call_jax``; a row-parallel projection split over
    ``mesh`` calls :func:`~xla_kernels.serving.quantize.fp8_project`, which sums the devices'
    partial products."""

    def __init__(self, in_features: int, out_features: int, projection: Projection,
                 mesh: Any = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features,
                                               dtype=torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, 1), requires_grad=False)
        self.scheme, self.op = projection.scheme, projection.kernel and mesh is None
        # call_jax keys its trace cache on the function: make it once.
        self._jax = functools.partial(projection, mesh=mesh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.op:
            return _interop().call_jax(self._jax, x, self.weight, self.weight_scale)
        y = torch.ops.xla_kernels.fp8_linear(x.reshape(-1, x.shape[-1]), self.weight,
                                             self.weight_scale, activation_scheme=self.scheme)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def linear(projection: Projection, in_features: int, out_features: int,
           mesh: Any = None) -> nn.Module:
    """``nn.Linear`` (no bias) for a projection in the model's dtype, else
    :class:`FP8Linear`; ``mesh``: the tensor-parallel mesh of a row-parallel projection
    (None otherwise)."""
    if not projection.fp8:
        return nn.Linear(in_features, out_features, bias=False)
    return FP8Linear(in_features, out_features, projection, mesh)


class RMSNorm(nn.Module):
    """RMS normalization through the library's ``rms_norm`` op."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.xla_kernels.rms_norm(x, self.weight, eps=self.eps)


class Attention(nn.Module):
    """GQA self-attention over the paged cache: write the new K/V, then attend."""

    def __init__(self, config: ModelConfig, backend: Backend, mesh: Any = None):
        super().__init__()
        h, d, project = config.hidden_size, config.head_dim, backend.projection
        self.num_q_heads, self.num_kv_heads, self.head_dim = (
            config.num_q_heads, config.num_kv_heads, d)
        self.theta, self.scale = config.rope_theta, d ** -0.5
        self.kernel = backend.attention.kernel
        self.q_proj = linear(project, h, config.num_q_heads * d)
        self.k_proj = linear(project, h, config.num_kv_heads * d)
        self.v_proj = linear(project, h, config.num_kv_heads * d)
        self.o_proj = linear(project, config.num_q_heads * d, h, mesh)
        # call_jax keys its trace cache on the function: make each one once.
        self._write_xla = backend.attention.write_kv
        self._attend_xla = functools.partial(backend.attention.attend, scale=self.scale)

    @staticmethod
    def _query_dtype(q: torch.Tensor, key_cache: torch.Tensor) -> torch.dtype:
        """The dtype the op takes ``q`` in: its own, or over an fp8 cache a 16-bit one
        (:func:`~xla_kernels.kernels.paged_cache.fp8_query_dtype`'s rule, which the JAX
        model applies, on torch dtypes: f32 queries become bfloat16)."""
        if key_cache.dtype != torch.float8_e4m3fn or q.dtype.itemsize == 2:
            return q.dtype
        return torch.bfloat16
    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                batch: StepBatch) -> tuple[torch.Tensor, KVCache]:
        interop = _interop()
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_q_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        q, k = rotary(q, positions, self.theta), rotary(k, positions, self.theta)
        key_cache, value_cache = kv_cache
        if self.kernel:
            torch.ops.xla_kernels.reshape_and_cache(k, v, key_cache, value_cache,
                                                    batch.slot_mapping, k_scale=KV_SCALE,
                                                    v_scale=KV_SCALE)
            out = torch.ops.xla_kernels.ragged_paged_attention(
                q.to(self._query_dtype(q, key_cache)), key_cache, value_cache, batch.kv_lens,
                batch.block_tables, batch.cu_q_lens, batch.num_seqs, scale=self.scale,
                k_scale=KV_SCALE, v_scale=KV_SCALE).to(q.dtype)
        else:
            key_cache, value_cache = interop.call_jax(self._write_xla, k, v, key_cache,
                                                      value_cache, batch.slot_mapping)
            out = interop.call_jax(self._attend_xla, q, key_cache, value_cache, batch)
        return self.o_proj(out.reshape(tokens, -1)), (key_cache, value_cache)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, projection: Projection, mesh: Any = None):
        super().__init__()
        h, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = linear(projection, h, inter)
        self.up_proj = linear(projection, h, inter)
        self.down_proj = linear(projection, inter, h, mesh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ExpertWeights(nn.Module):
    """The experts' weights in vLLM's fused_moe layout (w13 = [gate; up])."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        e, h, n = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.w13_weight = nn.Parameter(torch.empty(e, 2 * n, h))
        self.w2_weight = nn.Parameter(torch.empty(e, h, n))


class MoE(nn.Module):
    """A mixture of SwiGLU experts: a linear router, then ``torch.ops.xla_kernels.fused_moe``
    (``Experts.KERNELS``: ``--moe xla-kernels``, or ``auto`` under ``--attention
    xla-kernels``), or the JAX function ``fused_moe_ragged_dot`` (``--moe ragged-dot``) or
    ``fused_moe_xla`` (``plain-xla``) through ``interop.call_jax``; see
    :mod:`xla_kernels.serving.moe`."""

    def __init__(self, config: ModelConfig, implementation: Experts):
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = ExpertWeights(config)
        self.top_k, self.implementation = config.experts_per_token, implementation
        # call_jax keys its trace cache on the function: make it once.
        self._jax = functools.partial(implementation.jax_function(), top_k=self.top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        w13, w2 = self.experts.w13_weight, self.experts.w2_weight
        if self.implementation.kernel:
            return torch.ops.xla_kernels.fused_moe(x, logits, w13, w2, top_k=self.top_k)
        return _interop().call_jax(self._jax, x, logits, w13, w2)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: Backend, mesh: Any = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.self_attn = Attention(config, backend, mesh)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.mlp = (MoE(config, backend.experts) if backend.experts is not None
                    else MLP(config, backend.projection, mesh))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                batch: StepBatch) -> tuple[torch.Tensor, KVCache]:
        out, kv_cache = self.self_attn(self.input_layernorm(x), positions, kv_cache, batch)
        x = x + out
        return x + self.mlp(self.post_attention_layernorm(x)), kv_cache


class LlamaForServing(nn.Module):
    """The decoder for one engine step: ``forward(caches, batch)`` returns (the next token of
    each sequence slot, int32 [max_num_seqs], greedy or drawn as ``backend.sampling`` says;
    the updated caches), every role computed as ``backend`` says. ``mesh``: the
    tensor-parallel mesh (None: one device), which row-parallel fp8 projections sum their
    partial products over."""

    def __init__(self, config: ModelConfig, backend: Backend, mesh: Any = None):
        super().__init__()
        self.sampling = backend.sampling
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, backend, mesh)
                                    for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, caches: tuple[KVCache, ...], batch: StepBatch
                ) -> tuple[torch.Tensor, tuple[KVCache, ...]]:
        x = self.embed_tokens(batch.token_ids)
        updated = []
        for layer, kv_cache in zip(self.layers, caches, strict=True):
            x, kv_cache = layer(x, batch.positions, kv_cache, batch)
            updated.append(kv_cache)
        hidden = self.norm(x)[batch.logits_indices]
        if self.sampling.greedy:
            return torch.argmax(self.lm_head(hidden), dim=-1).to(torch.int32), tuple(updated)
        return sample_torch(self.lm_head(hidden), self.sampling, batch), tuple(updated)


class TorchaxRunner:
    """Runs :class:`LlamaForServing` for the engine through torchax (see the module doc):
    ``step(batch)`` returns the sampled tokens [max_num_seqs] as NumPy and keeps the updated
    caches (torchax tensors); ``backend``
    (:func:`~xla_kernels.serving.backend.resolve_backend`) says what computes each role."""

    frontend = "torchax"

    def __init__(self, config: ModelConfig, weights: dict[str, Any], engine: EngineConfig,
                 backend: Backend, tp: int = 1, devices: Sequence[Any] | None = None):
        import jax

        from xla_kernels.frontends.torchax import register_torchax
        from xla_kernels.kernels.fp8_linear import fp8_linear
        from xla_kernels.kernels.kv_cache import reshape_and_cache
        from xla_kernels.kernels.moe import fused_moe
        from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention
        from xla_kernels.kernels.rms_norm import rms_norm
        from xla_kernels.kernels.sampling import sample
        from xla_kernels.serving.tp import place

        backend.check(config)
        interop = _interop()
        register_torchax(rms_norm)
        register_torchax(reshape_and_cache)
        register_torchax(ragged_paged_attention)
        register_torchax(fused_moe)
        register_torchax(sample)
        register_torchax(fp8_linear)
        placement = place(config, engine, weights, tp, devices)
        with torch.device("meta"):
            module = LlamaForServing(config, backend, placement.mesh)
        self.module, self.config, self.backend = module, config, backend
        self.mesh, self.tp, self._batch_sharding = placement.mesh, tp, placement.batch_sharding
        self.params = interop.torch_view(placement.weights)
        self.caches = interop.torch_view(placement.caches)

        def step(params: dict[str, torch.Tensor], caches: tuple[KVCache, ...],
                 batch: StepBatch) -> tuple[torch.Tensor, tuple[KVCache, ...]]:
            return torch.func.functional_call(module, params, (caches, batch))

        # torchax.interop.jax_jit(step, kwargs_for_jax_jit={"donate_argnums": (1,)}) is
        # torch_view(jax.jit(jax_view(step), donate_argnums=(1,))); spelled out to keep the
        # jax.jit object, whose cache size counts the compiled buckets.
        self._jax_step = jax.jit(interop.jax_view(step), donate_argnums=(1,),
                                 **placement.jit_kwargs)
        self.jitted = interop.torch_view(self._jax_step)
        self._device_put = jax.device_put

    def prepare(self, batch: StepBatch) -> StepBatch:
        """The batch on the device (replicated over the mesh with ``tp > 1``) as torchax
        tensors, as :meth:`launch` takes it."""
        return _interop().torch_view(self._device_put(batch, self._batch_sharding))

    def launch(self, batch: StepBatch) -> torch.Tensor:
        """Dispatch one step on a prepared batch; returns the tokens (no sync)."""
        tokens, self.caches = self.jitted(self.params, self.caches, batch)
        return tokens

    def feed(self, prepared: StepBatch, rows: list[int], slots: list[int],
             tokens: torch.Tensor) -> StepBatch:
        """``prepared`` with ``token_ids[rows] = tokens[slots]`` on the device (async
        scheduling: ``tokens`` of the step in flight)."""
        interop = _interop()
        ids = feed_tokens(interop.jax_view(prepared.token_ids), rows, slots,
                          interop.jax_view(tokens))
        return prepared._replace(token_ids=interop.torch_view(ids))

    def fetch(self, tokens: torch.Tensor) -> np.ndarray:
        """Wait for a launched step's tokens (the host sync)."""
        return np.asarray(_interop().jax_view(tokens))

    def step(self, batch: StepBatch) -> np.ndarray:
        return self.fetch(self.launch(self.prepare(batch)))

    def lower(self, batch: StepBatch) -> Any:
        """The step lowered for ``batch``'s bucket (``.as_text()`` shows the custom calls
        and the donated caches)."""
        interop = _interop()
        return self._jax_step.lower(interop.jax_view(self.params),
                                    interop.jax_view(self.caches), batch)

    def compiled_buckets(self) -> int:
        """How many programs the step compiled so far (one per bucket used)."""
        return int(self._jax_step._cache_size())


__all__ = ["MLP", "Attention", "DecoderLayer", "ExpertWeights", "FP8Linear", "LlamaForServing",
           "MoE", "RMSNorm", "TorchaxRunner", "linear", "rotary"]
