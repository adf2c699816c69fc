"""The Llama-style decoder in JAX, and the engine's runner for it.

:func:`decoder` is the model once (RMSNorm through the library's ``rms_norm`` op, rotary
embeddings, GQA attention, SwiGLU MLP or a mixture of experts); the attention is a function
passed in, the projections and experts are its
:class:`~xla_kernels.serving.backend.Backend`'s, so the paged engine (:func:`paged_step`)
and the dense reference (:mod:`xla_kernels.serving.reference`) share every other line.
:class:`JaxRunner` holds the weights and the per-layer KV caches and runs one jitted step
per bucket with the caches donated: each step's ``reshape_and_cache`` updates them in
place, nothing is copied.

Example:
    >>> from xla_kernels.serving.config import EngineConfig, preset
    >>> from xla_kernels.serving.batch import empty_batch
    >>> from xla_kernels.serving.weights import init_weights
    >>> from xla_kernels.serving.backend import resolve_backend
    >>> cfg, eng = preset("tiny"), EngineConfig(num_blocks=8, max_num_seqs=2)
    >>> runner = JaxRunner(cfg, init_weights(cfg), eng, resolve_backend(cfg, "plain-xla"))
    >>> runner.step(empty_batch(16, 2, eng.max_blocks_per_seq)).shape   # doctest: +SKIP
    (2,)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xla_kernels.serving.backend import Backend
from xla_kernels.serving.batch import StepBatch, feed_tokens
from xla_kernels.serving.config import EngineConfig, ModelConfig, cache_shape
from xla_kernels.serving.moe import moe
from xla_kernels.serving.sampling import sample_jax
from xla_kernels.serving.tp import ROW_PARALLEL, place, zero_caches

Weights = dict[str, Any]
Caches = tuple[tuple[Any, Any], ...]
AttentionFn = Callable[[int, Any, Any, Any], Any]
"""``attention(layer, q, k, v) -> out``: q [..., T, q_heads, dim], k/v [..., T, kv_heads,
dim] of the new tokens (rotary applied); out like q."""


def rotary(x: Any, positions: Any, theta: float) -> Any:
    """Rotary embedding (the half-split "rotate_half" form) of ``x`` [..., T, heads, dim] at
    integer ``positions`` [..., T], computed in f32."""
    import jax.numpy as jnp

    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq          # [..., T, dim/2]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[..., None, :]   # [..., T, 1, dim]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[..., None, :]
    x32 = x.astype(jnp.float32)
    half = dim // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def decoder(weights: Weights, config: ModelConfig, token_ids: Any, positions: Any,
            attention: AttentionFn, backend: Backend, mesh: Any = None) -> Any:
    """The final hidden states [..., T, hidden] of ``token_ids`` [..., T]; ``backend``'s
    projection and experts compute the projections and a mixture-of-experts model's
    experts. ``mesh``: the tensor-parallel mesh the weights are split over (None: one
    device), which row-parallel fp8 projections sum over."""
    import jax

    from xla_kernels.kernels.rms_norm import rms_norm

    project = backend.projection

    def linear(x: Any, name: str) -> Any:      # torch layout: weight [out, in]
        row_parallel = name.rsplit(".", 1)[-1] in ROW_PARALLEL
        return project(x, weights[name + ".weight"], weights.get(name + ".weight_scale"),
                       mesh=mesh if row_parallel else None)

    lead = token_ids.shape
    hq, hkv, d = config.num_q_heads, config.num_kv_heads, config.head_dim
    x = weights["embed_tokens.weight"][token_ids]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        h = rms_norm(x, weights[p + "input_layernorm.weight"], eps=config.rms_eps)
        q = linear(h, p + "self_attn.q_proj").reshape(*lead, hq, d)
        k = linear(h, p + "self_attn.k_proj").reshape(*lead, hkv, d)
        v = linear(h, p + "self_attn.v_proj").reshape(*lead, hkv, d)
        q = rotary(q, positions, config.rope_theta)
        k = rotary(k, positions, config.rope_theta)
        out = attention(i, q, k, v).reshape(*lead, hq * d)
        x = x + linear(out, p + "self_attn.o_proj")
        h = rms_norm(x, weights[p + "post_attention_layernorm.weight"], eps=config.rms_eps)
        if config.num_experts:
            x = x + moe(backend.experts, config, h, weights[p + "mlp.gate.weight"],
                        weights[p + "mlp.experts.w13_weight"],
                        weights[p + "mlp.experts.w2_weight"])
            continue
        gate = jax.nn.silu(linear(h, p + "mlp.gate_proj"))
        x = x + linear(gate * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    return rms_norm(x, weights["norm.weight"], eps=config.rms_eps)


def greedy(weights: Weights, hidden: Any) -> Any:
    """The argmax token (int32) of each row of ``hidden`` [..., hidden]; logits in the
    model's dtype, as the torch model computes them."""
    import jax.numpy as jnp

    return jnp.argmax(hidden @ weights["lm_head.weight"].T, axis=-1).astype(jnp.int32)


def paged_step(weights: Weights, caches: Caches, batch: StepBatch, *, config: ModelConfig,
               backend: Backend, mesh: Any = None) -> tuple[Any, Caches]:
    """One engine step: every layer writes the batch's K/V to its paged cache, then attends
    with ragged paged attention, as ``backend`` says; returns (next token of each sequence
    slot [max_num_seqs], greedy or drawn as ``backend.sampling`` says; the updated caches).
    ``mesh``: the tensor-parallel mesh (see :func:`decoder`)."""
    updated = list(caches)
    scale = config.head_dim ** -0.5
    attention = backend.attention

    def attend(layer: int, q: Any, k: Any, v: Any) -> Any:
        key_cache, value_cache = attention.write_kv(k, v, *updated[layer], batch.slot_mapping)
        updated[layer] = (key_cache, value_cache)
        return attention.attend(q, key_cache, value_cache, batch, scale=scale)

    hidden = decoder(weights, config, batch.token_ids, batch.positions, attend, backend,
                     mesh)[batch.logits_indices]
    if backend.sampling.greedy:
        return greedy(weights, hidden), tuple(updated)
    return (sample_jax(hidden @ weights["lm_head.weight"].T, backend.sampling, batch),
            tuple(updated))


class JaxRunner:
    """Runs :func:`paged_step` for the engine: ``step(batch)`` returns the sampled tokens
    [max_num_seqs] as NumPy (the one host sync per step) and keeps the updated caches.

    ``backend`` (:func:`~xla_kernels.serving.backend.resolve_backend`) says what computes
    each role of the step. ``tp > 1`` splits the step over the first ``tp`` of ``devices``
    (default: JAX's), kv heads sharded (see :mod:`xla_kernels.serving.tp`); ``self.mesh``
    is then its mesh."""

    frontend = "jax"

    def __init__(self, config: ModelConfig, weights: Weights, engine: EngineConfig,
                 backend: Backend, tp: int = 1, devices: Sequence[Any] | None = None):
        import jax

        backend.check(config)
        placement = place(config, engine, weights, tp, devices)
        self.config, self.weights, self.backend = config, placement.weights, backend
        self.caches, self.mesh, self.tp = placement.caches, placement.mesh, tp
        self._batch_sharding = placement.batch_sharding
        self.jitted = jax.jit(functools.partial(paged_step, config=config, backend=backend,
                                                mesh=placement.mesh),
                              donate_argnums=(1,), **placement.jit_kwargs)

    def prepare(self, batch: StepBatch) -> StepBatch:
        """The batch on the device (replicated over the mesh with ``tp > 1``), as
        :meth:`launch` takes it."""
        import jax

        return jax.device_put(batch, self._batch_sharding)

    def launch(self, batch: StepBatch) -> Any:
        """Dispatch one step on a prepared batch; returns the device's tokens (no sync)."""
        tokens, self.caches = self.jitted(self.weights, self.caches, batch)
        return tokens

    def feed(self, prepared: StepBatch, rows: list[int], slots: list[int],
             tokens: Any) -> StepBatch:
        """``prepared`` with ``token_ids[rows] = tokens[slots]`` on the device (async
        scheduling: ``tokens`` of the step in flight)."""
        return prepared._replace(token_ids=feed_tokens(prepared.token_ids, rows, slots, tokens))

    def fetch(self, tokens: Any) -> np.ndarray:
        """Wait for a launched step's tokens (the host sync)."""
        return np.asarray(tokens)

    def step(self, batch: StepBatch) -> np.ndarray:
        return self.fetch(self.launch(self.prepare(batch)))

    def lower(self, batch: StepBatch) -> Any:
        """The step lowered for ``batch``'s bucket (``.as_text()`` shows the custom calls
        and the donated caches)."""
        return self.jitted.lower(self.weights, self.caches, batch)

    def compiled_buckets(self) -> int:
        """How many programs the step compiled so far (one per bucket used)."""
        return int(self.jitted._cache_size())


__all__ = ["JaxRunner", "cache_shape", "decoder", "greedy", "paged_step", "rotary",
           "zero_caches"]
