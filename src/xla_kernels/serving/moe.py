"""The serving models' mixture-of-experts layer (presets with ``num_experts > 0``), for both
frontends: the router's logits, then ``fused_moe`` (``--attention xla-kernels``: the library's
custom calls) or its plain-XLA fallback ``fused_moe_xla`` (``--attention plain-xla``, and the
dense reference).

Example:
    >>> import jax.numpy as jnp
    >>> from xla_kernels.serving.config import preset
    >>> cfg = preset("tiny-moe")
    >>> x = jnp.ones((3, 128))
    >>> w = {"gate": jnp.zeros((8, 128)), "w13": jnp.ones((8, 128, 128)) / 128,
    ...      "w2": jnp.ones((8, 128, 64)) / 64}
    >>> moe("plain-xla", cfg, x, w["gate"], w["w13"], w["w2"]).shape
    (3, 128)
"""

from __future__ import annotations

from typing import Any

from xla_kernels.serving.config import ModelConfig


def kernel_runs(implementation: str) -> bool:
    """Whether ``fused_moe``'s kernel computes the layer (``--attention xla-kernels``)."""
    return implementation == "xla-kernels"


def moe(implementation: str, config: ModelConfig, x: Any, router: Any, w13: Any,
        w2: Any) -> Any:
    """The layer's output for ``x`` [..., hidden]: router [experts, hidden], w13 [experts,
    2 * moe_intermediate, hidden] (gate; up), w2 [experts, hidden, moe_intermediate]."""
    from xla_kernels.kernels.moe import fused_moe, fused_moe_xla

    rows = x.reshape(-1, x.shape[-1])
    logits = rows @ router.T
    fn = fused_moe if kernel_runs(implementation) else fused_moe_xla
    return fn(rows, logits, w13, w2, top_k=config.experts_per_token).reshape(x.shape)


__all__ = ["kernel_runs", "moe"]
