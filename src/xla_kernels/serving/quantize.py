"""fp8 weights in the serving loop (``serve-bench --weights fp8`` and ``fp8-dynamic``).

At load, ``weights.init_weights`` stores every decoder projection (q/k/v/o, gate/up/down)
as e4m3 values (:func:`quantize_e4m3`) with one f32 scale per output channel (vLLM's fp8 checkpoint
layout: ``<name>.weight`` [out, in] e4m3, ``<name>.weight_scale`` [out, 1]), on the device
the weights live on. Embeddings, norms and the LM head keep the model's dtype.
:class:`Projection` says how every projection runs, :func:`fp8_project` runs an fp8 one:
with the library's ``fp8_linear`` op (``--attention xla-kernels``) or its plain-XLA path
``fp8_linear_xla`` (``plain-xla``, and the dense reference), weight-only (``fp8``: W8A16)
or with per-token activation scales (``fp8-dynamic``: W8A8). :func:`weight_bytes` counts
what one step reads of the weights.

Example:
    >>> import numpy as np
    >>> q, s = quantize_e4m3(np.array([[1.0, -2.0], [0.5, 0.25]], np.float32))
    >>> str(q.dtype), s.ravel().tolist()
    ('float8_e4m3fn', [0.004464285913854837, 0.0011160714784637094])
    >>> is_projection("layers.3.mlp.down_proj.weight"), is_projection("lm_head.weight")
    (True, False)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from xla_kernels.serving.config import ModelConfig
from xla_kernels.serving.tp import AXIS, COLUMN_PARALLEL, ROW_PARALLEL, weight_spec

PROJECTIONS = COLUMN_PARALLEL + ROW_PARALLEL
ACTIVATION_SCHEMES = {"fp8": "none", "fp8-dynamic": "dynamic"}
"""``fp8_linear``'s ``activation_scheme`` of each fp8 weight format."""

def is_projection(name: str) -> bool:
    """Whether parameter ``name`` is a decoder projection's weight (what fp8 quantizes)."""
    parts = name.rsplit(".", 2)
    return len(parts) == 3 and parts[-1] == "weight" and parts[-2] in PROJECTIONS


def quantize_e4m3(w: Any) -> tuple[Any, Any]:
    """(e4m3 values [out, in], f32 scales [out, 1]) of ``w`` [out, in], in JAX on ``w``'s
    device: each row scaled so that its largest magnitude maps to 448, the largest e4m3
    value, then rounded to nearest even (``fp8_weights.fp8_quantize``'s rule, whose NumPy
    division by 448 may differ from this by an ulp of the scale). It is the per-row rule
    ``fp8_linear`` applies to activations (``quantize_activations``: scale ``max(amax,
    1e-12) * f32(1 / 448)``, the same bits on every platform), here applied to a weight's
    output channels."""
    from xla_kernels.kernels.fp8_linear.reference import quantize_activations

    return quantize_activations(w)


@dataclasses.dataclass(frozen=True)
class Projection:
    """How the decoder's q/k/v/o and gate/up/down projections run: ``scheme`` None, a
    matmul in the model's dtype; else fp8 weights with ``fp8_linear``'s
    ``activation_scheme`` (``"none"``: W8A16, ``"dynamic"``: W8A8), computed by the
    ``fp8_linear`` op (``kernel``) or ``fp8_linear_xla``.

    Example:
        >>> import numpy as np
        >>> x, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
        >>> Projection()(x, w).shape, Projection().fp8, Projection("none").fp8
        ((2, 4), False, True)
    """

    scheme: str | None = None
    kernel: bool = False

    @property
    def fp8(self) -> bool:
        return self.scheme is not None

    def __call__(self, x: Any, weight: Any, scale: Any = None, *, mesh: Any = None) -> Any:
        """``x`` [..., in] times ``weight`` [out, in] transposed (torch layout); an fp8
        weight dequantized with ``scale`` [out, 1], summed over ``mesh`` when row-parallel
        (see :func:`fp8_project`)."""
        if self.scheme is None:
            return x @ weight.T
        return fp8_project(x, weight, scale, scheme=self.scheme, kernel=self.kernel, mesh=mesh)


def fp8_project(x: Any, weight: Any, scale: Any, *, scheme: str, kernel: bool,
                mesh: Any = None) -> Any:
    """``x`` [..., in] times the fp8 ``weight`` [out, in] (dequantized with ``scale`` [out,
    1]) transposed: [..., out] in x's dtype. ``kernel``: the ``fp8_linear`` op, else
    ``fp8_linear_xla``. ``mesh``: a row-parallel projection whose weight and ``x`` are split
    along ``in`` over its "tp" axis: each device multiplies its slice and the partial sums
    are added (one all-reduce), rather than gathering the weight (what the op's sharding
    rule alone would do, since its ``in`` axis must stay whole).

    Example:
        >>> import numpy as np
        >>> q, s = quantize_e4m3(np.eye(4, dtype=np.float32))
        >>> x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)        # [..., in]
        >>> fp8_project(x, q, s, scheme="none", kernel=False)[..., 0].tolist()
        [[0.0], [4.0]]
    """
    import jax

    from xla_kernels.kernels.fp8_linear import fp8_linear, fp8_linear_xla

    fn = fp8_linear if kernel else fp8_linear_xla

    def local(rows: Any, w: Any, s: Any) -> Any:
        return fn(rows, w, s, activation_scheme=scheme)

    rows = x.reshape(-1, x.shape[-1])
    if mesh is None:
        y = local(rows, weight, scale)
    else:
        from jax.sharding import PartitionSpec as P

        def partial_sum(rows: Any, w: Any, s: Any) -> Any:
            return jax.lax.psum(local(rows, w, s), AXIS)

        y = jax.shard_map(partial_sum, mesh=mesh, in_specs=(P(None, AXIS), P(None, AXIS), P()),
                          out_specs=P(), check_vma=False)(rows, weight, scale)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def weight_bytes(weights: dict[str, Any], config: ModelConfig, tp: int = 1) -> dict[str, Any]:
    """What a step reads of ``weights``: ``format``; ``bytes_read_per_step``, every weight
    but the token embedding (a step gathers only its rows), fp8 values and scales included;
    ``per_device`` with ``tp`` devices (split tensors count 1 / tp); ``projection_bytes``,
    the q/k/v/o and gate/up/down part. A mixture of experts counts every expert (an upper
    bound: a step reads only the routed ones).

    Example:
        >>> import numpy as np
        >>> from xla_kernels.serving.config import preset
        >>> w = {"embed_tokens.weight": np.zeros((512, 128), np.float32),
        ...      "layers.0.self_attn.q_proj.weight": np.zeros((256, 128), np.uint8),
        ...      "layers.0.self_attn.q_proj.weight_scale": np.zeros((256, 1), np.float32)}
        >>> read = weight_bytes(w, preset("tiny").with_weights("fp8"), tp=2)
        >>> read["format"], read["bytes_read_per_step"], read["per_device"]
        ('fp8', 33792, 16896)
    """
    total = per_device = projections = 0
    for name, value in weights.items():
        if name == "embed_tokens.weight":
            continue
        size = int(value.size) * value.dtype.itemsize
        total += size
        split = tp > 1 and any(weight_spec(name))
        per_device += size // tp if split else size
        if name.rsplit(".", 2)[-2] in PROJECTIONS:
            projections += size
    return {"format": config.weights, "bytes_read_per_step": total, "per_device": per_device,
            "projection_bytes": projections}


__all__ = ["ACTIVATION_SCHEMES", "PROJECTIONS", "Projection", "fp8_project", "is_projection",
           "quantize_e4m3", "weight_bytes"]
