"""The eager kernels of an op's torch operator: CPU and CUDA tensors, no XLA.

On CPU and CUDA tensors the operator calls the op's own XLA FFI handler directly through
:func:`xla_kernels.runtime.eager.call_handler`, zero-copy on the tensors' memory; on CUDA
the handler gets PyTorch's current stream, so the kernel is ordered with the work around it
and nothing synchronizes. Where torch's headers are installed the per-call path is the
native C++ kernel of :mod:`.native`; this module's Python kernel is the fallback (and the
path of in-place, input-less and stateful ops). A failed handler's
:class:`~xla_kernels.runtime.eager.KernelError` is explained here
(:func:`xla_kernels.diagnostics.explain_kernel_error`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from xla_kernels import dtypes, env, platforms
from xla_kernels.diagnostics import explain_kernel_error
from xla_kernels.errors import OpInputError
from xla_kernels.frontends.torch import native as torch_native
from xla_kernels.frontends.torch.devices import check_devices
from xla_kernels.frontends.torch.schema import attrs_from_torch
from xla_kernels.op import CallPlan
from xla_kernels.record import OpRecord
from xla_kernels.runtime.eager import Buffer, DeviceAllocator, KernelError, call_handler

__all__ = ["POISON_OUTPUTS", "install_eager"]

#: Set ``XLA_KERNELS_POISON_OUTPUTS=1`` to fill every eager output with NaN (floats) or
#: all-ones bits (ints, bools) before the kernel runs: a kernel that leaves elements
#: unwritten then shows it at once instead of returning stale memory.
POISON_OUTPUTS: bool = env.get("XLA_KERNELS_POISON_OUTPUTS") not in (None, "", "0")

_TORCH_DTYPES: dict[str, torch.dtype] = {name: dtypes.to_torch(name) for name in dtypes.ALL}
_MAX_PLANS = 512


def install_eager(record: OpRecord, qualname: str) -> None:
    """Give the torch operator ``qualname`` its eager kernels for every platform, once.

    Where torch's headers are installed each is a native C++ kernel
    (:mod:`xla_kernels.frontends.torch.native`) that asks :func:`_native_planner` once per
    call shape and then runs without Python; elsewhere (or with
    ``XLA_KERNELS_TORCH_NATIVE=0``) it is the Python kernel :func:`_run`.
    """
    with record.lock:
        op = record.op
        if not op.inputs and (qualname, "select") not in record.torch_eager:
            # Nothing to dispatch on: BackendSelect routes by the `device` keyword.
            def select(*, device: Any = None, **kwargs: Any) -> Any:
                kind = torch.device(device or "cpu").type
                name = platforms.platform_for_torch_device(kind).name
                return _run(record, name, (), {**kwargs, "device": device})

            torch.library.impl(qualname, "BackendSelect", select)
            record.torch_eager.add((qualname, "select"))
        # The native kernel allocates every output itself: in-place and input-less ops
        # take the Python kernel.
        native_ok = bool(op.inputs) and not any(t.in_place for t in op.inputs)
        for platform in platforms.PLATFORMS.values():
            if (qualname, platform.name) in record.torch_eager:
                continue
            kernel = op.kernels.get(platform.name)  # stateful: the eager state is Python's
            if native_ok and not (kernel and kernel.stateful) and torch_native.install(
                    qualname, platform.name, _native_planner(record, platform.name)):
                record.on_replace(lambda q=qualname: torch_native.clear_plans(q))
            else:
                def impl(*tensors: torch.Tensor, _platform: str = platform.name,
                         **kwargs: Any) -> Any:
                    return _run(record, _platform, tensors, kwargs)

                impl.__name__ = impl.__qualname__ = f"{qualname.split('::')[1]}_{platform.name}"
                torch.library.impl(qualname, platform.torch_dispatch_key, impl)
            record.torch_eager.add((qualname, platform.name))


def _native_planner(record: OpRecord, platform: str) -> Any:
    """What the native kernel calls on a new call shape, and on every call whose tensors
    are not all on one device: the same checks as :func:`_run`, then the plan it keeps
    (handler, outputs, encoded attributes)."""
    def planner(tensors: tuple[torch.Tensor, ...], kwargs: dict[str, Any]
                ) -> torch_native.NativePlan:
        op = record.op
        check_devices(op, tensors, eager=True)
        plan = op.bind(tensors, attrs_from_torch(op, kwargs))
        return torch_native.NativePlan.create(
            handler=plan.kernel(platform).address,
            outputs=[(_TORCH_DTYPES[s.dtype], s.shape) for s in plan.outputs],
            visible=plan.visible_indices, attrs=plan.eager_attrs(), op_name=op.name,
            poison=POISON_OUTPUTS)

    return planner


# ------------------------------------------------------------------------ the kernels

class _EagerPlan:
    """A call plan made ready for the per-call fast path: output dtypes and shapes,
    encoded attributes, and the platforms whose kernels were checked for its dtypes."""

    __slots__ = ("attrs", "checked", "inputs", "outputs", "plan")

    def __init__(self, plan: CallPlan):
        self.plan = plan
        self.attrs = plan.eager_attrs()
        self.inputs = tuple((s.dtype, s.shape) for s in plan.inputs)
        self.outputs = tuple((s.dtype, s.shape, _TORCH_DTYPES[s.dtype]) for s in plan.outputs)
        self.checked: dict[str, int] = {}  # platform -> handler address


def _attr_key(kwargs: dict[str, Any]) -> Any:
    """A hashable key of a torch call's attributes (None if a value is not hashable)."""
    try:
        return tuple(sorted((k, type(v), tuple(v) if isinstance(v, list) else v)
                            for k, v in kwargs.items()))
    except TypeError:
        return None


def _plan(record: OpRecord, tensors: tuple[torch.Tensor, ...], kwargs: dict[str, Any]
          ) -> _EagerPlan:
    """Validate a call (``op.bind``), once per call shape: plans are kept on the record."""
    attr_key = _attr_key(kwargs) if kwargs else ()
    key = None if attr_key is None else (*[t.shape for t in tensors],
                                         *[t.dtype for t in tensors], attr_key)
    plans = record.plans
    plan = plans.get(key) if key is not None else None
    if plan is None:
        op = record.op
        plan = _EagerPlan(op.bind(tensors, attrs_from_torch(op, kwargs)))
        if key is not None:
            if len(plans) >= _MAX_PLANS:
                plans.clear()
            plans[key] = plan
    return plan


def _run(record: OpRecord, platform: str, tensors: tuple[torch.Tensor, ...],
         kwargs: dict[str, Any]) -> Any:
    """The eager kernel: validate (once per call shape), allocate, call the handler."""
    op = record.op
    device = (check_devices(op, tensors, eager=True) if tensors
              else torch.device(kwargs.get("device") or "cpu"))
    for t, spec in zip(tensors, op.inputs, strict=True):
        if spec.in_place and not t.is_contiguous():
            raise OpInputError(op.name, spec.name, "is updated in place, but the tensor is "
                               "not contiguous", f"pass {spec.name}.contiguous() and use that "
                               "tensor afterwards")
    tensors = tuple(t if t.is_contiguous() else t.contiguous() for t in tensors)
    plan = _plan(record, tensors, kwargs)
    handler = plan.checked.get(platform)
    if handler is None:
        handler = plan.checked[platform] = plan.plan.kernel(platform).address

    updated = {out: tensors[arg] for arg, out in plan.plan.aliases.items()}
    outs = [updated.get(i) if i in updated else torch.empty(shape, dtype=dt, device=device)
            for i, (_, shape, dt) in enumerate(plan.outputs)]
    if POISON_OUTPUTS:
        for i, o in enumerate(outs):
            if i not in updated:
                o.fill_(float("nan") if o.is_floating_point() or o.is_complex() else -1)
    args = [Buffer(t.data_ptr(), dtype, shape)
            for t, (dtype, shape) in zip(tensors, plan.inputs, strict=True)]
    rets = [Buffer(o.data_ptr(), dtype, shape)
            for o, (dtype, shape, _) in zip(outs, plan.outputs, strict=True)]
    name = record.target
    try:
        if platform == "cpu":
            call_handler(handler, args=args, rets=rets, attrs=plan.attrs, op_name=name)
        else:
            _call_cuda(handler, device, args, rets, plan.attrs, name)
    except KernelError as e:  # the eager runtime raises, the frontend explains
        explained = explain_kernel_error(e, op)
        if explained is e:
            raise
        raise explained from e
    return plan.plan.results(outs, with_updated=False)


_cuda_allocator: DeviceAllocator | None = None


def _call_cuda(handler: int, device: torch.device, args: list[Any], rets: list[Any],
               attrs: dict[str, Any], op_name: str) -> None:
    """Run a CUDA handler on PyTorch's current stream of ``device`` (no synchronization)."""
    global _cuda_allocator
    if _cuda_allocator is None:
        _cuda_allocator = DeviceAllocator.torch_cuda()
    index = device.index if device.index is not None else torch.cuda.current_device()
    guard = (torch.cuda.device(index) if index != torch.cuda.current_device()
             else contextlib.nullcontext())
    with guard:
        stream = torch.cuda.current_stream(index).cuda_stream
        call_handler(handler, args=args, rets=rets, attrs=attrs, stream=stream,
                     device_ordinal=index, op_name=op_name, platform="cuda",
                     allocator=_cuda_allocator)
