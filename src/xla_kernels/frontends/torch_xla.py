"""torch_xla frontend: emit an op as one typed-FFI custom call in torch_xla's lazy graph.

:func:`custom_call` adds one ``custom-call`` to the lazy-tensor graph with
``api_version=API_VERSION_TYPED_FFI`` (4) and the attributes rendered as the MLIR
dictionary XLA's typed FFI decodes (``backend_config={alpha = 5.000000e-01 : f32, ...}``),
wrapped in a called computation so that torch_xla's graph cache tells attributes apart.
:func:`register_op` builds an :class:`~xla_kernels.Op`'s CPU kernel and registers its
handler with torch_xla's runtime (see :mod:`xla_kernels.runtime.torch_xla_registry`);
:func:`call` does both for one call of an op.

What executes (torch_xla 2.9.0): the CPU client (``PJRT_DEVICE=CPU``), with handlers
compiled against XLA FFI 0.1 headers (jaxlib 0.7.1). CUDA cannot execute through torch_xla
2.9 (it has no CUDA); lowering works everywhere torch_xla imports. ``docs/torch_xla.md``
has the details.

torch and torch_xla are optional dependencies: they are imported on first use.

Example:
    >>> import torch, torch_xla                                           # doctest: +SKIP
    >>> from xla_kernels.runtime.torch_xla_registry import register_handler
    >>> register_handler("my_lib.add", handler_address, "cpu")            # doctest: +SKIP
    >>> x = torch.tensor([1., 2., 3.], device=torch_xla.device())          # doctest: +SKIP
    >>> (out,) = custom_call("my_lib.add", [x, x], [((3,), torch.float32)], {})  # doctest: +SKIP
    >>> out.cpu()                                                          # doctest: +SKIP
    tensor([2., 4., 6.])
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xla_kernels.attrs import mlir_dict
from xla_kernels.errors import OpInputError, OpTypeError
from xla_kernels.frontends.torch.operator import define
from xla_kernels.frontends.torch.schema import attrs_from_torch
from xla_kernels.runtime.hlo_proto import add_operand_aliasing
from xla_kernels.runtime.library import kernel_of

if TYPE_CHECKING:
    import torch

    from xla_kernels.op import Op
    from xla_kernels.runtime.torch_xla_registry import TorchXlaRegistration

#: ``api_version`` of a typed XLA FFI custom call (``API_VERSION_TYPED_FFI``).
TYPED_FFI_API_VERSION = 4

Shape = Sequence[int]

_lock = threading.Lock()
# (target, inputs, outputs, backend_config, side effect) -> (computation, params, count)
_computations: dict[tuple, tuple[Any, list[int], int]] = {}


def _torch_dtype(dtype: Any) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    from xla_kernels import dtypes

    return dtypes.to_torch(dtype)


def custom_call(
    target: str,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[tuple[Shape, Any]],
    attrs: Mapping[str, Any] | str,
    *,
    has_side_effect: bool = False,
    aliases: Mapping[int, int] | None = None,
) -> list[torch.Tensor]:
    """Add one typed-FFI custom call of ``target`` to torch_xla's lazy graph.

    The call is traced once per (target, input/output shapes and dtypes, attributes) with
    ``torch_xla._XLAC._xla_custom_call(..., backend_config=mlir_dict(attrs),
    api_version=4)`` into a small XLA computation, which the graph then calls (XLA
    inlines it when compiling). Emitting the custom call straight into the graph would be
    wrong: torch_xla 2.9 hashes a custom-call node by target and operands only, so calls
    that differ only in attributes or output shapes would reuse one compiled executable.

    Args:
        target: the ``custom_call_target``; its handler must be registered (for execution,
            not for lowering) with :func:`xla_kernels.runtime.torch_xla_registry.register_handler`.
        inputs: XLA tensors (``device.type == "xla"``), passed to the handler in order.
        outputs: one ``(shape, dtype)`` per result; dtype is a ``torch.dtype`` or any name
            :mod:`xla_kernels.dtypes` knows (``"f32"``, ``np.float32``...).
        attrs: the coerced attributes (:meth:`xla_kernels.Attr.coerce` values: NumPy
            scalars, 1-D NumPy arrays, str), or a call plan's ``mlir_dict()`` text; the
            handler binds them by name.
        has_side_effect: keep the call even when its results are unused.
        aliases: ``{input index: output index}``: that output *is* that input, updated in
            place (``output_to_operand_aliasing`` on the custom call; the handler writes
            into the operand's buffer, so only what it writes changes). XLA copies the
            operand first unless the buffer may be reused: see :func:`call`.

    Returns one lazy XLA tensor per entry of ``outputs``.

    Example:
        >>> import numpy as np, torch, torch_xla                          # doctest: +SKIP
        >>> x = torch.ones(3, device=torch_xla.device())                  # doctest: +SKIP
        >>> (y,) = custom_call("my_lib.scale", [x], [((3,), torch.float32)],
        ...                    {"alpha": np.float32(0.5)})                 # doctest: +SKIP
        >>> print(hlo_text([y]))                                          # doctest: +SKIP
        %xk_my_lib_scale.2 (p0.3: f32[3]) -> (f32[3]) {
          ... custom-call(f32[3]{0} %p0.3), custom_call_target="my_lib.scale",
          api_version=API_VERSION_TYPED_FFI, backend_config={alpha = 5.000000e-01 : f32}
        ...
        ENTRY ... call(f32[3]{0} %p0.1), to_apply=%xk_my_lib_scale.2 ...
    """
    import torch
    import torch_xla

    if not isinstance(target, str) or not target:
        raise OpInputError(target or "<custom_call>", "target", "expected a non-empty str")
    tensors = list(inputs)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise OpTypeError(target, f"inputs[{i}]", f"expected a torch.Tensor, got "
                              f"{type(t).__name__}")
        if t.device.type != "xla":
            raise OpInputError(target, f"inputs[{i}]", f"tensor is on {t.device}, not an XLA "
                               "device", "move it with t.to(torch_xla.device())")
    if not outputs:
        raise OpInputError(target, "outputs", "at least one output (shape, dtype) is needed")
    shapes: list[list[int]] = []
    out_dtypes: list[torch.dtype] = []
    for i, out in enumerate(outputs):
        try:
            shape, dtype = out
            shapes.append([int(d) for d in shape])
            out_dtypes.append(_torch_dtype(dtype))
        except (TypeError, ValueError, KeyError) as e:
            raise OpTypeError(target, f"outputs[{i}]", f"expected (shape, dtype), got {out!r}: "
                              f"{e}") from None
        if any(d < 0 for d in shapes[-1]):
            raise OpInputError(target, f"outputs[{i}]", f"negative dimension in {shapes[-1]}")
    config = attrs if isinstance(attrs, str) else mlir_dict(dict(attrs))
    alias_pairs = tuple(sorted((aliases or {}).items()))
    for arg, out in alias_pairs:
        if not (0 <= arg < len(tensors) and 0 <= out < len(shapes)) or (
                list(tensors[arg].shape), tensors[arg].dtype) != (shapes[out], out_dtypes[out]):
            raise OpInputError(target, "aliases", f"input {arg} cannot be output {out}: an "
                               "updated input must be an output of its shape and dtype")
    key = (target, tuple((tuple(t.shape), t.dtype) for t in tensors),
           tuple((tuple(sh), dt) for sh, dt in zip(shapes, out_dtypes, strict=True)),
           config, bool(has_side_effect), alias_pairs)
    with _lock:
        built = _computations.get(key)
    if built is None:
        built = _build_computation(target, tensors, shapes, out_dtypes, config,
                                   bool(has_side_effect), alias_pairs)
        with _lock:
            built = _computations.setdefault(key, built)
    computation, param_of_input, n_params = built
    operands: list[Any] = [None] * n_params
    for i, p in enumerate(param_of_input):
        operands[p] = tensors[i]
    return list(torch_xla._XLAC._xla_user_computation(
        f"xla::{_computation_name(target)}", operands, computation))


def _computation_name(target: str) -> str:
    return "xk_" + re.sub(r"[^A-Za-z0-9_]", "_", target)


def _build_computation(target: str, tensors: Sequence[torch.Tensor], shapes: list[list[int]],
                       out_dtypes: list[torch.dtype], config: str, has_side_effect: bool,
                       aliases: tuple[tuple[int, int], ...] = ()
                       ) -> tuple[Any, list[int], int]:
    """Trace the custom call on placeholders into its own XLA computation.

    torch_xla 2.9 hashes a ``CustomCall`` IR node by its target and operands only (not
    ``backend_config``, output shapes or ``api_version``), so two calls that differ only
    in attributes would share one compiled executable. Wrapping the call in a user
    computation makes the graph hash cover the whole custom-call instruction.
    """
    import torch_xla
    import torch_xla.core.xla_builder as xb

    xlac = torch_xla._XLAC
    fakes = [xb.create_placeholder_tensor(t.shape, t.dtype) for t in tensors]
    results = xlac._xla_custom_call(fakes, target, shapes, out_dtypes, has_side_effect, config,
                                    TYPED_FFI_API_VERSION, {})
    ctx = xlac.lowering.LoweringContext(_computation_name(target))
    ctx.build(list(results))
    param_of_input = [ctx.tensor_parameter_id(f) for f in fakes]
    n_params = len(ctx.device_parameter_id_tensor_mapping())
    if sorted(param_of_input) != list(range(n_params)):
        raise OpInputError(target, "inputs", f"internal: parameters {param_of_input} of the "
                           f"traced call do not match its {n_params} inputs")
    module = ctx.hlo()
    if aliases:  # _xla_custom_call cannot declare them: add them to the module proto
        module = add_operand_aliasing(module, target, dict(aliases),
                                      tuple_output=len(shapes) > 1)
    computation = xb.computation_from_module_proto(f"xla::{_computation_name(target)}",
                                                   module)
    return computation, param_of_input, n_params


def hlo_text(tensors: Sequence[torch.Tensor]) -> str:
    """The HLO text of the lazy graph that computes ``tensors`` (nothing is executed).

    Example:
        >>> "custom-call" in hlo_text([y])                                # doctest: +SKIP
        True
    """
    import torch_xla

    return torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))


def register_op(op: Op, platform: str = "cpu") -> TorchXlaRegistration:
    """Build ``op``'s kernel for ``platform`` (cached) and register it with torch_xla.

    The kernel is compiled against ``jax.ffi.include_dir()``; in the torch_xla 2.9 env that
    is jaxlib 0.7.1, whose FFI 0.1 headers match torch_xla's XLA.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add       # doctest: +SKIP
        >>> register_op(simple_add).target                               # doctest: +SKIP
        'xla_kernels.simple_add'
    """
    from xla_kernels.runtime.torch_xla_registry import check_platform, register_handler

    check_platform(platform, op.name)  # fail before building code that cannot run
    registration = register_handler(op.target, kernel_of(op, platform).address, platform)
    op.record.torch_xla_platforms.add(platform)
    return registration


def call(op: Op, *inputs: torch.Tensor, **attrs: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Run ``op`` on XLA tensors: validate, register its CPU handler once, emit the call.

    Returns one tensor for a single visible output, else a tuple (workspaces left out).

    An input declared ``in_place`` is updated in place, as in eager torch: the custom call
    aliases its output to the operand, the tensor takes the result (``copy_``, a lazy-graph
    rebinding), and the call returns the op's other outputs (``None`` if none). At
    ``torch_xla.sync()`` torch_xla donates the buffer of a device tensor updated this way
    (``XLA_ENABLE_PARAM_ALIASING``, on by default), so the compiled graph aliases it and
    copies nothing; where the buffer cannot be donated (the tensor is still needed, or
    aliasing is off), XLA copies the operand first.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add       # doctest: +SKIP
        >>> call(simple_add, x, y).cpu()                                 # doctest: +SKIP
        tensor([5., 7., 9.])
    """
    plan = op.bind(inputs, attrs)
    op.check_platform("cpu", plan.inputs)
    register_op(op, "cpu")
    outs = custom_call(op.target, inputs, [(o.shape, o.dtype) for o in plan.outputs],
                       plan.mlir_dict(), aliases=plan.aliases)
    for arg, out in plan.aliases.items():
        inputs[arg].copy_(outs[out])
    return plan.results(outs, with_updated=False)


def register_torch_xla(op: Op) -> Any:
    """Give the op's torch operator (:func:`xla_kernels.frontends.torch.operator.define`) an
    implementation for the ``XLA`` dispatch key: on XLA tensors it emits the custom call
    of the target's current declaration.

    Returns the op's ``OpOverloadPacket``. Idempotent.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add       # doctest: +SKIP
        >>> add = register_torch_xla(simple_add)                         # doctest: +SKIP
        >>> add(x, y).cpu()                                              # doctest: +SKIP
        tensor([5., 7., 9.])
    """
    import torch

    operator = define(op)
    record = op.record
    with _lock:
        if not record.torch_xla_dispatch:
            def xla_impl(*tensors: torch.Tensor, **kwargs: Any) -> Any:
                current = record.op
                return call(current, *tensors, **attrs_from_torch(current, kwargs))

            xla_impl.__name__ = xla_impl.__qualname__ = f"{op.name.rpartition('.')[2]}_xla"
            torch.library.impl(operator.qualname, "XLA", xla_impl)
            if any(t.in_place for t in op.inputs):
                torch.library.impl(operator.qualname, "Functionalize",
                                   _functionalize_kernel(operator.packet, xla_impl))
            record.torch_xla_dispatch = True
    return operator.packet


def _functionalize_kernel(packet: Any, xla_impl: Any) -> Any:
    """The ``Functionalize`` kernel of an op that updates inputs in place.

    torch_xla runs every XLA tensor through torch's functionalization, whose generic
    fallback refuses an operator with mutable arguments. On XLA tensors this kernel runs
    :func:`call` on the functional tensors themselves (the custom call aliases the operand;
    ``copy_`` records the update in the functional graph). On other tensors (e.g.
    ``torch.func.functionalize`` or ``torch.compile`` on CPU tensors in a process that
    also uses torch_xla) it runs the op below functionalization on copies of the updated
    inputs and makes the copies their new values: right for ``torch.func.functionalize``.
    ``torch.compile`` of such an op on CPU/CUDA tensors is not supported in a process that
    registered the op with torch_xla: AOT autograd auto-functionalizes only operators
    without a ``Functionalize`` kernel, and finds this one's graph not functional.
    """
    import torch

    def functionalize(*tensors: torch.Tensor, **kwargs: Any) -> Any:
        if any(isinstance(t, torch.Tensor) and t.device.type == "xla" for t in tensors):
            return xla_impl(*tensors, **kwargs)
        mutable = {i for i, a in enumerate(packet.default._schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write}
        inner = []
        for i, t in enumerate(tensors):
            if isinstance(t, torch.Tensor) and torch._is_functional_tensor(t):
                torch._sync(t)
                t = torch._from_functional_tensor(t)
            inner.append(t.clone() if i in mutable else t)
        functionalize_key = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
        with torch._C._ExcludeDispatchKeyGuard(functionalize_key):
            out = packet(*inner, **kwargs)
        for i in sorted(mutable):
            torch._functionalize_replace(tensors[i], inner[i])
            torch._functionalize_commit_update(tensors[i])
        return torch.utils._pytree.tree_map_only(torch.Tensor, torch._to_functional_tensor, out)

    return functionalize
