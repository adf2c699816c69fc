"""The PyTorch frontend: each :class:`~xla_kernels.op.Op` becomes a ``torch.ops`` operator.

:func:`torch_op` defines ``torch.ops.<namespace>.<name>`` from the declaration alone:

* the **schema** comes from ``op.inputs`` (tensors, positional) and ``op.attrs``
  (keyword-only, with their declared defaults);
* the **eager CPU and CUDA kernels** call the op's own XLA FFI handler directly (no XLA)
  through :func:`xla_kernels.runtime.eager.call_handler`, zero-copy on the tensors'
  memory; on CUDA the handler gets PyTorch's current stream, so the kernel is ordered
  with the work around it and nothing synchronizes;
* the **fake (meta) kernel** is the op's shape rule: ``op.bind`` gives the output specs,
  so ``torch.compile``, ``FakeTensorMode`` and ``torch.library.opcheck`` work without a
  second shape rule anywhere.

Schema rules (``op.name`` ``"my_lib.sub.add"`` becomes ``my_lib_sub::add``; inputs are
``Tensor`` arguments, in order), attribute by attribute:

* ``int``, NumPy integer types: ``int`` (torch carries int64: a ``np.uint64`` value
  above 2**63 - 1 cannot be passed through torch);
* ``float``, ``np.float32``, ``np.float64``: ``float`` (the kernel still receives the
  declared type);
* ``bool``, ``np.bool_``: ``bool``; ``str``: ``str``;
* ``list[int]``, ``list[np.int32]``: ``int[]``; ``list[float]``, ``list[np.float64]``:
  ``float[]``;
* ``bytes``: ``int[]``, one entry per byte (0..255); :func:`call` and
  :func:`attrs_for_torch` accept ``bytes`` and convert.

Attributes are keyword-only. A declared default becomes the schema default; a required
attribute, or a default the schema language cannot spell (``inf``, ``nan``, an odd
string, an int beyond int64), becomes ``T? name=None``, where ``None`` means "not
passed" so that the library's own error (or the declared default) applies. Visible
outputs become the return: ``Tensor`` or ``(Tensor, Tensor, ...)``; workspace outputs
are allocated and handed to the kernel but never returned. ``torch.ops.<ns>.<name>``
exists once :func:`torch_op` (or :func:`call`, or torchax registration) ran for the op.

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

import contextlib
import math
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from xla_kernels import dtypes
from xla_kernels.attrs import _ARRAYS, _SCALARS, Attr
from xla_kernels.errors import OpInputError, PlatformError, RegistrationError
from xla_kernels.frontends import torch_native
from xla_kernels.op import BoundCall, Op, Spec
from xla_kernels.runtime.eager import Buffer, DeviceAllocator, call_handler
from xla_kernels.runtime.library import load_kernel

__all__ = ["attrs_for_torch", "call", "qualified_name", "schema", "torch_op"]

#: Set ``XLA_KERNELS_POISON_OUTPUTS=1`` to fill every eager output with NaN (floats) or
#: all-ones bits (ints, bools) before the kernel runs: a kernel that leaves elements
#: unwritten then shows it at once instead of returning stale memory.
POISON_OUTPUTS: bool = os.environ.get("XLA_KERNELS_POISON_OUTPUTS", "") not in ("", "0")

_TORCH_DTYPES: dict[str, torch.dtype] = {name: dtypes.to_torch(name) for name in dtypes.ALL}
_INT64 = np.iinfo(np.int64)


# ------------------------------------------------------------------------ the schema

def qualified_name(op: Op, *, namespace: str | None = None) -> str:
    """``"namespace::name"`` of the torch operator derived from ``op``.

    The namespace is the part of ``op.name`` before the last ``.``, with ``.`` turned
    into ``_`` (``"xla_kernels"`` when the name has no ``.``), unless ``namespace`` is
    given; any other character not allowed in an identifier becomes ``_``.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> qualified_name(simple_add)
        'xla_kernels::simple_add'
        >>> qualified_name(simple_add, namespace="mine")
        'mine::simple_add'
    """
    head, _, tail = op.name.rpartition(".")
    ns = namespace if namespace is not None else (head or "xla_kernels")
    ns, tail = _identifier(ns.replace(".", "_")), _identifier(tail)
    return f"{ns}::{tail}"


def _identifier(text: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in text) or "_"
    return f"_{out}" if out[0].isdigit() else out


def _schema_type(attr: Attr) -> str:
    if attr.type is str:
        return "str"
    if attr.type is bytes:
        return "int[]"
    if attr.type in _SCALARS:
        kind = _SCALARS[attr.type].kind
        return "bool" if kind == "b" else ("float" if kind == "f" else "int")
    kind = _ARRAYS[attr.type].kind
    return "float[]" if kind == "f" else "int[]"


def _literal(attr: Attr) -> str | None:
    """The schema spelling of ``attr``'s default, or None if the schema cannot spell it."""
    if attr.required:
        return None
    value = attr.default
    kind = _schema_type(attr)
    if kind == "str":
        ok = all(32 <= ord(c) < 127 and c not in '"\\' for c in value)
        return f'"{value}"' if ok else None
    if kind == "bool":
        return "True" if value else "False"
    if kind == "int":
        return str(int(value)) if _INT64.min <= int(value) <= _INT64.max else None
    if kind == "float":
        return repr(float(value)) if math.isfinite(float(value)) else None
    items = list(bytes(value)) if attr.type is bytes else np.asarray(value).ravel().tolist()
    if kind == "int[]":
        if not all(_INT64.min <= int(v) <= _INT64.max for v in items):
            return None
        return "[" + ", ".join(str(int(v)) for v in items) + "]"
    if not all(math.isfinite(float(v)) for v in items):
        return None
    return "[" + ", ".join(repr(float(v)) for v in items) + "]"


def schema(op: Op, *, num_outputs: int | None = None) -> str:
    """The torch schema (without the name) derived from ``op``'s declaration.

    ``num_outputs`` (the number of visible outputs) is found by running the shape rule
    on probe inputs unless given.

    Example:
        >>> import xla_kernels as xk
        >>> op = xk.Op("docs.scale", inputs=[xk.Tensor("x", ("f32",))],
        ...            attrs=[xk.Attr("factor", float, default=2.0), xk.Attr("n", int),
        ...                   xk.Attr("dims", list[int], default=(1, 2))],
        ...            outputs=lambda x, **_: (xk.like(x), xk.like(x)),
        ...            kernels={"cpu": xk.Kernel(["scale.cc"], "Scale")})
        >>> schema(op)
        '(Tensor x, *, float factor=2.0, int? n=None, int[] dims=[1, 2]) -> (Tensor, Tensor)'
    """
    params = [f"Tensor {t.name}" for t in op.inputs]
    if op.attrs:
        params.append("*")
    for attr in op.attrs:
        literal = _literal(attr)
        kind = _schema_type(attr)
        params.append(f"{kind} {attr.name}={literal}" if literal is not None
                      else f"{kind}? {attr.name}=None")
    returns = _visible_count(op) if num_outputs is None else int(num_outputs)
    if returns < 1:
        raise RegistrationError(f"{op.name}: num_outputs must be at least 1, got {returns}")
    ret = "Tensor" if returns == 1 else "(" + ", ".join(["Tensor"] * returns) + ")"
    return f"({', '.join(params)}) -> {ret}"


def _visible_count(op: Op) -> int:
    """How many visible outputs ``op`` has: the schema needs it before any call.

    The shape rule runs on probe inputs (each input's first declared dtype, every input
    of one shape: rank 0 to 4, sides 1, 2, 8 or 128, within each input's declared ranks,
    required attributes set to small values) until one is accepted.
    """
    attrs = {a.name: _probe_value(a) for a in op.attrs if a.required}
    first_error: Exception | None = None
    for side in (2, 1, 8, 128):
        for rank in range(5):
            probe = []
            for t in op.inputs:
                r = rank if t.rank is None or rank in t.rank else t.rank[0]
                probe.append(Spec((side,) * r, t.dtypes[0]))
            try:
                bound = op.bind(probe, attrs)
            except Exception as e:  # the rule may reject this probe: try the next one
                first_error = first_error or e
                continue
            return len(bound.visible_outputs)
    raise RegistrationError(
        f"{op.name}: cannot derive the torch schema's return count: the shape rule "
        f"rejected every probe (inputs of one shape, e.g. {first_error}). Fix: pass "
        "num_outputs= (the number of visible outputs) to torch_op.")


def _probe_value(attr: Attr) -> Any:
    if attr.type is bytes:
        return b""
    return {"str": "", "bool": False, "int": 1, "float": 1.0, "int[]": [1],
            "float[]": [1.0]}[_schema_type(attr)]


# ------------------------------------------------------------------------ attributes

def attrs_for_torch(op: Op, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values as the torch schema takes them (``bytes`` become lists of ints).

    Example:
        >>> import xla_kernels as xk
        >>> op = xk.Op("docs.blob", inputs=[xk.Tensor("x", ("f32",))],
        ...            attrs=[xk.Attr("blob", bytes)], outputs=lambda x, blob: xk.like(x),
        ...            kernels={"cpu": xk.Kernel(["b.cc"], "B")})
        >>> attrs_for_torch(op, {"blob": b"hi"})
        {'blob': [104, 105]}
    """
    byte_attrs = _byte_attrs(op)
    out = {}
    for k, v in attrs.items():
        if k in byte_attrs and isinstance(v, (bytes, bytearray, memoryview)):
            v = list(bytes(v))
        out[k] = v
    return out


def _byte_attrs(op: Op) -> frozenset[str]:
    return frozenset(a.name for a in op.attrs if a.type is bytes)


def _attrs_from_torch(op: Op, byte_attrs: frozenset[str], kwargs: dict[str, Any],
                      concretize: bool = False) -> dict[str, Any]:
    """The op's attributes from a torch call: ``None`` means "not passed"; byte lists
    become ``bytes``; symbolic ints/floats (``torch.compile``) become concrete."""
    out = {}
    for k, v in kwargs.items():
        if v is None:
            continue
        if concretize:
            v = _concrete(v)
        if k in byte_attrs and not isinstance(v, (bytes, bytearray)):
            try:
                v = bytes(v)
            except (TypeError, ValueError) as e:
                raise OpInputError(op.name, k, f"expected bytes (a list of ints 0..255), "
                                               f"got {v!r}: {e}") from None
        out[k] = v
    return out


def attrs_from_torch(op: Op, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The op's attributes from a torch call's keywords (the inverse of :func:`attrs_for_torch`).

    ``None`` means "not passed" (the op's default applies); byte lists become ``bytes``.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> attrs_from_torch(simple_add, {})
        {}
    """
    return _attrs_from_torch(op, _byte_attrs(op), dict(kwargs))


def _concrete(v: Any) -> Any:
    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, torch.SymFloat):
        return float(v)
    if isinstance(v, torch.SymBool):
        return bool(v)
    if isinstance(v, (list, tuple)):
        return [_concrete(x) for x in v]
    return v


# ------------------------------------------------------------------------ registration

class _Plan:
    """A validated call shape: what ``op.bind`` said for one set of input shapes, dtypes
    and attributes, ready for the per-call fast path."""

    __slots__ = ("attrs", "checked", "inputs", "outputs", "single", "visible")

    def __init__(self, bound: BoundCall):
        self.attrs = bound.attrs
        self.inputs = tuple((s.dtype, s.shape) for s in bound.inputs)
        self.outputs = tuple((s.dtype, s.shape, _TORCH_DTYPES[s.dtype]) for s in bound.outputs)
        self.visible = tuple(i for i, s in enumerate(bound.outputs) if not s.workspace)
        self.single = len(self.visible) == 1
        self.checked: set[str] = set()  # platforms whose kernel accepts these dtypes


_MAX_PLANS = 512


class _Entry:
    """One defined torch operator and the op it runs (swappable, see :func:`torch_op`)."""

    def __init__(self, op: Op, qualname: str, schema_text: str):
        self.qualname = qualname
        self.schema = schema_text
        self.packet: Any = None
        self.bind(op)

    def bind(self, op: Op) -> None:
        self.op = op
        self.byte_attrs = _byte_attrs(op)
        self.handlers: dict[str, int] = {}
        self.plans: dict[Any, _Plan] = {}
        torch_native.clear_plans(self.qualname)  # the native kernels' plans are stale too

    def handler(self, platform: str) -> int:
        address = self.handlers.get(platform)
        if address is None:
            address = self.handlers[platform] = load_kernel(self.op, platform).address
        return address

    def plan(self, key: Any, tensors: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> _Plan:
        """Validate a call (``op.bind``) and remember the result under ``key``."""
        op = self.op
        attrs = (_attrs_from_torch(op, self.byte_attrs, kwargs) if self.byte_attrs
                 or None in kwargs.values() else kwargs)
        plan = _Plan(op.bind(tensors, attrs))
        if key is not None:
            if len(self.plans) >= _MAX_PLANS:
                self.plans.clear()
            self.plans[key] = plan
        return plan

    def check(self, plan: _Plan, platform: str) -> None:
        """Raise unless ``platform`` has a kernel that takes the plan's dtypes."""
        op = self.op
        if platform not in op.kernels:
            raise PlatformError(
                f"{op.name}: no kernel for platform '{platform}' (it has kernels for "
                f"{', '.join(sorted(op.kernels))}). Fix: move the tensors to "
                f"{' or '.join(sorted(op.kernels))}, or declare a kernel for {platform}.")
        op.check_platform(platform, [Spec(shape, dtype) for dtype, shape in plan.inputs])
        plan.checked.add(platform)


def _attr_key(kwargs: dict[str, Any]) -> Any:
    """A hashable key of a torch call's attributes (None if a value is not hashable)."""
    try:
        return tuple(sorted((k, type(v), tuple(v) if isinstance(v, list) else v)
                            for k, v in kwargs.items()))
    except TypeError:
        return None


_entries: dict[str, _Entry] = {}
_by_op: dict[tuple[Op, str | None], Any] = {}  # holds the op: its id is never reused
_lock = threading.RLock()


def torch_op(op: Op, *, namespace: str | None = None, num_outputs: int | None = None) -> Any:
    """Define ``torch.ops.<namespace>.<name>`` for ``op`` (once) and return its packet.

    Idempotent: calling it again for the same op returns the same
    ``torch._ops.OpOverloadPacket``. A *different* ``Op`` object with the same name and
    the same schema (e.g. a re-executed declaration) takes over the existing torch
    operator; one whose schema differs raises :class:`RegistrationError`, as does a name
    that something else already defined in torch (pass ``namespace=``).

    Args:
        op: the declared op.
        namespace: the torch namespace; by default derived from ``op.name``
            (see :func:`qualified_name`).
        num_outputs: the number of visible outputs, only needed when the shape rule
            rejects every probe input :func:`schema` tries.

    Example:
        >>> import torch
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> torch_op(simple_add) is torch.ops.xla_kernels.simple_add
        True
        >>> torch.ops.xla_kernels.simple_add(torch.ones(2), torch.ones(2))  # doctest: +SKIP
        tensor([2., 2.])
    """
    key = (op, namespace)
    packet = _by_op.get(key)
    if packet is not None:
        return packet
    with _lock:
        qualname = qualified_name(op, namespace=namespace)
        text = schema(op, num_outputs=num_outputs)
        entry = _entries.get(qualname)
        if entry is not None:
            if entry.schema != text:
                raise RegistrationError(
                    f"{op.name}: torch operator {qualname} is already defined with schema "
                    f"{entry.schema}, this declaration needs {text}. Fix: pass namespace= "
                    "to torch_op, or rename the op.")
            if entry.op is not op:
                entry.bind(op)
        else:
            entry = _define(op, qualname, text)
            _entries[qualname] = entry
        _by_op[key] = entry.packet
        return entry.packet


def _define(op: Op, qualname: str, text: str) -> _Entry:
    ns, name = qualname.split("::")
    try:
        torch.library.define(qualname, text, tags=(torch.Tag.pt2_compliant_tag,))
    except RuntimeError as e:
        raise RegistrationError(
            f"{op.name}: cannot define torch operator {qualname}{text}: {e}. Fix: pass "
            f"namespace= to torch_op (another library defines {qualname}).") from None
    entry = _Entry(op, qualname, text)

    def cpu_impl(*tensors: torch.Tensor, **kwargs: Any) -> Any:
        return _run(entry, "cpu", tensors, kwargs)

    def cuda_impl(*tensors: torch.Tensor, **kwargs: Any) -> Any:
        return _run(entry, "cuda", tensors, kwargs)

    def fake_impl(*tensors: torch.Tensor, **kwargs: Any) -> Any:
        return _fake(entry, tensors, kwargs)

    for fn, what in ((cpu_impl, "cpu"), (cuda_impl, "cuda"), (fake_impl, "fake")):
        fn.__name__ = fn.__qualname__ = f"{name}_{what}"
        fn.__doc__ = op.doc
    native = _install_native(entry)
    if "cpu" not in native:
        torch.library.impl(qualname, "cpu", cpu_impl)
    if "cuda" not in native:
        torch.library.impl(qualname, "cuda", cuda_impl)
    torch.library.register_fake(qualname, fake_impl)
    entry.packet = getattr(getattr(torch.ops, ns), name)
    return entry


def _install_native(entry: _Entry) -> set[str]:
    """Register native (C++) CPU and CUDA kernels for ``entry`` where possible.

    Returns the platforms that got one; the others keep the Python kernels (see
    :mod:`xla_kernels.frontends.torch_native`, ``XLA_KERNELS_TORCH_NATIVE=0``). The
    planner runs once per call shape and validates exactly as :func:`_run` does.
    """
    def planner_for(platform: str) -> Any:
        def planner(tensors: tuple[torch.Tensor, ...],
                    kwargs: dict[str, Any]) -> torch_native.NativePlan:
            device = tensors[0].device
            if any(t.device != device for t in tensors):
                _device_mismatch(entry.op, tensors)
            plan = entry.plan(None, tensors, kwargs)
            entry.check(plan, platform)
            return torch_native.NativePlan.create(
                handler=entry.handler(platform), outputs=[(dt, s) for _, s, dt in plan.outputs],
                visible=plan.visible, attrs=plan.attrs, op_name=entry.op.name,
                poison=POISON_OUTPUTS)
        return planner

    return {p for p in ("cpu", "cuda") if torch_native.install(entry.qualname, p, planner_for(p))}


# ------------------------------------------------------------------------ the kernels

def _fake(entry: _Entry, tensors: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> Any:
    op = entry.op
    bound = op.bind(tensors, _attrs_from_torch(op, entry.byte_attrs, kwargs, True))
    device = tensors[0].device
    outs = [torch.empty(s.shape, dtype=_TORCH_DTYPES[s.dtype], device=device)
            for s in bound.visible_outputs]
    return outs[0] if len(outs) == 1 else tuple(outs)


_cuda_allocator: Any = None


def _run(entry: _Entry, platform: str, tensors: tuple[torch.Tensor, ...],
         kwargs: dict[str, Any]) -> Any:
    """The eager kernel: validate (once per call shape), allocate, call the handler."""
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            _device_mismatch(entry.op, tensors)
    key = (*[t.shape for t in tensors], *[t.dtype for t in tensors],
           _attr_key(kwargs) if kwargs else ())
    if key[-1] is None:
        key = None
    tensors = tuple(t if t.is_contiguous() else t.contiguous() for t in tensors)
    plan = entry.plans.get(key) if key is not None else None
    if plan is None:
        plan = entry.plan(key, tensors, kwargs)
    if platform not in plan.checked:
        entry.check(plan, platform)
    handler = entry.handlers.get(platform) or entry.handler(platform)

    outs = [torch.empty(shape, dtype=dt, device=device) for _, shape, dt in plan.outputs]
    if POISON_OUTPUTS:
        for o in outs:
            o.fill_(float("nan") if o.is_floating_point() or o.is_complex() else -1)
    args = [Buffer(t.data_ptr(), dtype, shape)
            for t, (dtype, shape) in zip(tensors, plan.inputs, strict=True)]
    rets = [Buffer(o.data_ptr(), dtype, shape)
            for o, (dtype, shape, _) in zip(outs, plan.outputs, strict=True)]
    if platform == "cpu":
        call_handler(handler, args=args, rets=rets, attrs=plan.attrs, op_name=entry.op.name)
    else:
        _call_cuda(handler, device, args, rets, plan.attrs, entry.op.name)

    if plan.single:
        return outs[plan.visible[0]]
    return tuple(outs[i] for i in plan.visible)


def _device_mismatch(op: Op, tensors: tuple[torch.Tensor, ...]) -> None:
    device = tensors[0].device
    for i, t in enumerate(tensors):
        if t.device != device:
            name = op.inputs[i].name if i < len(op.inputs) else None
            raise OpInputError(op.name, name,
                               f"is on {t.device}, while '{op.inputs[0].name}' is on {device}",
                               "move every input to one device")


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


# ------------------------------------------------------------------------ convenience

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

