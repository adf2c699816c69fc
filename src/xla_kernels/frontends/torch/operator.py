"""The torch operator of an op: ``torch.ops.<namespace>.<name>``, once per op target.

:func:`define` makes it from the declaration (name and schema: :mod:`.schema`) with its fake
kernel (the op's shape rule, for ``torch.compile`` and ``FakeTensorMode``), its autograd
kernels (:mod:`.autograd`) and its eager CPU/CUDA kernels (:mod:`.eager`). The torchax and
torch_xla frontends add their implementation to this same operator.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> define(simple_add).schema
    '(Tensor a, Tensor b) -> Tensor'
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from xla_kernels import dtypes
from xla_kernels.errors import RegistrationError
from xla_kernels.frontends.torch.autograd import install_autograd, install_version_bump
from xla_kernels.frontends.torch.devices import check_devices
from xla_kernels.frontends.torch.eager import install_eager
from xla_kernels.frontends.torch.schema import attrs_from_torch, qualified_name, schema
from xla_kernels.op import Op

__all__ = ["TorchOperator", "define"]


@dataclasses.dataclass
class TorchOperator:
    """A defined torch operator: its name, schema and ``OpOverloadPacket``."""

    qualname: str
    schema: str
    packet: Any


def define(op: Op, *, namespace: str | None = None, num_outputs: int | None = None
           ) -> TorchOperator:
    """Define ``op``'s torch operator, its fake kernel and its eager CPU/CUDA kernels, once.

    The eager kernels (:mod:`.eager`) and the autograd kernels (:mod:`.autograd`) come with
    the operator, so it runs on CPU and CUDA tensors whichever frontend defined it. The
    operator follows the record's current declaration. A later declaration whose schema
    differs is refused by the record (torch cannot redefine an operator).

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> define(simple_add).qualname
        'xla_kernels::simple_add'
    """
    record = op.record
    qualname = qualified_name(op, namespace=namespace)
    with record.lock:
        known = record.torch_operators.get(qualname)
        if known is not None:
            return known
        text = schema(op, num_outputs=num_outputs)
        try:
            torch.library.define(qualname, text, tags=(torch.Tag.pt2_compliant_tag,))
        except RuntimeError as e:
            raise RegistrationError(
                f"{op.name}: cannot define torch operator {qualname}{text}: {e}. Fix: pass "
                f"namespace= to torch_op (another library defines {qualname}).") from None

        def fake_impl(*tensors: torch.Tensor, **kwargs: Any) -> Any:
            return _fake(record.op, tensors, kwargs)

        ns, name = qualname.split("::")
        fake_impl.__name__ = fake_impl.__qualname__ = f"{name}_fake"
        torch.library.register_fake(qualname, fake_impl)
        operator = TorchOperator(qualname, text, getattr(getattr(torch.ops, ns), name))
        if op.has_side_effect:  # torch.compile must neither drop nor reorder its calls
            torch.library._register_effectful_op(operator.packet.default,
                                                 torch.library.EffectType.ORDERED)
        install_autograd(record, operator, _operator_of)
        if any(t.in_place for t in op.inputs):
            install_version_bump(op, operator)
        record.torch_operators[qualname] = operator
        record.guard(lambda new: _schema_guard(operator, new))
    install_eager(record, qualname)
    return operator


def _operator_of(op: Op, namespace: str) -> TorchOperator:
    """The torch operator of a backward op, in its forward's namespace (for autograd)."""
    return define(op, namespace=namespace)


def _schema_guard(operator: TorchOperator, new: Op) -> str | None:
    try:
        text = schema(new)
    except RegistrationError:  # no probe fits the new rule: keep the operator's return count
        returns = operator.schema.rpartition(" -> ")[2]
        text = schema(new, num_outputs=1 if returns == "Tensor" else returns.count("Tensor"))
    if text != operator.schema:
        return (f"its torch operator {operator.qualname} is defined with schema "
                f"{operator.schema}, while this declaration needs {text} (torch cannot "
                "redefine an operator)")
    return None


def _fake(op: Op, tensors: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> Any:
    """The fake kernel, also torch's Meta kernel: a call with any ``meta`` input comes
    here, so mixed devices are refused here too (the outputs would be put on the first
    input's device and never computed)."""
    device = (check_devices(op, tensors) if tensors
              else torch.device(kwargs.get("device") or "cpu"))
    plan = op.bind(tensors, attrs_from_torch(op, kwargs, concretize=True))
    outs = [torch.empty(s.shape, dtype=dtypes.to_torch(s.dtype), device=device)
            for s in plan.outputs]
    return plan.results(outs, with_updated=False)
