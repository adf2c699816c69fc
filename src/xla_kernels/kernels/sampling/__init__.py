"""``sample``: one token per row of logits, drawn on the device with per-row temperature,
top-k, top-p and min-p, seeded and reproducible.

::

    tokens = sample(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    # logits f32/bf16/f16 [rows, vocab]; temperature, top_p, min_p f32 [rows];
    # top_k i32 [rows]; seeds u32 (or i32) [rows]; offsets i32 (or u32) [rows]
    # -> tokens i32 [rows]

Row ``r`` draws from ``softmax(logits[r] / temperature[r])`` restricted to the tokens that
every enabled filter keeps, renormalized. The filters, as vLLM and FlashInfer
(``filter_apply_order="top_k_first"``) apply them:

1. **min-p** (``0 < min_p``): keep tokens with ``p >= min_p * p_max``;
   **top-k** (``0 < top_k < vocab``): keep tokens whose logit is >= the k-th largest.
   Both keep the most likely tokens, so their order does not matter: the result is the
   smaller set.
2. **top-p** (``top_p < 1``), on what 1. kept, renormalized: keep the smallest set of the
   most likely tokens whose probability reaches ``top_p``.

Filters are thresholds on the logit, so tokens with equal logits are kept or dropped
together (top-k may keep more than k tokens when the k-th logit is tied; ``top_p <= 0`` keeps
only the most likely logit's tokens). A value outside a filter's range turns it off
(``top_k <= 0`` or ``>= vocab``, ``top_p >= 1`` or NaN, ``min_p <= 0`` or NaN); ``min_p > 1``
counts as 1. ``temperature <= 0`` (or NaN) is greedy: the argmax, ties to the lowest index,
and so is a row whose largest logit is +inf or NaN. ``-inf`` logits are never drawn.

**Randomness**: the draw of row ``r`` uses Philox4x32-10 with key ``(seeds[r], 0)`` and
counter ``(offsets[r], 0, 0, 0)``, and nothing else: the same seed, offset and logits give the
same token whatever the batch, its order or the platform. A serving loop passes the
request's seed and its position (e.g. the number of tokens so far) so every step draws
afresh.

**What it samples, exactly** (``sampling_core.h``): each token's weight is the integer
``floor(2^40 * exp((x - x_max) / T))``, with ``exp`` from a polynomial of relative error
2e-8, so a token less likely than ``2^-40`` (1e-12) times the most likely one is never
drawn; masses are exact integer sums; the draw is the inverse CDF of a 64-bit random
number over the kept tokens in a fixed order. The CPU and CUDA kernels compute the same
integers and pick the **same token** (tests/gpu/test_sampling_gpu.py checks it).

Kernels: CPU (``sampling_cpu.cc``: selection and sorting) and CUDA (``sampling.cu``:
sort-free, a row read by a cluster of 8 blocks of 512 threads on Hopper, threshold searches
by counting above pivots; see ``docs/design/sampling.md``).

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> logits = jnp.array([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]], jnp.float32)
    >>> rows = lambda v, dt: jnp.full((2,), v, dt)
    >>> sample(logits, rows(0.0, jnp.float32), rows(0, jnp.int32), rows(1.0, jnp.float32),
    ...        rows(0.0, jnp.float32), jnp.arange(2, dtype=jnp.uint32),
    ...        rows(0, jnp.int32)).tolist()                          # doctest: +SKIP
    [1, 0]
"""

from __future__ import annotations

from xla_kernels.op import Invalid, Kernel, Op, Spec, Tensor

LOGIT_DTYPES = ("f32", "bf16", "f16")
SEED_DTYPES = ("u32", "i32")
OFFSET_DTYPES = ("i32", "u32")
MAX_VOCAB = 2**31 - 1
PER_ROW = ("temperature", "top_k", "top_p", "min_p", "seeds", "offsets")


def _output_rule(logits: Spec, temperature: Spec, top_k: Spec, top_p: Spec, min_p: Spec,
                 seeds: Spec, offsets: Spec) -> Spec:
    rows, vocab = logits.shape
    if vocab == 0 and rows:
        raise Invalid("logits", f"shape {logits.shape} has an empty vocabulary",
                      "pass at least one logit per row")
    if vocab > MAX_VOCAB:
        raise Invalid("logits", f"vocabulary of {vocab} exceeds {MAX_VOCAB}",
                      "split the vocabulary")
    given = dict(zip(PER_ROW, (temperature, top_k, top_p, min_p, seeds, offsets), strict=True))
    for name, spec in given.items():
        if spec.shape != (rows,):
            raise Invalid(name, f"expected shape ({rows},) (one value per row of logits), "
                                f"got {spec.shape}",
                          f"pass a [rows] array, e.g. jnp.full(({rows},), value)")
    return Spec((rows,), "i32")


sample = Op(
    "xla_kernels.sample",
    inputs=[
        Tensor("logits", dtypes=LOGIT_DTYPES, rank=2, doc="[rows, vocab]"),
        Tensor("temperature", dtypes=("f32",), rank=1, doc="[rows]; <= 0: greedy"),
        Tensor("top_k", dtypes=("i32",), rank=1, doc="[rows]; <= 0 or >= vocab: off"),
        Tensor("top_p", dtypes=("f32",), rank=1, doc="[rows]; >= 1: off"),
        Tensor("min_p", dtypes=("f32",), rank=1, doc="[rows]; <= 0: off"),
        Tensor("seeds", dtypes=SEED_DTYPES, rank=1, doc="[rows] Philox keys"),
        Tensor("offsets", dtypes=OFFSET_DTYPES, rank=1, doc="[rows] Philox counters (step)"),
    ],
    outputs=_output_rule,
    output_names=("tokens",),
    # Rows split freely; a row's vocabulary must be whole on one device.
    sharding_rule=("b v, b, b, b, b, b, b -> b", {"need_replication_factors": ("v",)}),
    kernels={"cpu": Kernel(["sampling_cpu.cc"], handler="XkSampleCpu"),
             "cuda": Kernel(["sampling.cu"], handler="XkSampleCuda")},
    doc=__doc__ or "",
)

__all__ = ["LOGIT_DTYPES", "MAX_VOCAB", "OFFSET_DTYPES", "SEED_DTYPES", "sample"]
