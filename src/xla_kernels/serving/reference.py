"""The dense reference: the same decoder, no paging, no chunking, no batching tricks.

Each request's whole prompt goes through :func:`~xla_kernels.serving.model_jax.decoder` in
one call with full causal attention (:func:`~xla_kernels.serving.attention.dense_attention`),
its K/V kept in a contiguous per-request cache; then all requests decode in lockstep, one
token per call, attending their contiguous cache. Greedy tokens from here are what the paged
engine must reproduce, token for token. The reference is JAX code whichever frontend the
engine ran: both frontends load the same weights, so both must give these tokens.

Example:
    >>> from xla_kernels.serving.config import preset
    >>> from xla_kernels.serving.weights import init_weights
    >>> cfg = preset("tiny")
    >>> out = dense_greedy(cfg, init_weights(cfg), [[1, 2, 3], [4, 5]], [2, 3])  # doctest: +SKIP
    >>> [len(o) for o in out]                                                   # doctest: +SKIP
    [2, 3]
    >>> first_divergence({0: [1, 2, 3]}, {0: [1, 2, 4]})
    {'request': 0, 'index': 2, 'engine': 3, 'reference': 4}
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xla_kernels.serving.attention import dense_attention
from xla_kernels.serving.config import ModelConfig
from xla_kernels.serving.model_jax import decoder, greedy

DenseCache = tuple[tuple[Any, Any], ...]   # per layer (k, v) [requests, max_len, kv_heads, dim]


def _prefill(weights: dict[str, Any], cache: DenseCache, tokens: Any, length: Any,
             index: Any, *, config: ModelConfig) -> tuple[Any, DenseCache]:
    """Request ``index``'s prompt ``tokens`` [P] (padded; ``length`` real) -> its first
    token, its K/V written to rows 0..P-1 of its cache."""
    import jax

    updated = list(cache)
    positions = jax.numpy.arange(tokens.shape[0])[None]

    def attend(layer: int, q: Any, k: Any, v: Any) -> Any:
        kc, vc = updated[layer]
        updated[layer] = (jax.lax.dynamic_update_slice(kc, k, (index, 0, 0, 0)),
                          jax.lax.dynamic_update_slice(vc, v, (index, 0, 0, 0)))
        return dense_attention(q, k, v, positions, positions)

    hidden = decoder(weights, config, tokens[None], positions, attend)
    return greedy(weights, hidden[0, length - 1]), tuple(updated)


def _decode(weights: dict[str, Any], cache: DenseCache, tokens: Any, positions: Any, *,
            config: ModelConfig) -> tuple[Any, DenseCache]:
    """Every request's next token from ``tokens`` [R] at ``positions`` [R]."""
    import jax.numpy as jnp

    updated = list(cache)
    rows = jnp.arange(tokens.shape[0])
    max_len = cache[0][0].shape[1]
    k_positions = jnp.broadcast_to(jnp.arange(max_len), (tokens.shape[0], max_len))

    def attend(layer: int, q: Any, k: Any, v: Any) -> Any:
        kc, vc = updated[layer]
        kc = kc.at[rows, positions].set(k[:, 0])
        vc = vc.at[rows, positions].set(v[:, 0])
        updated[layer] = (kc, vc)
        return dense_attention(q, kc, vc, positions[:, None], k_positions)

    hidden = decoder(weights, config, tokens[:, None], positions[:, None], attend)
    return greedy(weights, hidden[:, 0]), tuple(updated)


def dense_greedy(config: ModelConfig, weights: dict[str, Any], prompts: Sequence[Sequence[int]],
                 max_new_tokens: Sequence[int]) -> list[list[int]]:
    """Greedy outputs of every request, computed densely (see the module doc)."""
    import jax
    import jax.numpy as jnp

    count = len(prompts)
    longest_prompt = max(map(len, prompts))
    max_len = max(len(p) + n for p, n in zip(prompts, max_new_tokens, strict=True))
    shape = (count, max_len, config.num_kv_heads, config.head_dim)
    cache = tuple((jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype))
                  for _ in range(config.num_layers))
    prefill = jax.jit(functools.partial(_prefill, config=config), donate_argnums=(1,))
    decode = jax.jit(functools.partial(_decode, config=config), donate_argnums=(1,))
    outputs: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        padded = np.zeros(longest_prompt, np.int32)
        padded[:len(prompt)] = prompt
        first, cache = prefill(weights, cache, padded, np.int32(len(prompt)), np.int32(i))
        outputs.append([int(first)])
    positions = np.array([len(p) for p in prompts], np.int32)
    for _ in range(max(max_new_tokens) - 1):
        last = np.array([o[-1] for o in outputs], np.int32)
        # A request already done keeps decoding at its last position (ignored, in bounds).
        at = np.minimum(positions, max_len - 1).astype(np.int32)
        tokens, cache = decode(weights, cache, last, at)
        for o, t in zip(outputs, np.asarray(tokens).tolist(), strict=True):
            o.append(int(t))
        positions += 1
    return [o[:n] for o, n in zip(outputs, max_new_tokens, strict=True)]


def first_divergence(engine: Mapping[int, Sequence[int]],
                     reference: Mapping[int, Sequence[int]]) -> dict[str, int] | None:
    """The first (request, output index) where the engine's tokens differ from the
    reference's, or ``None`` when every request matches token for token."""
    for request in sorted(reference):
        got, want = list(engine.get(request, [])), list(reference[request])
        for index in range(max(len(got), len(want))):
            a = got[index] if index < len(got) else -1
            b = want[index] if index < len(want) else -1
            if a != b:
                return {"request": request, "index": index, "engine": a, "reference": b}
    return None


__all__ = ["dense_greedy", "first_divergence"]
