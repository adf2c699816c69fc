"""Tensor parallelism of the serving step: the kv heads split over a 1-D mesh (axis "tp").

With ``tp`` devices, Megatron-style:

* the KV caches [num_blocks, block_size, kv_heads, dim] are sharded along kv heads, so each
  device's ``reshape_and_cache`` and ``ragged_paged_attention`` custom calls work on their
  own ``kv_heads / tp`` heads (the ops' sharding rules keep them local: no gather);
* q/k/v and the MLP's gate/up projections (torch layout [out, in]) are sharded along their
  output dimension (heads, intermediate), o_proj and down_proj along their input dimension:
  each device's partial sums meet in one all-reduce after o_proj and one after down_proj;
* embeddings, norms, the LM head and the step's batch are replicated;
* fp8 projections (``--weights fp8``) are placed like their weights; their per-output-channel
  scales [out, 1] split with a column-parallel weight's rows and are replicated for a
  row-parallel one (whose output channels every device holds).

:func:`place` puts a runner's weights and caches there and gives the ``jax.jit`` shardings
that keep the donated caches sharded from step to step; with ``tp=1`` it changes nothing.

Example:
    >>> weight_spec("layers.0.self_attn.k_proj.weight")
    P('tp', None)
    >>> weight_spec("layers.0.mlp.down_proj.weight")
    P(None, 'tp')
    >>> weight_spec("lm_head.weight")
    P()
    >>> weight_spec("layers.0.self_attn.q_proj.weight_scale")
    P('tp', None)
    >>> weight_spec("layers.0.mlp.down_proj.weight_scale")
    P()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from xla_kernels.serving.config import (
    EngineConfig,
    ModelConfig,
    ServingConfigError,
    cache_shape,
)

AXIS = "tp"
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


def check_tp(config: ModelConfig, tp: int, devices: Sequence[Any]) -> int:
    """``tp`` if the model splits ``tp`` ways over the visible ``devices``, else a
    :class:`ServingConfigError` with the fix.

    Example:
        >>> from xla_kernels.serving.config import preset
        >>> check_tp(preset("tiny"), 1, ["cpu0"])
        1
        >>> try:
        ...     check_tp(preset("tiny"), 4, ["cpu0"] * 4)
        ... except ServingConfigError as e:
        ...     print(e)
        --tp 4 does not divide the 2 kv heads of model 'tiny'. Fix: pass --tp 1 or 2.
    """
    if tp < 1:
        raise ServingConfigError(f"--tp {tp}: must be >= 1. Fix: pass --tp 1 or more.")
    if tp > 1 and config.num_experts:
        raise ServingConfigError(
            f"--tp {tp}: model {config.name!r} has experts, and fused_moe splits only "
            "along tokens (no expert or intermediate parallelism yet). Fix: pass --tp 1.")
    if tp > 1 and config.weights == "fp8-dynamic":
        raise ServingConfigError(
            f"--tp {tp} with --weights fp8-dynamic: o_proj and down_proj split along their "
            "input would quantize each device's slice of the activations with its own "
            "per-token scale, which the one-device reference does not model. Fix: pass "
            "--weights fp8 (weight-only) with --tp, or --tp 1.")
    kv = config.num_kv_heads                   # q heads are a multiple: they divide too
    if kv % tp or config.intermediate_size % tp:
        fits = [n for n in range(1, kv + 1) if not kv % n and not config.intermediate_size % n]
        spelled = ", ".join(map(str, fits[:-1])) + f" or {fits[-1]}" if len(fits) > 1 \
            else str(fits[0])
        what = (f"the {kv} kv heads" if kv % tp
                else f"the intermediate size {config.intermediate_size}")
        raise ServingConfigError(f"--tp {tp} does not divide {what} of model "
                                 f"{config.name!r}. Fix: pass --tp {spelled}.")
    if tp > len(devices):
        raise ServingConfigError(
            f"--tp {tp} needs {tp} devices, JAX sees {len(devices)} on this platform. Fix: "
            f"pass --tp {len(devices)} or less, or run where {tp} GPUs are visible (on the "
            f"CPU, XLA_FLAGS=--xla_force_host_platform_device_count={tp} fakes them).")
    return tp


def weight_spec(name: str) -> Any:
    """The PartitionSpec of weight ``name`` (torch layout [out, in]) over the "tp" axis."""
    from jax.sharding import PartitionSpec as P

    module, tensor = name.rsplit(".", 2)[-2:]
    if module in COLUMN_PARALLEL:
        return P(AXIS, None)
    if module in ROW_PARALLEL:
        return P() if tensor == "weight_scale" else P(None, AXIS)
    return P()


@dataclasses.dataclass(frozen=True)
class Placement:
    """A runner's arrays placed for ``tp`` devices, and the shardings its step is jitted
    with (``jit_kwargs``: empty for one device, where the arrays are left as they are)."""

    weights: dict[str, Any]
    caches: tuple[tuple[Any, Any], ...]
    batch_sharding: Any        # None: the default device
    jit_kwargs: dict[str, Any]
    mesh: Any                  # None for one device


def zero_caches(config: ModelConfig, engine: EngineConfig, sharding: Any = None
                ) -> tuple[tuple[Any, Any], ...]:
    """Zeroed (key, value) caches in ``config.cache_dtype``, one pair per layer, on the
    default device or, given a ``sharding``, made in place on its devices (no whole cache on
    one device)."""
    import jax.numpy as jnp

    shape = cache_shape(config, engine)
    return tuple((jnp.zeros(shape, config.cache_dtype, device=sharding),
                  jnp.zeros(shape, config.cache_dtype, device=sharding))
                 for _ in range(config.num_layers))


def place(config: ModelConfig, engine: EngineConfig, weights: dict[str, Any], tp: int,
          devices: Sequence[Any] | None = None) -> Placement:
    """Shard ``weights`` and fresh zeroed caches over the first ``tp`` of ``devices``
    (default: JAX's devices), as the module doc says.

    Example (one device: nothing moves):
        >>> from xla_kernels.serving.config import preset
        >>> from xla_kernels.serving.weights import init_weights
        >>> cfg = preset("tiny")
        >>> p = place(cfg, EngineConfig(num_blocks=4), init_weights(cfg), tp=1)
        >>> p.mesh, p.jit_kwargs, p.caches[0][0].shape
        (None, {}, (4, 16, 2, 64))
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices() if devices is None else list(devices)
    check_tp(config, tp, devices)
    if tp == 1:
        return Placement(weights, zero_caches(config, engine), None, {}, None)
    mesh = Mesh(np.array(devices[:tp]), (AXIS,))
    weight_shardings = {name: NamedSharding(mesh, weight_spec(name)) for name in weights}
    cache = NamedSharding(mesh, P(None, None, AXIS, None))
    caches = zero_caches(config, engine, sharding=cache)
    cache_shardings = tuple((cache, cache) for _ in caches)
    replicated = NamedSharding(mesh, P())
    return Placement(
        weights=jax.device_put(weights, weight_shardings), caches=caches,
        batch_sharding=replicated, mesh=mesh,
        jit_kwargs={"in_shardings": (weight_shardings, cache_shardings, replicated),
                    "out_shardings": (replicated, cache_shardings)})


__all__ = ["AXIS", "Placement", "check_tp", "place", "weight_spec", "zero_caches"]
