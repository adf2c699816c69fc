"""The serving models' mixture-of-experts layer (presets with ``num_experts > 0``), for both
frontends: the router's logits, then one of three implementations of the experts
(``--moe``, :data:`~xla_kernels.serving.config.MOE_IMPLEMENTATIONS`):

* ``xla-kernels``: ``fused_moe``, the library's custom call;
* ``ragged-dot``: ``fused_moe_ragged_dot``, the (token, expert) pairs sorted by expert, the
  tokens' rows gathered, two ``jax.lax.ragged_dot`` grouped GEMMs, a scatter-add (the peer
  ``benchmarks/moe.py`` times);
* ``plain-xla``: ``fused_moe_xla``, every expert over every token (the plain-XLA fallback,
  and the dense reference's).

``--moe auto`` (the default) takes the one ``--attention`` names: ``fused_moe`` under
``--attention xla-kernels``, ``fused_moe_xla`` under ``--attention plain-xla``
(:func:`~xla_kernels.serving.backend.resolve_backend` decides; :class:`Experts` is the
decision).

Example:
    >>> import jax.numpy as jnp
    >>> from xla_kernels.serving.config import preset
    >>> cfg = preset("tiny-moe")
    >>> x = jnp.ones((3, 128))
    >>> w = {"gate": jnp.zeros((8, 128)), "w13": jnp.ones((8, 128, 128)) / 128,
    ...      "w2": jnp.ones((8, 128, 64)) / 64}
    >>> moe(Experts.PLAIN_XLA, cfg, x, w["gate"], w["w13"], w["w2"]).shape
    (3, 128)
    >>> Experts("ragged-dot"), Experts.KERNELS.kernel
    (<Experts.RAGGED_DOT: 'ragged-dot'>, True)
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from xla_kernels.serving.config import ModelConfig


class Experts(enum.Enum):
    """Which implementation computes a mixture-of-experts layer's experts (``--moe`` once
    ``auto`` is resolved; the values are the option's words)."""

    KERNELS = "xla-kernels"
    RAGGED_DOT = "ragged-dot"
    PLAIN_XLA = "plain-xla"

    @property
    def kernel(self) -> bool:
        """Whether ``fused_moe``'s kernel computes the layer (a torch operator too)."""
        return self is Experts.KERNELS

    def jax_function(self) -> Callable[..., Any]:
        """The JAX function, called as ``fn(hidden, router_logits, w13, w2, *, top_k)``."""
        from xla_kernels.kernels.moe import fused_moe, fused_moe_ragged_dot, fused_moe_xla

        return {Experts.KERNELS: fused_moe, Experts.RAGGED_DOT: fused_moe_ragged_dot,
                Experts.PLAIN_XLA: fused_moe_xla}[self]


def moe(experts: Experts, config: ModelConfig, x: Any, router: Any, w13: Any,
        w2: Any) -> Any:
    """The layer's output for ``x`` [..., hidden] computed by ``experts``: router [experts,
    hidden], w13 [experts, 2 * moe_intermediate, hidden] (gate; up), w2 [experts, hidden,
    moe_intermediate]."""
    rows = x.reshape(-1, x.shape[-1])
    logits = rows @ router.T
    fn = experts.jax_function()
    return fn(rows, logits, w13, w2, top_k=config.experts_per_token).reshape(x.shape)


__all__ = ["Experts", "moe"]
