"""vLLM's per-request sampling parameters on tpu-inference's runner, with vLLM-on-CUDA meaning.

tpu-inference 0.32 samples with temperature, top-k and top-p only
(``layers/jax/sample/sampling.py: sample``). Its input batch records ``min_tokens``,
``logit_bias`` and ``bad_words`` but nothing reads them; penalties and ``min_p`` are not even
recorded; ``allowed_token_ids`` fails when it is recorded (``jnp.zeros`` called with the
shape as two arguments); a per-request ``seed`` is refused by its platform. Off TPU the
patches (:mod:`xla_kernels.vllm.patches`) hand a step that needs any of them here:

* :func:`step_metadata` (host, once per step) reads each row's ``SamplingParams`` and the
  request's tokens and builds :class:`XkSamplingMetadata`: per-row values and, padded to a
  few bucketed widths, the token ids each processor needs;
* :func:`sample` (device, jitted) applies them to the logits in vLLM's order (allowed token
  ids, bad words and min tokens, logit bias, then repetition / frequency / presence
  penalties) and draws each row with xla-kernels' ``sample`` op (temperature, min-p, top-k,
  top-p; a seeded request's Philox key is its seed and the counter its token position, so its
  tokens depend on nothing else in the batch).

What stays unsupported is refused when the request arrives (:func:`refusal`, called by
:meth:`XlaKernelsPlatform.validate_request`), naming the parameter.

Example (what a request may ask for):
    >>> from vllm import SamplingParams
    >>> refusal(SamplingParams(repetition_penalty=1.3), speculative=False) is None
    True
    >>> refusal(SamplingParams(seed=1), speculative=True)[:47]
    'xla_kernels.vllm: SamplingParams seed is not su'
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SAMPLING_EPS = 1e-5
"""vLLM's threshold below which a temperature means greedy."""

HISTORY_PARAMS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "bad_words",
                  "min_tokens")
"""Parameters that read the request's tokens so far."""

PROCESSED_PARAMS = (*HISTORY_PARAMS, "logit_bias", "allowed_token_ids", "min_p", "seed")
"""Parameters this module applies (temperature, top_k and top_p too, which upstream has)."""

REFUSED_ALWAYS = {
    "logprob_token_ids": "tpu-inference's runner returns top-k logprobs only",
    "thinking_token_budget": "tpu-inference's runner has no thinking-budget state",
    "trace_decode_token_ids": "tpu-inference's runner has no trace replay",
}
"""Parameters no request may set on this backend, and why."""


SPECULATIVE_REFUSED = {
    "logprobs": "tpu-inference's speculative logprobs hand a rejected draft's placeholder "
                "token id (-1) to vLLM's detokenizer (OverflowError: number too small to "
                "fit in target type)",
}
"""Parameters refused only with speculative decoding (beyond :data:`PROCESSED_PARAMS`, which
tpu-inference's rejection sampler ignores), and why."""


def _set(params: Any, name: str) -> bool:
    """Whether ``params.name`` differs from what a plain request has."""
    value = getattr(params, name)
    if name == "repetition_penalty":
        return abs(value - 1.0) > SAMPLING_EPS
    if name in ("presence_penalty", "frequency_penalty", "min_p"):
        return abs(value) > SAMPLING_EPS
    if name == "min_tokens":
        return value > 0
    if name == "logprobs":
        return value is not None
    return bool(value) if name != "seed" else value is not None


def refusal(params: Any, *, speculative: bool) -> str | None:
    """The message refusing ``params`` (a ``SamplingParams``) on this backend, or None.

    ``speculative``: the engine runs speculative decoding, whose rejection sampler
    (tpu-inference's) takes temperature, top-k and top-p only."""
    names = [name for name in REFUSED_ALWAYS if getattr(params, name, None) is not None]
    if speculative:
        names += [name for name in (*PROCESSED_PARAMS, *SPECULATIVE_REFUSED)
                  if _set(params, name)]
    if not names:
        return None
    reasons = {**REFUSED_ALWAYS, **{n: f"with speculative decoding, {why}"
                                    for n, why in SPECULATIVE_REFUSED.items()}}
    why = "; ".join(dict.fromkeys(
        reasons.get(name, "with speculative decoding, tpu-inference's rejection sampler "
                          "ignores it") for name in names))
    fix = ("leave them unset" if not speculative or any(n in REFUSED_ALWAYS for n in names)
           else "leave them unset, or run without speculative decoding")
    return (f"xla_kernels.vllm: SamplingParams {', '.join(names)} "
            f"{'is' if len(names) == 1 else 'are'} not supported on this backend "
            f"(tpu-inference on JAX's CPU/GPU): {why}. Fix: {fix}")


def needs_processing(params: Any) -> bool:
    """Whether a request asks for something upstream's sampler does not do."""
    return params is not None and any(_set(params, name) for name in PROCESSED_PARAMS)


def needs_history(params: Any) -> bool:
    """Whether a request's processing reads the tokens it generated so far."""
    return params is not None and any(_set(params, name) for name in HISTORY_PARAMS)


def _metadata_class():
    from tpu_inference.layers.jax.sample.sampling_metadata import TPUSupportedSamplingMetadata

    ours = ("sample_temperature", "sample_top_k", "sample_top_p", "sample_min_p", "seeds",
            "seeded", "offsets", "repetition", "presence", "frequency", "prompt_ids",
            "output_ids", "banned_ids", "bias_ids", "bias_values", "allowed_ids",
            "restricted")

    @dataclasses.dataclass
    class XkSamplingMetadata(TPUSupportedSamplingMetadata):
        """Upstream's metadata (kept for upstream's code after sampling) plus, per row, what
        :func:`sample` needs. Token id lists are padded with ``vocab`` (dropped)."""

        sample_temperature: Any = None   # f32 [R]; 0: greedy
        sample_top_k: Any = None         # i32 [R]; 0: off
        sample_top_p: Any = None         # f32 [R]; 1: off
        sample_min_p: Any = None         # f32 [R]; 0: off
        seeds: Any = None                # u32 [R]: the request's seed where it has one
        seeded: Any = None               # bool [R]
        offsets: Any = None              # i32 [R]: position of the token drawn
        repetition: Any = None           # f32 [R]; 1: off
        presence: Any = None             # f32 [R]
        frequency: Any = None            # f32 [R]
        prompt_ids: Any = None           # i32 [R, P]: the prompt (repetition penalty)
        output_ids: Any = None           # i32 [R, O]: the tokens generated so far
        banned_ids: Any = None           # i32 [R, K]: bad words' next token, min_tokens' stops
        bias_ids: Any = None             # i32 [R, B]
        bias_values: Any = None          # f32 [R, B]
        allowed_ids: Any = None          # i32 [R, A]
        restricted: Any = None           # bool [R]: the row has allowed_token_ids

    jax.tree_util.register_dataclass(
        XkSamplingMetadata,
        data_fields=["temperature", "top_k", "top_p", "_cache_collision_dummy", *ours],
        meta_fields=["do_sampling", "logprobs"])
    return XkSamplingMetadata


@functools.cache
def metadata_class():
    """:class:`XkSamplingMetadata` (built on first use: it subclasses tpu-inference's)."""
    return _metadata_class()


def _width(n: int) -> int:
    """A padded width for ``n`` ids: 0, or a power of two >= 8 (few compiled shapes)."""
    return 0 if n == 0 else max(8, 1 << (n - 1).bit_length())


def _ids(rows: list[list[int]], vocab: int) -> np.ndarray:
    out = np.full((len(rows), _width(max(map(len, rows), default=0))), vocab, np.int32)
    for r, ids in enumerate(rows):
        out[r, :len(ids)] = ids
    return out


def banned_next_tokens(params: Any, output: list[int]) -> list[int]:
    """The tokens a row may not draw next: the last token of each bad word whose other
    tokens end ``output``, and the stop tokens while ``output`` is shorter than
    ``min_tokens``."""
    banned = []
    for word in params.bad_words_token_ids or ():
        prefix = word[:-1]
        if len(prefix) <= len(output) and output[len(output) - len(prefix):] == prefix:
            banned.append(word[-1])
    if len(output) < params.min_tokens:
        banned.extend(params.all_stop_token_ids)
    return banned


def step_metadata(runner: Any, upstream_md: Any, padded_num_reqs: int,
                  req_ids_dp: dict | None) -> Any:
    """The step's :class:`XkSamplingMetadata`, one row per request as upstream lays its
    rows out (data-parallel rank blocks of ``padded_num_reqs // dp_size``). Call after the
    previous step's tokens are on the host when any row :func:`needs_history`."""
    from tpu_inference.utils import device_array

    vocab = runner.input_batch.vocab_size
    rows: list[Any] = [None] * padded_num_reqs
    per_rank = padded_num_reqs // max(len(req_ids_dp or {0: 0}), 1)
    for rank, ids in (req_ids_dp or {0: runner.input_batch.req_ids}).items():
        for i, req_id in enumerate(ids):
            if req_id is not None:
                rows[rank * per_rank + i] = runner.requests[req_id]
    params = [getattr(r, "sampling_params", None) for r in rows]

    def column(read, default, dtype):
        return np.array([default if p is None else read(p, r)
                         for p, r in zip(params, rows, strict=True)], dtype)

    temperature = column(lambda p, r: p.temperature if p.temperature >= SAMPLING_EPS else 0.0,
                         0.0, np.float32)
    top_k = column(lambda p, r: p.top_k if 0 < p.top_k < vocab else 0, 0, np.int32)
    top_p = column(lambda p, r: p.top_p, 1.0, np.float32)
    min_p = column(lambda p, r: p.min_p, 0.0, np.float32)
    seeds = column(lambda p, r: (p.seed or 0) % (1 << 32), 0, np.uint32)
    seeded = column(lambda p, r: p.seed is not None, False, bool)
    offsets = column(lambda p, r: r.num_tokens, 0, np.int32)
    repetition = column(lambda p, r: p.repetition_penalty, 1.0, np.float32)
    presence = column(lambda p, r: p.presence_penalty, 0.0, np.float32)
    frequency = column(lambda p, r: p.frequency_penalty, 0.0, np.float32)
    history = [p is not None and needs_history(p) for p in params]
    outputs = [list(r.output_token_ids) if h else [] for r, h in zip(rows, history, strict=True)]
    prompts = [list(r.prompt_token_ids) if p is not None and _set(p, "repetition_penalty")
               else [] for p, r in zip(params, rows, strict=True)]
    banned = [banned_next_tokens(p, o) if h else []
              for p, o, h in zip(params, outputs, history, strict=True)]
    biases = [sorted((p.logit_bias or {}).items()) if p is not None else [] for p in params]
    allowed = [list(p.allowed_token_ids or ()) if p is not None else [] for p in params]
    bias_ids = _ids([[int(t) for t, _ in b] for b in biases], vocab)
    bias_values = np.zeros(bias_ids.shape, np.float32)
    for r, b in enumerate(biases):
        bias_values[r, :len(b)] = [v for _, v in b]
    host = dict(sample_temperature=temperature, sample_top_k=top_k, sample_top_p=top_p,
                sample_min_p=min_p, seeds=seeds, seeded=seeded, offsets=offsets,
                repetition=repetition, presence=presence, frequency=frequency,
                prompt_ids=_ids(prompts, vocab), output_ids=_ids(outputs, vocab),
                banned_ids=_ids(banned, vocab), bias_ids=bias_ids, bias_values=bias_values,
                allowed_ids=_ids(allowed, vocab),
                restricted=column(lambda p, r: bool(p.allowed_token_ids), False, bool))
    replicated = jax.sharding.NamedSharding(runner.mesh, jax.sharding.PartitionSpec())
    fields = {k: device_array(runner.mesh, v, sharding=replicated) for k, v in host.items()}
    upstream = {f.name: getattr(upstream_md, f.name) for f in dataclasses.fields(upstream_md)}
    return metadata_class()(**upstream, **fields)


def process_logits(logits: Any, md: Any) -> Any:
    """``logits`` [R, V] (f32) after allowed token ids, bad words / min tokens, logit bias and
    the three penalties, as vLLM's ``Sampler.apply_logits_processors`` orders them."""
    rows, vocab = logits.shape
    r = jnp.arange(rows)[:, None]

    def mark(ids):
        return jnp.zeros((rows, vocab), bool).at[r, ids].set(True, mode="drop")

    x = logits
    if md.allowed_ids.shape[1]:
        x = jnp.where(mark(md.allowed_ids) | ~md.restricted[:, None], x, -jnp.inf)
    if md.banned_ids.shape[1]:
        x = jnp.where(mark(md.banned_ids), -jnp.inf, x)
    if md.bias_ids.shape[1]:
        x = x.at[r, md.bias_ids].add(md.bias_values, mode="drop")
    if md.output_ids.shape[1] or md.prompt_ids.shape[1]:
        counts = jnp.zeros((rows, vocab), jnp.int32).at[r, md.output_ids].add(1, mode="drop")
        generated = counts > 0
        seen = generated | mark(md.prompt_ids)
        penalty = jnp.where(seen, md.repetition[:, None], 1.0)
        x = x * jnp.where(x > 0, 1.0 / penalty, penalty)
        x = x - md.frequency[:, None] * counts - md.presence[:, None] * generated
    return x


def sample(rng: Any, mesh: Any, logits: Any, md: Any) -> tuple[Any, Any]:
    """Upstream ``sample``'s contract (``(tokens [R], logits for processed logprobs)``) for
    an :class:`XkSamplingMetadata`: processed logits, then xla-kernels' ``sample`` op. A row
    without a seed draws with a key from ``rng`` (the runner's per-step key)."""
    return _sample_jit(rng, mesh, logits, md)


@functools.partial(jax.jit, static_argnames=("mesh",))
def _sample_jit(rng, mesh, logits, md):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample.sampling import _apply_sampling_transforms

    from xla_kernels.kernels.sampling import sample as sample_op

    logits = jax.lax.with_sharding_constraint(
        logits.astype(jnp.float32), NamedSharding(mesh, P(ShardingAxisName.ATTN_DATA, None)))
    x = process_logits(logits, md)
    unseeded = jax.random.bits(rng, md.seeds.shape, jnp.uint32)
    seeds = jnp.where(md.seeded, md.seeds, unseeded)
    tokens = sample_op(x, md.sample_temperature, md.sample_top_k, md.sample_top_p,
                       md.sample_min_p, seeds, md.offsets)
    processed = x
    if md.logprobs and md.do_sampling:
        greedy = md.sample_temperature <= 0
        processed = jnp.where(greedy[:, None], x, _apply_sampling_transforms(x, md))
    tokens = jax.lax.with_sharding_constraint(tokens, NamedSharding(mesh, P()))
    return tokens, processed
