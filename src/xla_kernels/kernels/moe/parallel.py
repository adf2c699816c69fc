"""fused_moe over a device mesh: expert parallel (the experts split over one mesh axis),
tensor parallel (the intermediate dimension split over another) and the tokens split over a
third, with ``jax.shard_map`` and one ``psum``::

    out = fused_moe_sharded(hidden, router_logits, w13, w2, mesh=mesh, top_k=2,
                            expert_axis="ep", tensor_axis="tp", token_axis="dp")

* Expert parallel: each device along ``expert_axis`` holds a contiguous block of
  ``experts / ep`` experts and runs :data:`fused_moe_ep` with its block's first global id;
  routing (softmax, top-k, renormalize) still sees every expert's logit.
* Tensor parallel: each device along ``tensor_axis`` holds, for every expert, the gate rows
  and the up rows of its slice of the intermediate dimension and the matching columns of
  ``w2``. ``w13`` stacks [gate; up], so a contiguous split of its axis 1 would give the
  first device gate rows only: :func:`interleave_w13` reorders the rows (and an fp8 scale's)
  so that it does. Pass ``w13_interleaved=True`` with weights already in that order (lay
  them out once, at load time, instead of on every call).
* Each device's output is a partial sum over its experts and its intermediate slice; a
  ``psum`` over the expert and tensor axes gives the layer's output, rounded to hidden's
  dtype once per device and once by the sum (f32 inputs: the unsharded result up to f32
  rounding; bf16: up to about one bf16 rounding per partial sum).
* fp8 (pass ``w13_scale`` and ``w2_scale``): the scales split with their weights; with
  ``block_shape=(bn, bk)`` each device's intermediate slice must be a whole number of blocks
  (a multiple of bn for w13's rows and of bk for w2's columns).

Example:
    >>> import jax, numpy as np
    >>> mesh = jax.make_mesh((1,), ("ep",))
    >>> x, logits = np.ones((4, 16), np.float32), np.zeros((4, 8), np.float32)
    >>> w13, w2 = np.ones((8, 12, 16), np.float32) / 16, np.ones((8, 16, 6), np.float32) / 6
    >>> fused_moe_sharded(x, logits, w13, w2, mesh=mesh, top_k=2,
    ...                   expert_axis="ep").shape                      # doctest: +SKIP
    (4, 16)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from xla_kernels.errors import OpInputError

from . import fused_moe, fused_moe_ep, fused_moe_fp8, fused_moe_fp8_ep

OP = "fused_moe_sharded"


def interleave_w13(w13: Any, tp: int) -> Any:
    """``w13`` [experts, 2 * intermediate, ...] reordered so that a contiguous split of axis
    1 into ``tp`` parts gives part i = [gate rows of slice i; up rows of slice i], the layout
    a tensor-parallel shard of fused_moe needs. Also for w13's fp8 scales: per-channel
    [experts, 2 * intermediate, 1], and (bn, bk) block scales [experts, 2 * intermediate /
    bn, ...] when each slice is whole blocks. :func:`deinterleave_w13` is the inverse.

    Example:
        >>> import numpy as np
        >>> w = np.arange(8).reshape(1, 8, 1)      # gate rows 0-3, up rows 4-7
        >>> interleave_w13(w, 2)[0, :, 0].tolist()
        [0, 1, 4, 5, 2, 3, 6, 7]
    """
    w13 = jnp.asarray(w13)
    e, rows = w13.shape[:2]
    rest = w13.shape[2:]
    if rows % (2 * tp):
        raise OpInputError(OP, "w13", f"{rows} rows (2 * intermediate) do not split into "
                           f"gate and up halves of {tp} equal slices each",
                           "pick a tensor-parallel degree that divides the intermediate size")
    parts = w13.reshape(e, 2, tp, rows // (2 * tp), *rest)
    return jnp.swapaxes(parts, 1, 2).reshape(w13.shape)


def deinterleave_w13(w13: Any, tp: int) -> Any:
    """The inverse of :func:`interleave_w13`: back to [gate; up] rows.

    Example:
        >>> import numpy as np
        >>> w = np.arange(8).reshape(1, 8, 1)
        >>> deinterleave_w13(interleave_w13(w, 2), 2)[0, :, 0].tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """
    w13 = jnp.asarray(w13)
    e, rows = w13.shape[:2]
    parts = w13.reshape(e, tp, 2, rows // (2 * tp), *w13.shape[2:])
    return jnp.swapaxes(parts, 1, 2).reshape(w13.shape)


def _axis_size(mesh: Any, axis: str | None, arg: str) -> int:
    if axis is None:
        return 1
    if axis not in mesh.axis_names:
        raise OpInputError(OP, arg, f"mesh has no axis {axis!r} (axes: {mesh.axis_names})",
                           f"pass one of {mesh.axis_names} or None")
    return int(mesh.shape[axis])


def _check_divides(n: int, size: int, axis: str | None, what: str, arg: str) -> None:
    if n % size:
        raise OpInputError(OP, arg, f"{what} = {n} does not split evenly over the {size} "
                           f"devices of mesh axis {axis!r}",
                           f"pick a mesh axis whose size divides {what} ({n})")


def _check_blocks(inter: int, tp: int, block_shape: tuple[int, int]) -> None:
    bn, bk = block_shape
    if bn == 0 or tp == 1:
        return
    per = inter // tp
    if per % bn or per % bk:
        raise OpInputError(OP, "block_shape", f"each tensor-parallel slice of the "
                           f"intermediate size ({inter} / {tp} = {per}) must be a multiple of "
                           f"the scale blocks ({bn}, {bk})",
                           "use fewer tensor-parallel devices, so that each slice holds whole "
                           "blocks")


def fused_moe_sharded(hidden: Any, router_logits: Any, w13: Any, w2: Any, *, mesh: Any,
                      top_k: int, renormalize: bool = True, activation: str = "silu",
                      expert_axis: str | None = None, tensor_axis: str | None = None,
                      token_axis: str | None = None, w13_scale: Any = None,
                      w2_scale: Any = None, block_shape: tuple[int, int] = (0, 0),
                      w13_interleaved: bool = False) -> Any:
    """fused_moe (or fused_moe_fp8, given the scales) split over ``mesh``: the experts over
    ``expert_axis``, the intermediate dimension over ``tensor_axis``, the tokens over
    ``token_axis`` (each None: not split). Weights in fused_moe's layout (``w13`` [experts,
    2 * intermediate, hidden], gate rows then up rows), or with ``w13_interleaved=True`` in
    :func:`interleave_w13`'s (w13 and w13_scale). Returns [tokens, hidden] in hidden's dtype,
    split over ``token_axis``. See the module docstring.

    Example:
        >>> import jax, numpy as np
        >>> mesh = jax.make_mesh((1, 1), ("ep", "tp"))
        >>> x, logits = np.ones((4, 16), np.float32), np.zeros((4, 8), np.float32)
        >>> w13 = np.ones((8, 12, 16), np.float32) / 16
        >>> w2 = np.ones((8, 16, 6), np.float32) / 6
        >>> fused_moe_sharded(x, logits, w13, w2, mesh=mesh, top_k=2, expert_axis="ep",
        ...                   tensor_axis="tp").shape                 # doctest: +SKIP
        (4, 16)
    """
    fp8 = w13_scale is not None
    if fp8 != (w2_scale is not None):
        raise OpInputError(OP, "w2_scale" if fp8 else "w13_scale",
                           "pass both w13_scale and w2_scale or neither",
                           "give fp8 weights both their scales")
    used = [a for a in (expert_axis, tensor_axis, token_axis) if a is not None]
    if len(set(used)) != len(used):
        raise OpInputError(OP, "mesh", f"one mesh axis named twice in {used}",
                           "give expert, tensor and token parallel different axes")
    ep = _axis_size(mesh, expert_axis, "expert_axis")
    tp = _axis_size(mesh, tensor_axis, "tensor_axis")
    dp = _axis_size(mesh, token_axis, "token_axis")
    experts, rows = w13.shape[0], w13.shape[1]
    inter = rows // 2
    _check_divides(experts, ep, expert_axis, "experts", "expert_axis")
    _check_divides(inter, tp, tensor_axis, "intermediate", "tensor_axis")
    _check_divides(hidden.shape[0], dp, token_axis, "tokens", "token_axis")
    block_shape = (int(block_shape[0]), int(block_shape[1]))
    if fp8:
        _check_blocks(inter, tp, block_shape)
    if tp > 1 and not w13_interleaved:
        w13 = interleave_w13(w13, tp)
        if fp8:
            w13_scale = interleave_w13(w13_scale, tp)

    local_experts = experts // ep
    attrs: dict[str, Any] = dict(top_k=top_k, renormalize=renormalize, activation=activation)
    if fp8:
        attrs["block_shape"] = block_shape
    # Per-channel w2 scales are per hidden row: whole on every tensor-parallel device.
    w2_scale_tp = tensor_axis if fp8 and block_shape[0] else None
    in_specs = [P(token_axis, None), P(token_axis, None),
                P(expert_axis, tensor_axis, None), P(expert_axis, None, tensor_axis)]
    args = [hidden, router_logits, w13, w2]
    if fp8:
        in_specs += [P(expert_axis, tensor_axis, None), P(expert_axis, None, w2_scale_tp)]
        args += [w13_scale, w2_scale]
    reduce_axes = tuple(a for a in (expert_axis, tensor_axis) if a is not None)

    def shard(*a: Any) -> Any:
        if expert_axis is None:
            out = (fused_moe_fp8 if fp8 else fused_moe)(*a, **attrs)
        else:
            offset = (jax.lax.axis_index(expert_axis) * local_experts).astype(jnp.int32)
            out = (fused_moe_fp8_ep if fp8 else fused_moe_ep)(*a, offset, **attrs)
        return jax.lax.psum(out, reduce_axes) if reduce_axes else out

    if any(mesh.axis_types[mesh.axis_names.index(a)] == AxisType.Explicit for a in used):
        # Explicit axes: shard_map takes arrays already split as in_specs says.
        args = [jax.reshard(a, NamedSharding(mesh, spec)) for a, spec in zip(args, in_specs,
                                                                             strict=True)]
    return jax.shard_map(shard, mesh=mesh, in_specs=tuple(in_specs),
                         out_specs=P(token_axis, None))(*args)


__all__ = ["deinterleave_w13", "fused_moe_sharded", "interleave_w13"]
