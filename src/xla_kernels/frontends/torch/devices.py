"""One device per call: every tensor input of an op's torch operator on the same device.

A kernel gets raw pointers: a tensor on another device (a CPU tensor beside CUDA ones,
tensors on two GPUs, a ``meta`` tensor, which has no memory) would be read as if it lived
where the others do. Every torch path checks with :func:`check_devices` before anything
runs: the eager kernels (Python, and the native planner, which the C++ kernel asks for any
call whose tensors are not all on one device), the autograd gate's differentiable path and
the fake kernel (torch dispatches a call with any ``meta`` input to it). ``meta`` tensors
run only the shape rule, and only when every input is on ``meta``.

Example:
    >>> import torch
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> check_devices(simple_add, (torch.ones(2), torch.ones(2)))
    device(type='cpu')
    >>> try:
    ...     check_devices(simple_add, (torch.ones(2), torch.ones(2, device="meta")))
    ... except OpInputError as e:
    ...     print(e.arg, "|", e.problem)
    b | is on meta, while 'a' is on cpu
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from xla_kernels.errors import OpInputError
from xla_kernels.op import Op

__all__ = ["check_devices", "device_error"]


def check_devices(op: Op, tensors: Sequence[torch.Tensor], *, eager: bool = False
                  ) -> torch.device:
    """The one device of ``tensors`` (whole ``torch.device`` objects compared, index
    included: ``cuda:0`` is not ``cuda:1``), or :class:`~xla_kernels.errors.OpInputError`
    naming the argument on another device, its device, the others' and the fix. ``eager``:
    a kernel is about to read the tensors' memory, so ``meta`` (no memory) is refused too.

    Example:
        >>> import torch
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> check_devices(simple_add, (torch.ones(1, device="meta"),) * 2)
        device(type='meta')
    """
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise device_error(op, tensors)
    if eager and device.type == "meta":
        raise OpInputError(op.name, _name(op, 0), "is on meta (no data), and an eager "
                           "kernel must read its inputs' memory", "pass tensors on cpu or "
                           "cuda (meta tensors run only the op's shape rule)")
    return device


def device_error(op: Op, tensors: Sequence[torch.Tensor]) -> OpInputError:
    """The error of a call whose ``tensors`` are not all on one device.

    The device most inputs are on (``meta`` only when all are; ties: the earliest) is the
    call's; the first input elsewhere is named.

    Example:
        >>> import torch
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> e = device_error(simple_add, (torch.ones(1, device="meta"), torch.ones(1)))
        >>> e.arg, e.problem
        ('a', "is on meta, while 'b' is on cpu")
    """
    counts: dict[torch.device, int] = {}
    for t in tensors:
        counts[t.device] = counts.get(t.device, 0) + 1
    real = [d for d in counts if d.type != "meta"] or list(counts)
    device = max(real, key=lambda d: counts[d])  # max keeps the earliest of equal counts
    i = next(i for i, t in enumerate(tensors) if t.device != device)
    name, where = _name(op, i), tensors[i].device
    others = [f"'{_name(op, j)}'" for j, t in enumerate(tensors) if t.device == device]
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    verb = "is" if len(others) == 1 else "are"
    if where.type == "meta":
        fix = (f"pass '{name}' on {device} (a meta tensor has no data; every input on meta "
               "runs only the shape rule)")
    else:
        fix = f"move every input to one device, e.g. {name}.to('{device}')"
    return OpInputError(op.name, name, f"is on {where}, while {shown} {verb} on {device}", fix)


def _name(op: Op, i: int) -> str:
    return op.inputs[i].name if i < len(op.inputs) else f"input {i}"
