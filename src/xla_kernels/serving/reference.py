"""The dense reference: the same decoder, no paging, no chunking, no batching tricks.

Each request's whole prompt goes through :func:`~xla_kernels.serving.model_jax.decoder` in
one call with full causal attention (:func:`~xla_kernels.serving.attention.dense_attention`),
its K/V kept in a contiguous per-request cache; then all requests decode in lockstep, one
token per call, attending their contiguous cache. Greedy tokens from here are what the paged
engine must reproduce, token for token. The reference is JAX code whichever frontend the
engine ran: both frontends load the same weights, so both must give these tokens. With an
fp8 KV cache (``config.kv_cache == "fp8"``) the reference keeps the K/V rounded through e4m3
exactly as the cache write rounds them, and attends with the queries the paged attention
takes (16-bit): the same model, so the same tokens.

With random weights, the two best logits of a step are sometimes nearly equal; the order
in which a kernel sums can then pick the other one, legitimately. So the reference also
keeps, for every token, its **margin** (best logit minus the runner-up's) and the runner-up
token: :func:`divergence_report` says, for the first divergence, whether the engine took
the runner-up, by how little the reference preferred its own token, and how rare so small a
margin is among all the reference's tokens.

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

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xla_kernels.serving.attention import as_cached, attention_queries, dense_attention
from xla_kernels.serving.backend import plain_xla_backend
from xla_kernels.serving.config import ModelConfig
from xla_kernels.serving.model_jax import decoder

DenseCache = tuple[tuple[Any, Any], ...]   # per layer (k, v) [requests, max_len, kv_heads, dim]


def _top2(weights: dict[str, Any], hidden: Any) -> tuple[Any, Any, Any]:
    """(argmax token, best logit minus the runner-up's, runner-up token) of each row of
    ``hidden``; logits in the model's dtype, as :func:`~xla_kernels.serving.model_jax.greedy`
    computes them."""
    import jax

    values, tokens = jax.lax.top_k(hidden @ weights["lm_head.weight"].T, 2)
    margin = (values[..., 0] - values[..., 1]).astype("float32")
    return tokens[..., 0].astype("int32"), margin, tokens[..., 1].astype("int32")


def _attention(config: ModelConfig, q: Any, k: Any, v: Any, q_positions: Any,
               k_positions: Any) -> Any:
    """Dense attention as the paged step computes it over ``config``'s cache: with an fp8
    cache the queries in 16 bits (:func:`~xla_kernels.serving.attention.attention_queries`;
    ``k``/``v`` already :func:`~xla_kernels.serving.attention.as_cached`), the output back
    in the model's dtype."""
    out = dense_attention(attention_queries(q, config.cache_dtype), k, v, q_positions,
                          k_positions)
    return out.astype(q.dtype)


def _prefill(weights: dict[str, Any], cache: DenseCache, tokens: Any, length: Any,
             index: Any, *, config: ModelConfig) -> tuple[Any, DenseCache]:
    """Request ``index``'s prompt ``tokens`` [P] (padded; ``length`` real) -> its first
    token, its K/V written to rows 0..P-1 of its cache."""
    import jax

    updated = list(cache)
    positions = jax.numpy.arange(tokens.shape[0])[None]

    def attend(layer: int, q: Any, k: Any, v: Any) -> Any:
        k, v = as_cached(k, config.cache_dtype), as_cached(v, config.cache_dtype)
        kc, vc = updated[layer]
        updated[layer] = (jax.lax.dynamic_update_slice(kc, k, (index, 0, 0, 0)),
                          jax.lax.dynamic_update_slice(vc, v, (index, 0, 0, 0)))
        return _attention(config, q, k, v, positions, positions)

    hidden = decoder(weights, config, tokens[None], positions, attend,
                     plain_xla_backend(config))
    return _top2(weights, hidden[0, length - 1]), tuple(updated)


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
        kc = kc.at[rows, positions].set(as_cached(k[:, 0], config.cache_dtype))
        vc = vc.at[rows, positions].set(as_cached(v[:, 0], config.cache_dtype))
        updated[layer] = (kc, vc)
        return _attention(config, q, kc, vc, positions[:, None], k_positions)

    hidden = decoder(weights, config, tokens[:, None], positions[:, None], attend,
                     plain_xla_backend(config))
    return _top2(weights, hidden[:, 0]), tuple(updated)


@dataclasses.dataclass
class DenseOutputs:
    """The reference's greedy tokens of every request, with each token's margin (best
    logit minus the runner-up's, float32) and runner-up token."""

    tokens: list[list[int]]
    margins: list[list[float]]
    runner_ups: list[list[int]]


def dense_greedy(config: ModelConfig, weights: dict[str, Any], prompts: Sequence[Sequence[int]],
                 max_new_tokens: Sequence[int]) -> list[list[int]]:
    """Greedy outputs of every request, computed densely (see the module doc)."""
    return dense_outputs(config, weights, prompts, max_new_tokens).tokens


def dense_outputs(config: ModelConfig, weights: dict[str, Any],
                  prompts: Sequence[Sequence[int]],
                  max_new_tokens: Sequence[int]) -> DenseOutputs:
    """:func:`dense_greedy`'s tokens with their margins and runner-ups."""
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
    out = DenseOutputs([], [], [])

    def append(rows: list[list[Any]], values: Any) -> None:
        for row, value in zip(rows, np.atleast_1d(np.asarray(values)).tolist(), strict=True):
            row.append(value)

    for i, prompt in enumerate(prompts):
        padded = np.zeros(longest_prompt, np.int32)
        padded[:len(prompt)] = prompt
        (token, margin, runner_up), cache = prefill(weights, cache, padded,
                                                    np.int32(len(prompt)), np.int32(i))
        out.tokens.append([int(token)])
        out.margins.append([float(margin)])
        out.runner_ups.append([int(runner_up)])
    positions = np.array([len(p) for p in prompts], np.int32)
    for _ in range(max(max_new_tokens) - 1):
        last = np.array([o[-1] for o in out.tokens], np.int32)
        # A request already done keeps decoding at its last position (ignored, in bounds).
        at = np.minimum(positions, max_len - 1).astype(np.int32)
        (tokens, margins, runner_ups), cache = decode(weights, cache, last, at)
        append(out.tokens, tokens)
        append(out.margins, margins)
        append(out.runner_ups, runner_ups)
        positions += 1
    return DenseOutputs(*([row[:n] for row, n in zip(rows, max_new_tokens, strict=True)]
                          for rows in (out.tokens, out.margins, out.runner_ups)))


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


def divergence_report(engine: Mapping[int, Sequence[int]], request_ids: Sequence[int],
                      reference: DenseOutputs) -> dict[str, Any] | None:
    """:func:`first_divergence` against ``reference`` (request ``request_ids[i]`` owns row
    i), plus what tells a near-tie from a bug: ``diverged_requests`` (how many requests
    differ anywhere), ``engine_took_runner_up``, ``reference_margin`` (the reference's best
    logit minus its runner-up's there) and ``margin_quantile`` (the fraction of all the
    reference's tokens decided by a margin this small or smaller). ``None`` when every
    request matches.

    Example:
        >>> ref = DenseOutputs([[5, 6]], [[2.0, 1e-6]], [[7, 8]])
        >>> report = divergence_report({0: [5, 8]}, [0], ref)
        >>> report["engine_took_runner_up"], report["margin_quantile"]
        (True, 0.5)
    """
    by_id = dict(zip(request_ids, range(len(request_ids)), strict=True))
    tokens = {rid: reference.tokens[row] for rid, row in by_id.items()}
    first = first_divergence(engine, tokens)
    if first is None:
        return None
    row, index = by_id[first["request"]], first["index"]
    diverged = sum(list(engine.get(rid, [])) != tokens[rid] for rid in by_id)
    if index >= len(reference.margins[row]):   # the engine generated more tokens
        return {**first, "diverged_requests": diverged}
    margin = reference.margins[row][index]
    every = np.concatenate([np.asarray(m, np.float64) for m in reference.margins])
    return {**first, "diverged_requests": diverged,
            "engine_took_runner_up": first["engine"] == reference.runner_ups[row][index],
            "reference_margin": margin,
            "margin_quantile": float(np.mean(every <= margin))}


__all__ = ["DenseOutputs", "dense_greedy", "dense_outputs", "divergence_report",
           "first_divergence"]
