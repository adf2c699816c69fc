"""The eager PyTorch frontend: ``torch.ops.<namespace>.<name>`` on CPU and CUDA tensors.

:func:`torch_op` defines the op's torch operator (:mod:`.operator`; name, schema and
attribute conversion in :mod:`.schema`, all derived from the declaration) with its autograd
kernels (:mod:`.autograd`) and its eager kernels (:mod:`.eager`, or the native C++
dispatcher of :mod:`.native`): on CPU and CUDA tensors the operator calls the op's own XLA
FFI handler directly (no XLA), zero-copy on the tensors' memory, on PyTorch's current CUDA
stream. ``torch.compile``, ``FakeTensorMode`` and ``torch.library.opcheck`` use the fake
kernel (the op's shape rule).

Attributes are keyword-only; ``bytes`` attributes travel as ``int[]`` (one entry per
byte): :func:`call` and :func:`attrs_for_torch` accept ``bytes`` and convert.

Example:
    >>> import torch
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> add = torch_op(simple_add)
    >>> add(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0]))  # doctest: +SKIP
    tensor([5., 7., 9.])
    >>> schema(simple_add)
    '(Tensor a, Tensor b) -> Tensor'
"""

from __future__ import annotations

from typing import Any

import torch

from xla_kernels.errors import OpInputError
from xla_kernels.frontends.torch.operator import TorchOperator, define
from xla_kernels.frontends.torch.schema import (
    USER_NAMESPACE,
    attrs_for_torch,
    attrs_from_torch,
    qualified_name,
    schema,
)
from xla_kernels.op import Op

__all__ = ["USER_NAMESPACE", "TorchOperator", "attrs_for_torch", "attrs_from_torch", "call",
           "define", "qualified_name", "schema", "torch_op"]


def torch_op(op: Op, *, namespace: str | None = None, num_outputs: int | None = None) -> Any:
    """Define ``torch.ops.<namespace>.<name>`` for ``op`` with its eager kernels; return it.

    Idempotent: the same ``torch._ops.OpOverloadPacket`` every time. A redeclaration of
    the op (same target) takes over the operator when its schema is the same; otherwise
    the declaration itself is refused (see :mod:`xla_kernels.record`).

    Args:
        op: the declared op.
        namespace: the torch namespace; by default derived from ``op.name``
            (see :func:`qualified_name`).
        num_outputs: the number of visible outputs, only needed when the op declares no
            ``output_names`` and its shape rule rejects every probe input.

    Example:
        >>> import torch
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> torch_op(simple_add) is torch.ops.xla_kernels.simple_add
        True
        >>> torch.ops.xla_kernels.simple_add(torch.ones(2), torch.ones(2))  # doctest: +SKIP
        tensor([2., 2.])
    """
    return define(op, namespace=namespace, num_outputs=num_outputs).packet


def call(op: Op, *tensors: torch.Tensor, **attrs: Any) -> Any:
    """Run ``op`` on torch tensors: ``torch_op(op)(*tensors, **attrs)``, with ``bytes``
    attributes accepted as bytes and unknown attributes reported by the library.

    Example:
        >>> import torch
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> call(simple_add, torch.ones(3), torch.ones(3))    # doctest: +SKIP
        tensor([2., 2., 2.])
    """
    known = {a.name for a in op.attrs}
    for name in attrs:
        if name not in known:
            raise OpInputError(op.name, name, "unknown attribute",
                               f"known attributes: {', '.join(sorted(known)) or 'none'}")
    packet = torch_op(op)
    return packet(*tensors, **attrs_for_torch(op, attrs)) if attrs else packet(*tensors)
