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
``--attention xla-kernels``, ``fused_moe_xla`` under ``--attention plain-xla``.

Example:
    >>> import jax.numpy as jnp
    >>> from xla_kernels.serving.config import preset
    >>> cfg = preset("tiny-moe")
    >>> x = jnp.ones((3, 128))
    >>> w = {"gate": jnp.zeros((8, 128)), "w13": jnp.ones((8, 128, 128)) / 128,
    ...      "w2": jnp.ones((8, 128, 64)) / 64}
    >>> moe("plain-xla", cfg, x, w["gate"], w["w13"], w["w2"]).shape
    (3, 128)
    >>> moe_implementation("xla-kernels", "auto"), moe_implementation("plain-xla", "ragged-dot")
    ('xla-kernels', 'ragged-dot')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xla_kernels.serving.config import MOE_IMPLEMENTATIONS, ModelConfig, check_choice


def moe_implementation(attention: str, choice: str = "auto") -> str:
    """The experts' implementation for ``--attention attention`` and ``--moe choice``:
    ``choice``, or with ``auto`` the attention's (``xla-kernels`` or ``plain-xla``)."""
    check_choice("--moe", choice, MOE_IMPLEMENTATIONS)
    return attention if choice == "auto" else choice


def kernel_runs(implementation: str) -> bool:
    """Whether ``fused_moe``'s kernel computes the layer (``--moe xla-kernels``, or ``auto``
    under ``--attention xla-kernels``)."""
    return implementation == "xla-kernels"


def jax_function(implementation: str) -> Callable[..., Any]:
    """The JAX function of ``implementation`` (a resolved one: not ``auto``), called as
    ``fn(hidden, router_logits, w13, w2, *, top_k)``."""
    from xla_kernels.kernels.moe import fused_moe, fused_moe_ragged_dot, fused_moe_xla

    check_choice("--moe", implementation, MOE_IMPLEMENTATIONS[1:])
    return {"xla-kernels": fused_moe, "ragged-dot": fused_moe_ragged_dot,
            "plain-xla": fused_moe_xla}[implementation]


def moe(implementation: str, config: ModelConfig, x: Any, router: Any, w13: Any,
        w2: Any) -> Any:
    """The layer's output for ``x`` [..., hidden] computed by ``implementation`` (a resolved
    one, see :func:`moe_implementation`): router [experts, hidden], w13 [experts,
    2 * moe_intermediate, hidden] (gate; up), w2 [experts, hidden, moe_intermediate]."""
    rows = x.reshape(-1, x.shape[-1])
    logits = rows @ router.T
    fn = jax_function(implementation)
    return fn(rows, logits, w13, w2, top_k=config.experts_per_token).reshape(x.shape)


__all__ = ["jax_function", "kernel_runs", "moe", "moe_implementation"]
