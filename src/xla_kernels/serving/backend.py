"""The implementations one serving run computes with, resolved once from its options.

A :class:`Backend` names, for every role of the step, what runs it: the paged cache write
and attention (:class:`~xla_kernels.serving.attention.Attention`, ``--attention``), a
mixture-of-experts model's experts (:class:`~xla_kernels.serving.moe.Experts`, ``--moe``),
the decoder's projections (:class:`~xla_kernels.serving.quantize.Projection`: a matmul in the
model's dtype, or ``--weights fp8`` through ``fp8_linear`` or ``fp8_linear_xla``) and how
the next token is picked (:class:`~xla_kernels.serving.sampling.Sampling`).
:func:`resolve_backend` is the one place the options' words are checked and turned into
these; the JAX and torchax models take the result and never see an option string.

Example:
    >>> from xla_kernels.serving.config import preset
    >>> backend = resolve_backend(preset("tiny-moe"), "plain-xla", moe="ragged-dot")
    >>> backend.attention, backend.experts
    (<Attention.PLAIN_XLA: 'plain-xla'>, <Experts.RAGGED_DOT: 'ragged-dot'>)
    >>> resolve_backend(preset("tiny").with_weights("fp8-dynamic")).projection
    Projection(scheme='dynamic', kernel=True)
    >>> try:
    ...     resolve_backend(preset("tiny"), moe="ragged-dot")
    ... except ServingConfigError as e:
    ...     print(e)                                      # doctest: +NORMALIZE_WHITESPACE
    --moe ragged-dot: model 'tiny' is dense (no experts), so there is no MoE layer to
    run. Fix: pass a mixture-of-experts preset (--preset tiny-moe or moe), or drop --moe.
"""

from __future__ import annotations

import dataclasses
import enum

from xla_kernels.serving.attention import Attention
from xla_kernels.serving.config import (
    ATTENTIONS,
    FRONTENDS,
    MOE_IMPLEMENTATIONS,
    PRESETS,
    ModelConfig,
    ServingConfigError,
    check_choice,
)
from xla_kernels.serving.moe import Experts
from xla_kernels.serving.quantize import ACTIVATION_SCHEMES, Projection
from xla_kernels.serving.sampling import Sampling


class Frontend(enum.Enum):
    """Who writes the model (``--frontend``): :mod:`.model_jax` or :mod:`.model_torch`."""

    JAX = "jax"
    TORCHAX = "torchax"


@dataclasses.dataclass(frozen=True)
class Backend:
    """What computes each role of a serving step (see the module doc). ``experts`` is None
    for a dense model, which has none."""

    attention: Attention
    experts: Experts | None
    projection: Projection
    sampling: Sampling = dataclasses.field(default_factory=Sampling)

    def check(self, config: ModelConfig) -> None:
        """Refuse a backend resolved for another kind of model (dense vs. experts, fp8
        projections vs. not) before anything is traced.

        Example:
            >>> from xla_kernels.serving.config import preset
            >>> try:
            ...     resolve_backend(preset("tiny")).check(preset("tiny").with_weights("fp8"))
            ... except ServingConfigError as e:
            ...     print(e)                              # doctest: +NORMALIZE_WHITESPACE
            a backend resolved for model weights runs a model with fp8 weights. Fix:
            resolve the backend from the model it runs (resolve_backend(config, ...)).
        """
        fix = "Fix: resolve the backend from the model it runs (resolve_backend(config, ...))."
        if self.projection.fp8 != (config.weights != "model"):
            built = "fp8" if self.projection.fp8 else "model"
            raise ServingConfigError(f"a backend resolved for {built} weights runs a model "
                                     f"with {config.weights} weights. {fix}")
        if (self.experts is None) != (not config.num_experts):
            kind = "a dense model" if self.experts is None else "a mixture of experts"
            raise ServingConfigError(f"a backend resolved for {kind} runs model "
                                     f"{config.name!r}. {fix}")


def resolve_backend(config: ModelConfig, attention: str = "xla-kernels", moe: str = "auto",
                    sampling: Sampling | None = None) -> Backend:
    """The :class:`Backend` of ``--attention attention`` and ``--moe moe`` for ``config``
    (its ``weights`` format picks the projections), picking tokens as ``sampling`` says
    (default greedy). A bad word, or ``--moe`` other than ``auto`` on a dense model (it
    would change nothing, and a run labelled with an MoE it never ran would mislead a
    comparison), is a :class:`ServingConfigError` naming the option and the fix."""
    kernels = Attention(check_choice("--attention", attention, ATTENTIONS))
    check_choice("--moe", moe, MOE_IMPLEMENTATIONS)
    if moe != "auto" and not config.num_experts:
        moes = [name for name, entry in PRESETS.items() if entry.model.num_experts]
        spelled = " or ".join([", ".join(moes[:-1]), moes[-1]] if len(moes) > 1 else moes)
        raise ServingConfigError(
            f"--moe {moe}: model {config.name!r} is dense (no experts), so there is no MoE "
            f"layer to run. Fix: pass a mixture-of-experts preset (--preset {spelled}), or "
            "drop --moe.")
    experts = Experts(attention if moe == "auto" else moe) if config.num_experts else None
    return _backend(config, kernels, experts, sampling or Sampling())


def plain_xla_backend(config: ModelConfig) -> Backend:
    """Every role of ``config``'s step in plain XLA, greedy: the dense reference's."""
    return _backend(config, Attention.PLAIN_XLA,
                    Experts.PLAIN_XLA if config.num_experts else None, Sampling())


def resolve_frontend(frontend: str) -> Frontend:
    """The :class:`Frontend` of ``--frontend frontend``."""
    return Frontend(check_choice("--frontend", frontend, FRONTENDS))


def _backend(config: ModelConfig, attention: Attention, experts: Experts | None,
             sampling: Sampling) -> Backend:
    scheme = ACTIVATION_SCHEMES.get(config.weights)
    projection = Projection(scheme, kernel=scheme is not None
                            and attention is Attention.KERNELS)
    return Backend(attention, experts, projection, sampling)


__all__ = ["Backend", "Frontend", "plain_xla_backend", "resolve_backend", "resolve_frontend"]
