"""Declaring an op once: inputs, attributes, output rule and kernels.

An :class:`Op` is the single source of truth from which every frontend is derived:
the JAX function (``op(x, y, alpha=2.0)``), the torch.library op and its fake
implementation, the torchax and torch_xla lowerings. It validates a call in Python
before anything is lowered, so a bad input raises an error that names the op, the
argument and the fix instead of an XLA crash.

Example:
    >>> import xla_kernels as xk
    >>> scale = xk.Op(
    ...     "docs.scale",
    ...     inputs=[xk.Tensor("x", dtypes=("f32",))],
    ...     attrs=[xk.Attr("factor", float, default=2.0)],
    ...     outputs=lambda x, *, factor: xk.like(x),
    ...     kernels={"cpu": xk.Kernel(["scale.cc"], handler="Scale")},
    ... )
    >>> plan = scale.bind([xk.Spec((3,), "f32")], {})
    >>> plan.outputs, plan.attrs
    ((Spec(shape=(3,), dtype='f32', workspace=False),), {'factor': np.float32(2.0)})
    >>> plan.mlir_dict()
    '{factor = 2.000000e+00 : f32}'
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_kernels import dtypes as _dtypes
from xla_kernels import op_help
from xla_kernels import platforms as _platforms
from xla_kernels.attr_types import AttrType, EagerAttr, attr_type_of_value
from xla_kernels.attrs import Attr, mlir_dict
from xla_kernels.errors import OpDeclarationError, OpInputError, OpTypeError
from xla_kernels.frontends import jax as jax_frontend
from xla_kernels.record import OpRecord, declare, record_of, records
from xla_kernels.runtime.library import kernel_of

if TYPE_CHECKING:
    from xla_kernels.runtime.library import LoadedKernel

PLATFORMS = _platforms.NAMES
VMAP_METHODS = ("sequential", "broadcast_all", "expand_dims")
# XLA takes any string as a custom-call target ("foo-fwd" in JAX's own FFI examples); an op's
# name is also typed on command lines and quoted in messages, so it has no whitespace.
_TARGET_NAME = re.compile(r"^[^\s\x00-\x1f\x7f]+$")


@dataclasses.dataclass(frozen=True)
class Spec:
    """Shape and dtype of one array: what shape rules receive and return.

    ``workspace=True`` marks an output the kernel needs as scratch: it is allocated
    and passed to the kernel, but never returned to the caller. ``updates`` names the
    input an output *is*, updated in place (see :func:`updated`). ``name`` is the input's
    name on the Specs a shape rule receives.

    Example:
        >>> Spec([2, 3], "float32")
        Spec(shape=(2, 3), dtype='f32', workspace=False)
    """

    shape: tuple[int, ...]
    dtype: str
    workspace: bool = False
    updates: str | None = dataclasses.field(default=None, repr=False, compare=False)
    name: str | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(_dim(d) for d in self.shape))
        object.__setattr__(self, "dtype", _dtypes.canonical(self.dtype))

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


def is_symbolic(d: Any) -> bool:
    """Whether ``d`` is a symbolic dimension of ``jax.export`` (the test JAX itself uses,
    so that this module does not import JAX).

    Example:
        >>> is_symbolic(3)
        False
    """
    return getattr(d, "dimension_as_value", None) is not None


def _dim(d: Any) -> Any:
    """A Spec dimension: any integer type becomes an int; a symbolic dimension, a bool or a
    non-integer stays as it is, for :meth:`Op.bind` to keep or to reject with the op's name
    (converting would hide a shape rule's mistake, e.g. ``n / 2``, as a wrong size)."""
    if is_symbolic(d) or isinstance(d, bool):
        return d
    try:
        return operator.index(d)
    except TypeError:
        return d


def _bad_dim(d: Any) -> tuple[str, str] | None:
    """(problem, fix) of an output dimension XLA cannot allocate, or None if it is a size
    (zero included: empty arrays are valid)."""
    if is_symbolic(d):
        return None
    if not isinstance(d, int) or isinstance(d, bool):
        return (f"is {d!r} ({type(d).__name__}), not an int",
                "return int sizes from the shape rule (// rather than /)")
    if d < 0:
        return (f"is {d}, a negative size", "check in the shape rule the inputs and "
                "attributes this size is computed from, and raise xk.Invalid(argument, "
                "problem, fix) for values that make it negative")
    return None


def like(x: Spec, *, dtype: Any = None) -> Spec:
    """An output with the shape (and, unless given, the dtype) of ``x``.

    Example:
        >>> like(Spec((4,), "f16"), dtype="f32")
        Spec(shape=(4,), dtype='f32', workspace=False)
    """
    return Spec(x.shape, x.dtype if dtype is None else dtype)


def updated(x: Spec) -> Spec:
    """An output that is the input ``x`` itself, updated in place by the kernel.

    The kernel's result buffer is ``x``'s buffer. JAX returns the updated array (one
    custom-call whose output aliases the operand: no copy under ``donate_argnums``, a copy
    XLA inserts otherwise); torch mutates the tensor (schema ``Tensor(a!)``) and does not
    return it.

    Example:
        >>> rule = lambda cache, rows: updated(cache)
        >>> out = rule(Spec((8, 4), "f32", name="cache"), Spec((2, 4), "f32", name="rows"))
        >>> out.updates, out.shape
        ('cache', (8, 4))
    """
    if x.name is None:
        raise OpDeclarationError(None, "updated() takes one of the Specs the shape rule "
                                       "received for an input", "pass that Spec, e.g. "
                                       "updated(cache)")
    return Spec(x.shape, x.dtype, updates=x.name)


class Invalid(Exception):
    """Raised by a shape rule to reject a call; the op turns it into an :class:`OpInputError`.

    Example:
        >>> def rule(a, b):
        ...     if a.shape != b.shape:
        ...         raise Invalid("b", f"shape {b.shape} differs from a's {a.shape}",
        ...                       "pass arrays of one shape")
        ...     return like(a)
    """

    def __init__(self, arg: str | None, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.arg, self.problem, self.fix = arg, problem, fix


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An array input of an op.

    Args:
        name: argument name, used in messages and as the torch schema name.
        dtypes: the element types the kernels accept (``"f32"``, ``"bf16"``, ...).
        rank: allowed number of dimensions: an int, a tuple of ints, or None for any.
        in_place: the kernel updates this input in place; the shape rule returns
            ``updated(x)`` for it, in the position of the handler's result.

    Example:
        >>> Tensor("x", dtypes=("float32", "bf16"), rank=(1, 2)).dtypes
        ('f32', 'bf16')
    """

    name: str
    dtypes: tuple[str, ...]
    rank: int | tuple[int, ...] | None = None
    doc: str = ""
    in_place: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise OpDeclarationError(None, f"input name {self.name!r} is not an identifier")
        if isinstance(self.dtypes, str):
            raise OpDeclarationError(None, f"input '{self.name}': dtypes must be a sequence",
                                     f'write dtypes=("{self.dtypes}",)')
        object.__setattr__(self, "dtypes", tuple(_dtypes.canonical(d) for d in self.dtypes))
        if isinstance(self.rank, int):
            object.__setattr__(self, "rank", (self.rank,))

    def check(self, op: str, spec: Spec) -> None:
        """Raise an input error if ``spec`` is not acceptable for this input."""
        if spec.dtype not in self.dtypes:
            raise OpTypeError(op, self.name, f"dtype {spec.dtype} is not supported",
                              f"pass one of {', '.join(self.dtypes)} (cast the input first)")
        if self.rank is not None and spec.ndim not in self.rank:
            want = " or ".join(str(r) for r in self.rank)
            raise OpInputError(op, self.name, f"expected rank {want}, got shape {spec.shape}",
                               f"pass an array with {want} dimensions")


STAGES = ("instantiate", "prepare", "initialize", "execute")
"""The XLA FFI execution stages a kernel may name a handler for (``XLA_FFI_ExecutionStage``)."""


@dataclasses.dataclass(frozen=True)
class Kernel:
    """The sources and handler symbol implementing an op on one platform.

    Relative source paths are resolved against the folder of the file that declares
    the op. ``handler`` is the ``XLA_FFI_DEFINE_HANDLER_SYMBOL`` name of the execute
    handler, or a dict with one handler per XLA FFI stage (``"instantiate"``,
    ``"prepare"``, ``"initialize"``, ``"execute"``; execute is required). ``types``
    names the custom FFI types (the state an instantiate handler returns) to register
    before the handlers: ``{"my_lib.MyState": "MyStateTypeId"}`` names a function
    declared with ``XLA_FFI_DECLARE_TYPE_ID_SYMBOL`` returning ``&MyState::id``; the form
    ``{"type_id": "MyStateTypeId", "type_info": "MyStateTypeInfo"}`` adds the
    ``XLA_FFI_DECLARE_TYPE_INFO_SYMBOL`` function whose deleter frees states. See
    docs/stages.md. For kernels written for XLA's old custom-call API, use :meth:`legacy`.
    ``arch_specific=True`` (CUDA) builds every target arch that has an architecture-specific
    variant as that variant, e.g. ``90`` as ``sm_90a`` (for wgmma; guard such code with
    ``__CUDA_ARCH_FEAT_SM90_ALL``); other archs are built as usual.

    Example:
        >>> Kernel(["add.cu"], handler="Add").handler
        'Add'
        >>> Kernel(["attn.cu"], handler="Attn", arch_specific=True).arch_specific
        True
        >>> k = Kernel(["k.cc"], handler={"instantiate": "MyInit", "execute": "MyRun"},
        ...            types={"my_lib.MyState": {"type_id": "MyStateId",
        ...                                      "type_info": "MyStateInfo"}})
        >>> k.handler, k.stages["instantiate"], k.stateful
        ('MyRun', 'MyInit', True)
    """

    sources: tuple[str, ...]
    handler: str | Mapping[str, str]
    include_dirs: tuple[str, ...] = ()
    defines: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flags: tuple[str, ...] = ()
    legacy_function: str | None = None
    base_dir: Path | None = None
    dtypes: tuple[str, ...] | None = None
    stages: Mapping[str, str] = dataclasses.field(default_factory=dict)
    types: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    arch_specific: bool = False

    def __post_init__(self) -> None:
        self._normalize_stages()
        if isinstance(self.sources, (str, Path)):
            object.__setattr__(self, "sources", (str(self.sources),))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        object.__setattr__(self, "include_dirs", tuple(str(s) for s in self.include_dirs))
        object.__setattr__(self, "flags", tuple(self.flags))
        if self.dtypes is not None:
            object.__setattr__(self, "dtypes", tuple(_dtypes.canonical(d) for d in self.dtypes))
        if not self.sources:
            raise OpDeclarationError(None, f"kernel '{self.handler}' has no sources")
        if not self.handler.isidentifier():
            raise OpDeclarationError(None, f"handler {self.handler!r} is not a C identifier")

    @property
    def stateful(self) -> bool:
        """Whether the kernel names a handler for a stage other than execute, or custom FFI
        types: the eager runtime then keeps a state per call attributes for it."""
        return bool(self.types) or any(stage != "execute" for stage in self.stages)

    def _normalize_stages(self) -> None:
        """``handler`` (a str or a stage dict) and ``stages`` into ``handler`` = the execute
        symbol and ``stages`` = every stage's symbol; ``types`` into ``{name: {"type_id":
        symbol, "type_info": symbol or None}}``. Raises OpDeclarationError on bad input."""
        example = 'handler={"instantiate": "MyInstantiate", "execute": "MyExecute"}'
        handler = self.handler
        stages = dict(handler) if isinstance(handler, Mapping) else dict(self.stages)
        if not isinstance(handler, Mapping):
            if not isinstance(handler, str):
                raise OpDeclarationError(None, f"handler must be a symbol name or a dict of "
                                         f"them by stage, got {type(handler).__name__}", example)
            stages.setdefault("execute", handler)
        unknown = sorted(str(k) for k in stages if k not in STAGES)
        if unknown:
            raise OpDeclarationError(None, f"Kernel handler: unknown stage {unknown[0]!r}",
                                     f"name handlers for stages {', '.join(STAGES)}")
        if "execute" not in stages:
            raise OpDeclarationError(None, f"Kernel handler {handler!r} has no execute stage",
                                     example)
        for stage, symbol in stages.items():
            if not isinstance(symbol, str) or not symbol.isidentifier():
                raise OpDeclarationError(None, f"the {stage} handler {symbol!r} is not a C "
                                         "identifier", "pass the symbol name as a str")
        if not isinstance(handler, Mapping) and stages["execute"] != handler:
            raise OpDeclarationError(None, f"handler {handler!r} differs from the execute "
                                     f"stage's {stages['execute']!r}", example)
        types = {}
        for name, symbols in dict(self.types).items():
            if isinstance(symbols, str):
                symbols = {"type_id": symbols}
            if (not isinstance(name, str) or not name or not isinstance(symbols, Mapping)
                    or not set(symbols) <= {"type_id", "type_info"} or "type_id" not in symbols
                    or not all(isinstance(v, str) and v.isidentifier()
                               for v in symbols.values() if v is not None)):
                raise OpDeclarationError(
                    None, f"Kernel types: bad entry {name!r}: {symbols!r}",
                    'write types={"my_lib.MyState": "MyStateTypeId"} or {"my_lib.MyState": '
                    '{"type_id": "MyStateTypeId", "type_info": "MyStateTypeInfo"}}')
            types[name] = {"type_id": symbols["type_id"], "type_info": symbols.get("type_info")}
        object.__setattr__(self, "handler", stages["execute"])
        object.__setattr__(self, "stages", {s: stages[s] for s in STAGES if s in stages})
        object.__setattr__(self, "types", types)

    @classmethod
    def legacy(cls, sources: Sequence[str] | str, function: str, *,
               signature: str = "buffers", **kwargs: Any) -> Kernel:
        """A kernel with the old signature, run unchanged through a typed-FFI adapter.

        ``signature="buffers"`` (default):
        ``void fn(cudaStream_t stream, void** buffers, const char* opaque, size_t len)``
        (on the CPU the stream is a ``void*`` and is null). ``buffers`` holds the inputs,
        then the outputs; ``opaque`` is the op's ``opaque`` bytes attribute.
        ``signature="cpu_classic"`` (CPU only): ``void fn(void* out, const void** in)`` or
        ``void fn(void* out, const void** in, XlaCustomCallStatus* status)``; with several
        outputs ``out`` is a ``void**`` table of them. See docs/legacy_and_dtypes.md.

        Example:
            >>> Kernel.legacy(["add.cu"], function="XlaGpuSimpleAdd").handler
            'XlaKernelsLegacy_XlaGpuSimpleAdd'
            >>> Kernel.legacy("add.cc", "Add", signature="cpu_classic").defines["XK_LEGACY_ADAPTER"]
            'XLA_KERNELS_LEGACY_CPU_CLASSIC_HANDLER'
        """
        adapters = {"buffers": None, "cpu_classic": "XLA_KERNELS_LEGACY_CPU_CLASSIC_HANDLER"}
        if signature not in adapters:
            raise OpDeclarationError(None, f"Kernel.legacy({function!r}): unknown signature "
                                     f"{signature!r}", f"use one of {', '.join(adapters)}")
        if adapters[signature]:  # picked by include/xla_kernels/legacy_adapter.cc
            kwargs["defines"] = {**kwargs.get("defines", {}),
                                 "XK_LEGACY_ADAPTER": adapters[signature]}
        return cls(sources=sources, handler=f"XlaKernelsLegacy_{function}",
                   legacy_function=function, **kwargs)

    def resolved_sources(self) -> list[Path]:
        """Absolute paths of the sources."""
        return [self._resolve(s) for s in self.sources]

    def resolved_include_dirs(self) -> list[Path]:
        """Absolute paths of the extra include directories."""
        return [self._resolve(s) for s in self.include_dirs]

    def _resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() or self.base_dir is None else (self.base_dir / p).resolve()


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """One validated call: what every frontend consumes to run it.

    Attributes:
        op: the declaration that validated it.
        inputs: one Spec per array input.
        attrs: every attribute, coerced (declared defaults filled in).
        outputs: one Spec per kernel result, workspaces included.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> plan = simple_add.bind([Spec((3,), "f32")] * 2, {})
        >>> plan.visible_indices, plan.results(["sum"])
        ((0,), 'sum')
    """

    op: Op
    inputs: tuple[Spec, ...]
    attrs: dict[str, Any]
    outputs: tuple[Spec, ...]

    @property
    def visible_outputs(self) -> tuple[Spec, ...]:
        """The outputs returned to the caller (workspaces left out)."""
        return tuple(o for o in self.outputs if not o.workspace)

    @property
    def visible_indices(self) -> tuple[int, ...]:
        """Positions of the visible outputs among all kernel results."""
        return tuple(i for i, o in enumerate(self.outputs) if not o.workspace)

    @property
    def aliases(self) -> dict[int, int]:
        """``{input position: output position}`` of inputs updated in place."""
        names = {s.name: i for i, s in enumerate(self.inputs)}
        return {names[o.updates]: j for j, o in enumerate(self.outputs) if o.updates}

    def results(self, outs: Sequence[Any], *, with_updated: bool = True) -> Any:
        """What the caller gets from the kernel's results: one array, a tuple of them, or
        None. ``with_updated=False`` leaves out inputs updated in place (torch returns no
        alias of a mutated argument)."""
        visible = [outs[i] for i in self.visible_indices
                   if with_updated or not self.outputs[i].updates]
        if not visible:
            return None
        return visible[0] if len(visible) == 1 else tuple(visible)

    def codec(self, name: str) -> AttrType:
        """The codec of attribute ``name``: its declaration's, or for an undeclared one
        (``extra_attrs=True``) the codec of its coerced value."""
        return self.op.attr_types.get(name) or attr_type_of_value(self.attrs[name], name=name)

    def mlir_attributes(self) -> dict[str, str]:
        """Each attribute as MLIR attribute text (the JAX lowering parses these)."""
        return {k: self.codec(k).mlir_text(v) for k, v in sorted(self.attrs.items())}

    def mlir_dict(self) -> str:
        """The attributes as the MLIR dictionary of a typed-FFI ``backend_config``."""
        return mlir_dict(self.attrs, self.op.attr_types)

    def eager_attrs(self) -> dict[str, EagerAttr]:
        """The attributes as the eager FFI runtime takes them."""
        return {k: self.codec(k).eager(v) for k, v in self.attrs.items()}

    def hashable_attrs(self) -> tuple[Any, ...]:
        """The attributes as a hashable key (JAX primitive parameters, plan caches)."""
        return tuple((k, self.codec(k).hashable(v)) for k, v in sorted(self.attrs.items()))

    def kernel(self, platform: str) -> LoadedKernel:
        """The loaded kernel that runs this call on ``platform`` (checked for dtypes)."""
        self.op.check_platform(platform, self.inputs)
        return kernel_of(self.op, platform)


BoundCall = CallPlan
"""The earlier name of :class:`CallPlan`."""


@dataclasses.dataclass(frozen=True)
class Vjp:
    """An op's backward, declared once for every frontend (``jax.grad``, ``torch.autograd``).

    Args:
        backward: the op that computes the gradients.
        args: what the backward op takes, in order, by name: the forward's inputs, its
            visible outputs (``output_names``), and ``"d" + output name`` for the cotangent
            of an output.
        grads: the forward inputs whose gradients the backward returns, in order; the others
            (integer inputs, say) get none: asking for the gradient of a floating input left
            out raises (JAX: ``jax.grad`` with respect to it; torch: it requires grad)
            instead of giving zeros.
        nondiff_outputs: the visible outputs that carry no gradient, such as residuals
            the forward saves for the backward (what JAX's ``custom_vjp`` ``fwd`` returns
            beside the output): the backward takes no cotangent for them. In JAX a gradient
            reaching one raises :class:`~xla_kernels.errors.GradientError`; a loss that
            does not use it, or uses ``jax.lax.stop_gradient`` of it, differentiates as
            usual. torch marks them non-differentiable (``ctx.mark_non_differentiable``):
            ``requires_grad`` is False, so autograd treats them as constants, and a loss
            on them alone raises (it has nothing to differentiate).

    The op must declare ``output_names``. Every floating output either has its cotangent
    among ``args`` or is listed in ``nondiff_outputs``: a declaration that leaves one out is
    refused, since its gradient would silently be zero. Integer and bool outputs carry no
    gradient without being listed (the declaration tells them by running the shape rule on
    inputs of each input's first dtype).

    The backward op receives the forward call's attributes that it declares, by name.

    Second-order gradients (``jax.grad`` of ``jax.grad``, ``jax.jacrev`` of it, torch's
    ``create_graph=True``) differentiate the backward op: declare a ``Vjp`` on the backward
    op too, and they work. Without one they raise a
    :class:`~xla_kernels.errors.GradientError` naming both ops. JAX's forward mode
    (``jax.jvp``, ``jax.hessian``, ``jax.jacfwd``) is unavailable, as for any
    ``jax.custom_vjp``.

    Example:
        A forward ``(y, res) = square(x)`` with ``y = x ** 2`` and ``res = 2 * x``, whose
        backward reads the residual and ``y``'s cotangent (``dx = res * dy``):

        >>> square_bwd = Op("docs.square_bwd", inputs=[Tensor("res", ("f32",)),
        ...                                            Tensor("dy", ("f32",))],
        ...                 outputs=lambda res, dy: like(res), output_names=("dx",),
        ...                 kernels={"cpu": Kernel(["square.cc"], "SquareBwd")})
        >>> square = Op("docs.square", inputs=[Tensor("x", ("f32",))],
        ...             outputs=lambda x: (like(x), like(x)), output_names=("y", "res"),
        ...             vjp=Vjp(square_bwd, args=("res", "dy"), grads=("x",),
        ...                     nondiff_outputs=("res",)),
        ...             kernels={"cpu": Kernel(["square.cc"], "Square")})
        >>> square.vjp.takes_cotangent("y"), square.vjp.takes_cotangent("res")
        (True, False)

        Without ``nondiff_outputs`` a gradient through ``res`` would be dropped:

        >>> try:
        ...     Op("docs.square_unsaid", inputs=[Tensor("x", ("f32",))],
        ...        outputs=lambda x: (like(x), like(x)), output_names=("y", "res"),
        ...        vjp=Vjp(square_bwd, args=("res", "dy"), grads=("x",)),
        ...        kernels={"cpu": Kernel(["square.cc"], "Square")})
        ... except OpDeclarationError as e:
        ...     print(e)                                  # doctest: +NORMALIZE_WHITESPACE
        docs.square_unsaid: output 'res': the vjp takes no cotangent 'dres' for a floating
        output, so a gradient through it would be dropped. Fix: add 'dres' to the Vjp's
        args (the backward then receives it), or declare Vjp(..., nondiff_outputs=('res',))
        if it carries no gradient.

        For second order, ``square_bwd`` would declare its own
        ``vjp=Vjp(square_bwd_bwd, args=("res", "dy", "ddx"), grads=("res", "dy"))``.
    """

    backward: Any
    args: tuple[str, ...]
    grads: tuple[str, ...]
    nondiff_outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("args", "grads", "nondiff_outputs"):
            value = getattr(self, field)
            if isinstance(value, str):
                raise OpDeclarationError(None, f"Vjp {field} must be a sequence of names, "
                                         f"got the string {value!r}",
                                         f'write {field}=("{value}",)')
            object.__setattr__(self, field, tuple(value))

    def ungraded_input_message(self, op: Op, requested: Sequence[bool]) -> str | None:
        """The message for a gradient requested (``requested[i]``: input ``i`` is being
        differentiated) for an input the backward returns none for, or None if there is none.

        Example:
            >>> vjp = Vjp(backward=None, args=("x", "dy"), grads=("x",))
            >>> op = Op("docs.scaled", inputs=[Tensor("x", ("f32",)), Tensor("s", ("f32",))],
            ...         outputs=lambda x, s: like(x), kernels={"cpu": Kernel(["a.cc"], "A")})
            >>> print(vjp.ungraded_input_message(op, [True, True]))   # doctest: +ELLIPSIS
            docs.scaled: argument 's': a gradient was requested for it, but the vjp returns ...
        """
        for tensor, wanted in zip(op.inputs, requested, strict=True):
            if wanted and tensor.name not in self.grads:
                return (f"{op.name}: argument {tensor.name!r}: a gradient was requested for "
                        f"it, but the vjp returns none (grads={self.grads}). Fix: add "
                        f"{tensor.name!r} to the Vjp's grads with a backward that computes it, "
                        f"or stop its gradient (jax.lax.stop_gradient, or .detach() in torch).")
        return None

    def takes_cotangent(self, output: str) -> bool:
        """Whether the backward takes the cotangent of ``output``: whether it is
        differentiable."""
        return f"d{output}" in self.args

    def check(self, op: Op) -> None:
        """Raise unless every name refers to something ``op`` has, and every floating
        output either has its cotangent taken or is declared non-differentiable."""
        if not op.output_names:
            raise OpDeclarationError(op.name, "the op declares a vjp but no output_names",
                                     "name each visible output, e.g. output_names=('y',), "
                                     "so that the vjp can take its cotangent 'dy'")
        self._check_names(op)
        self._check_nondiff_outputs(op)
        self._check_every_output_accounted(op)

    def _check_names(self, op: Op) -> None:
        outputs = tuple(op.output_names or ())
        known = {t.name for t in op.inputs} | set(outputs) | {f"d{n}" for n in outputs}
        for name in self.args:
            if name not in known:
                raise OpDeclarationError(
                    op.name, f"the vjp takes {name!r}, which is neither an input, an output "
                    "nor an output's cotangent", "name inputs, output_names, or 'd' + an "
                    "output name (declare output_names=...)")
        inputs = {t.name for t in op.inputs}
        for name in self.grads:
            if name not in inputs:
                raise OpDeclarationError(op.name, f"the vjp returns a gradient for {name!r}, "
                                         "which is not an input", "list inputs in grads")

    def _check_nondiff_outputs(self, op: Op) -> None:
        outputs = tuple(op.output_names or ())
        for name in self.nondiff_outputs:
            if name not in outputs:
                raise OpDeclarationError(
                    op.name, f"output {name!r}: nondiff_outputs names it, but it is not an "
                    f"output (output_names={outputs})", "list names from output_names")
            if self.takes_cotangent(name):
                raise OpDeclarationError(
                    op.name, f"output {name!r}: nondiff_outputs declares it non-differentiable,"
                    f" but the vjp takes its cotangent 'd{name}'",
                    f"drop 'd{name}' from args, or {name!r} from nondiff_outputs")

    def _check_every_output_accounted(self, op: Op) -> None:
        # A floating output whose cotangent the backward never sees would get a zero
        # gradient without a word; only integer outputs may go unnamed. Their dtypes come
        # from the shape rule, run on probe inputs only when some output is unnamed.
        unnamed = [n for n in op.output_names or () if not self.takes_cotangent(n)
                   and n not in self.nondiff_outputs]
        if not unnamed:
            return
        probed = _probe_visible_outputs(op)
        if probed is not None and len(probed) != len(op.output_names or ()):
            probed = None
        for i, name in enumerate(op.output_names or ()):
            if name not in unnamed or (probed and not differentiable_dtype(probed[i].dtype)):
                continue
            why = ("for a floating output, so a gradient through it would be dropped" if probed
                   else "and the shape rule rejected every probe input, so it may be a "
                   "floating output whose gradient would be dropped")
            raise OpDeclarationError(
                op.name, f"output {name!r}: the vjp takes no cotangent 'd{name}' {why}",
                f"add 'd{name}' to the Vjp's args (the backward then receives it), or declare "
                f"Vjp(..., nondiff_outputs=({name!r},)) if it carries no gradient")

    def backward_call(self, op: Op, inputs: Sequence[Any], outputs: Sequence[Any],
                      cotangents: Sequence[Any], attrs: Mapping[str, Any]
                      ) -> tuple[list[Any], dict[str, Any]]:
        """The backward op's arrays and attributes, for any frontend's arrays.

        ``outputs`` and ``cotangents`` are the visible outputs, in ``output_names`` order.
        """
        values = dict(zip((t.name for t in op.inputs), inputs, strict=True))
        names = tuple(op.output_names or ())
        values.update(zip(names, outputs, strict=False))
        values.update(zip((f"d{n}" for n in names), cotangents, strict=False))
        wanted = {a.name for a in self.backward.attrs}
        return ([values[n] for n in self.args],
                {k: v for k, v in attrs.items() if k in wanted})

    def input_grads(self, op: Op, grads: Any) -> list[Any]:
        """One gradient (or None) per forward input, from the backward op's result."""
        grads = grads if isinstance(grads, (tuple, list)) else (grads,)
        if len(grads) != len(self.grads):
            raise OpDeclarationError(op.name, f"its backward {self.backward.name} returned "
                                     f"{len(grads)} arrays for grads {self.grads}",
                                     "make the backward return one gradient per name in grads")
        by_name = dict(zip(self.grads, grads, strict=True))
        return [by_name.get(t.name) for t in op.inputs]

    def second_order_message(self, op: Op) -> str:
        """The message for differentiating the backward op, which declares no vjp."""
        backward = self.backward.name
        return (f"{op.name}: second-order gradients are unavailable: its backward op "
                f"{backward!r} declares no vjp. Fix: declare vjp=xk.Vjp(...) on {backward} "
                f"(the backward of the backward), or differentiate {op.name} once.")


def differentiable_dtype(dtype: str) -> bool:
    """Whether arrays of ``dtype`` carry gradients (floating and complex ones do).

    Example:
        >>> differentiable_dtype("bf16"), differentiable_dtype("i32")
        (True, False)
    """
    return dtype != "bool" and not dtype.startswith(("i", "u"))


def _probe_visible_outputs(op: Op) -> tuple[Spec, ...] | None:
    """The visible outputs of one call the shape rule accepts, on probe inputs (each input's
    first dtype, every input of one shape, required attributes set to small values), or
    None if it rejects every probe."""
    attrs = {a.name: a.codec.probe() for a in op.attrs if a.required}
    for side in (2, 1, 8, 128):
        for rank in range(5):
            probe = [Spec((side,) * (rank if t.rank is None or rank in t.rank else t.rank[0]),
                          t.dtypes[0]) for t in op.inputs]
            try:
                return op.bind(probe, attrs).visible_outputs
            except Exception:  # the rule may reject this probe: try the next one
                continue
    return None


class Op:
    """One custom op, declared once and usable from every frontend.

    The shape rule (``outputs``) guards the kernel:

    * The library checks before the rule runs: the number of inputs, each input's dtype
      and rank against its :class:`Tensor` (``dtypes``, ``rank``), each attribute's type
      (``dict[str, T]`` entries too) and that required attributes are given. Everything
      else the kernel relies on (sizes that must match between inputs, attribute ranges,
      divisibility) the rule must check itself, for every input it uses: XLA hands the
      kernel whatever shapes the rule accepted.
    * It rejects a call with ``raise Invalid(argument, problem, fix)``; the caller gets an
      :class:`OpInputError` reading ``<op>: argument '<argument>': <problem>. Fix: <fix>.``
    * It returns int sizes >= 0 (0 is an empty array); a negative or non-int size is an
      :class:`OpDeclarationError` naming the output.
    * Symbolic shapes (``jax.export.symbolic_shape`` through ``xk.export``): the rule gets
      the symbolic dimensions; arithmetic, ``==`` and ``like``/``Spec`` of them work, and
      the kernel reads the real sizes from its buffers. ``<``, ``>`` or ``int()`` on one
      work only under a matching constraint (``symbolic_shape("n", constraints=["n <= 4"])``);
      otherwise the call raises an :class:`OpInputError` saying so.

    Gradients: an op with a ``vjp`` declares ``output_names`` (the backward's arguments
    name outputs and their cotangents, ``"d" + name``); a second-order gradient needs the
    backward op's own ``vjp``.

    Args:
        name: the op's name and its ``custom_call_target`` in HLO, e.g. ``"my_lib.add"``:
            any target XLA takes that has no whitespace (``"my_lib.add-fwd"`` too; the
            torch operator's name is derived from it, see
            :func:`xla_kernels.frontends.torch.qualified_name`).
        inputs: the array inputs, in order.
        outputs: the shape rule: called with one :class:`Spec` per input (positionally)
            and the attributes (as keywords); returns a Spec or a sequence of Specs.
            It raises :class:`Invalid` to reject a call.
        attrs: the typed attributes, passed by keyword.
        kernels: ``{"cpu": Kernel(...), "cuda": Kernel(...)}``; at least one.
        vmap_method: how ``jax.vmap`` batches the op: ``"sequential"`` (a loop of calls,
            always correct), ``"broadcast_all"`` or ``"expand_dims"`` (one call on arrays
            with a leading batch dimension; the kernel must accept it).
        output_names: names of the visible outputs (what the shape rule returns, less
            workspaces). Frontends that need the count before any call (the torch schema)
            take it from here; without it they run the shape rule on probe inputs.
        has_side_effect: the kernel does more than compute its outputs (a counter, I/O,
            state): calls are never merged or removed, even when their results are unused.
        vjp: the backward (:class:`Vjp`): ``jax.grad``/``jax.vjp`` and ``torch.autograd``
            (eager and ``torch.compile``) use it. Without one, a gradient request raises.
        sharding_rule: how XLA's SPMD partitioner (Shardy) may split the op: an einsum-like
            string over factor names, one term per input and per visible output (inputs
            updated in place included), e.g. ``"..., ... -> ..."`` for an elementwise op, or a
            function of
            the :class:`CallPlan` returning that string or ``(string, options)`` where
            options are ``need_replication_factors=(...)``, ``reduction_factors=(...)`` and
            factor sizes. Under plain ``jax.jit`` with sharded inputs the op then runs per
            shard; without a rule XLA gathers its operands.
        doc: what the op computes: ``help(op)`` shows it after the op's signature (and a
            line per input, attribute and output); the generated functions carry it too.
        extra_attrs: accept keyword attributes beyond ``attrs`` and pass them to the kernel,
            each coerced by the codec of its Python value (``int`` is int64, ``float`` f32,
            see :func:`xla_kernels.attr_types.attr_type_of_value`), for handlers that take
            every attribute as one ``ffi::Dictionary`` (``.Attrs()``). The shape rule gets
            the declared attributes only. Without it an unknown attribute is an error.

    Attributes:
        module: the module that declared the op (what a loader of a program that uses it
            must import).
        attr_types: each attribute's codec (:mod:`xla_kernels.attr_types`), by name.

    Example:
        >>> op = Op("docs.add", inputs=[Tensor("a", ("f32",)), Tensor("b", ("f32",))],
        ...         outputs=lambda a, b: like(a), kernels={"cpu": Kernel(["a.cc"], "Add")})
        >>> op.target
        'docs.add'
    """

    def __init__(
        self,
        name: str,
        *,
        inputs: Sequence[Tensor],
        outputs: Callable[..., Spec | Sequence[Spec]],
        attrs: Sequence[Attr] = (),
        kernels: Mapping[str, Kernel],
        vmap_method: str = "sequential",
        output_names: Sequence[str] | None = None,
        has_side_effect: bool = False,
        vjp: Vjp | None = None,
        sharding_rule: str | Callable[[CallPlan], Any] | None = None,
        doc: str = "",
        extra_attrs: bool = False,
    ):
        if not isinstance(name, str) or not _TARGET_NAME.match(name):
            raise OpDeclarationError(name, "the op name must be a valid custom-call target",
                                     "use letters, digits and punctuation, without whitespace "
                                     "or control characters")
        self.name = name
        self.inputs = tuple(inputs)
        self.attrs = tuple(attrs)
        self.output_rule = outputs
        self.vmap_method = vmap_method
        self.output_names = None if output_names is None else tuple(output_names)
        self.has_side_effect = bool(has_side_effect)
        self.vjp = vjp
        self.sharding_rule = sharding_rule
        self.doc = doc
        self.extra_attrs = bool(extra_attrs)
        base, self.module = _caller_location()
        self.kernels = {p: k if k.base_dir else dataclasses.replace(k, base_dir=base)
                        for p, k in kernels.items()}
        self._implicit_attrs: frozenset[str] = frozenset()
        if any(k.legacy_function for k in self.kernels.values()) and not any(
                a.name == "opaque" for a in self.attrs):
            # Legacy kernels read their parameters from opaque bytes; the shape rule,
            # written without it, never sees this attribute.
            self.attrs += (Attr("opaque", bytes, default=b"", doc="legacy opaque bytes"),)
            self._implicit_attrs = frozenset({"opaque"})
        self.attr_types = {a.name: a.codec for a in self.attrs}
        self._check_declaration()
        # help(op) prints an instance's own __doc__; inspect.signature reads __signature__.
        self.__doc__ = op_help.docstring(self)
        self.__signature__ = op_help.signature(self)
        declare(self)

    @property
    def target(self) -> str:
        """The ``custom_call_target`` this op lowers to."""
        return self.name

    @property
    def record(self) -> OpRecord:
        """The record of this op's target: what every frontend made from it."""
        return record_of(self.target)

    def __repr__(self) -> str:
        ins = ", ".join(t.name for t in self.inputs)
        kws = ", ".join(a.name for a in self.attrs)
        return f"Op({self.name}({ins}{'; ' + kws if kws else ''}), kernels={sorted(self.kernels)})"

    def _check_declaration(self) -> None:
        names = [t.name for t in self.inputs] + [a.name for a in self.attrs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise OpDeclarationError(self.name, f"duplicate argument names {dupes}")
        if not self.kernels:
            raise OpDeclarationError(self.name, "no kernels given",
                                     'pass kernels={"cpu": Kernel(...), "cuda": Kernel(...)}')
        unknown = sorted(set(self.kernels) - set(_platforms.NAMES))
        if unknown:
            raise OpDeclarationError(self.name, f"unknown platforms {unknown}",
                                     f"use {' and/or '.join(PLATFORMS)}")
        if self.output_names is not None and not self.output_names:
            raise OpDeclarationError(self.name, "output_names is empty",
                                     "name each visible output, e.g. output_names=('out',)")
        if self.vmap_method not in VMAP_METHODS:
            raise OpDeclarationError(self.name, f"unknown vmap_method {self.vmap_method!r}",
                                     f"use one of {', '.join(VMAP_METHODS)}")
        if self.vjp is not None:
            self.vjp.check(self)

    def bind(self, inputs: Sequence[Any], attrs: Mapping[str, Any], *,
             coerced: bool = False) -> CallPlan:
        """Validate a call and compute its outputs: the :class:`CallPlan` frontends run.

        ``inputs`` are Specs or anything with ``.shape`` and ``.dtype`` (JAX, NumPy and
        torch arrays, tracers, fake tensors). ``coerced=True`` says ``attrs`` is already
        the complete output of an earlier bind. Raises :class:`OpInputError` (a
        ``ValueError``) or :class:`OpTypeError` (also a ``TypeError``) on bad input.
        """
        if len(inputs) != len(self.inputs):
            names = ", ".join(t.name for t in self.inputs)
            raise OpInputError(self.name, None,
                               f"expected {len(self.inputs)} array inputs ({names}), "
                               f"got {len(inputs)}", "pass the arrays positionally, "
                               "attributes by keyword")
        specs = tuple(self._spec_of(t, x) for t, x in zip(self.inputs, inputs, strict=True))
        for t, s in zip(self.inputs, specs, strict=True):
            t.check(self.name, s)
        values = dict(attrs) if coerced else self._coerce_attrs(attrs)
        rule_attrs = {k: v for k, v in values.items()
                      if k in self.attr_types and k not in self._implicit_attrs}
        try:
            out = self.output_rule(*specs, **rule_attrs)
        except Invalid as e:
            raise OpInputError(self.name, e.arg, e.problem, e.fix) from None
        except Exception as e:
            if _undecidable(e):
                raise self._undecidable_error(specs, e) from e
            raise
        outputs = (out,) if isinstance(out, Spec) else (
            tuple(out) if isinstance(out, (list, tuple)) else ())
        if not outputs or not all(isinstance(o, Spec) for o in outputs):
            raise OpDeclarationError(self.name, f"the output rule returned {out!r}",
                                     "return a Spec or a sequence of Specs")
        self._check_sizes(outputs)
        self._check_updates(specs, outputs)
        return CallPlan(self, specs, values, outputs)

    def _check_sizes(self, outputs: tuple[Spec, ...]) -> None:
        """Reject an output dimension XLA cannot allocate (MLIR would fail, unnamed)."""
        for i, o in enumerate(outputs):
            for axis, d in enumerate(o.shape):
                bad = _bad_dim(d)
                if bad is not None:
                    raise OpDeclarationError(
                        self.name, f"{self._output_name(outputs, i)}: the shape rule returned "
                        f"shape {o.shape}, whose dimension {axis} {bad[0]}", bad[1])

    def _output_name(self, outputs: tuple[Spec, ...], i: int) -> str:
        """How messages name output ``i``: by ``output_names`` when declared."""
        visible = [j for j, o in enumerate(outputs) if not o.workspace]
        names = self.output_names
        if names is not None and i in visible and len(names) == len(visible):
            return f"output '{names[visible.index(i)]}'"
        return f"{'workspace ' if outputs[i].workspace else ''}output {i}"

    def _undecidable_error(self, specs: tuple[Spec, ...], error: Exception) -> OpInputError:
        symbolic = [s for s in specs if any(is_symbolic(d) for d in s.shape)]
        said = str(error).splitlines()[0]
        return OpInputError(
            self.name, symbolic[0].name if symbolic else None,
            f"the shape rule needs a concrete value of a symbolic dimension (shape "
            f"{symbolic[0].shape if symbolic else '?'}; JAX said: {said})",
            "export with concrete sizes for this input, add the bound the rule tests to "
            "jax.export.symbolic_shape(..., constraints=[...]), or write the rule with "
            "arithmetic and == on dimensions only")

    def _check_updates(self, inputs: tuple[Spec, ...], outputs: tuple[Spec, ...]) -> None:
        by_name = {s.name: s for s in inputs}
        in_place = {t.name for t in self.inputs if t.in_place}
        seen: set[str] = set()
        for o in outputs:
            if o.updates is None:
                continue
            source = by_name.get(o.updates)
            if source is None or o.updates in seen or o.workspace:
                raise OpDeclarationError(
                    self.name, f"the output rule updates {o.updates!r} in place "
                    f"{'twice' if o.updates in seen else 'but it is not an input'}",
                    "return updated(x) once per input x the kernel writes")
            if (o.shape, o.dtype) != (source.shape, source.dtype):
                raise OpDeclarationError(self.name, f"the output updating {o.updates!r} has "
                                         f"another shape or dtype than the input",
                                         "return updated(x) unchanged")
            if o.updates not in in_place:
                raise OpDeclarationError(self.name, f"the output rule updates {o.updates!r} "
                                         "in place, but the input is not declared so",
                                         f"declare Tensor({o.updates!r}, ..., in_place=True)")
            seen.add(o.updates)
        if in_place - seen:
            missing = sorted(in_place - seen)[0]
            raise OpDeclarationError(self.name, f"input {missing!r} is declared in_place, but "
                                     "the output rule does not return it",
                                     f"return updated({missing}) among the outputs")

    def _spec_of(self, tensor: Tensor, x: Any) -> Spec:
        if isinstance(x, Spec):
            return x if x.name == tensor.name else Spec(x.shape, x.dtype, name=tensor.name)
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise OpTypeError(self.name, tensor.name, f"expected an array, got {type(x).__name__}",
                              "pass a JAX, NumPy or torch array")
        try:
            return Spec(tuple(x.shape), x.dtype, name=tensor.name)
        except TypeError as e:
            raise OpTypeError(self.name, tensor.name, str(e),
                              f"pass one of {', '.join(tensor.dtypes)}") from None

    def _coerce_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        known = {a.name: a for a in self.attrs}
        extra = sorted(set(attrs) - set(known))
        if extra and not self.extra_attrs:
            raise OpInputError(self.name, extra[0], "unknown attribute",
                               f"known attributes: {', '.join(known) or 'none'} (or declare "
                               "Op(..., extra_attrs=True) for a handler bound with .Attrs())")
        out = {}
        for name in extra:
            if not isinstance(name, str) or not name.isidentifier():
                raise OpInputError(self.name, str(name), "attribute names must be identifiers",
                                   "use letters, digits and '_' (not a leading digit)")
            value = attrs[name]
            out[name] = attr_type_of_value(value, op=self.name, name=name, raw=True).coerce(
                value, op=self.name, name=name)
        for a in self.attrs:
            if a.name in attrs:
                out[a.name] = a.coerce(attrs[a.name], op=self.name)
            elif a.required:
                raise OpInputError(self.name, a.name, "missing required attribute",
                                   f"pass {a.name}=<{getattr(a.type, '__name__', a.type)}>")
            else:
                out[a.name] = a.coerce(a.default, op=self.name)
        return out

    def check_platform(self, platform: str, inputs: Sequence[Spec]) -> None:
        """Raise if there is no ``platform`` kernel or it cannot take these inputs' dtypes."""
        kernel = self.kernels.get(platform)
        if kernel is None:
            raise _platforms.no_kernel_error(
                self.name, platform, self.kernels,
                f"run it on {' or '.join(sorted(self.kernels))}, or declare "
                f"kernels={{'{platform}': Kernel(...)}}")
        if kernel.dtypes is None:
            return
        for tensor, spec in zip(self.inputs, inputs, strict=True):
            if spec.dtype in tensor.dtypes and spec.dtype not in kernel.dtypes:
                raise OpTypeError(self.name, tensor.name,
                                  f"dtype {spec.dtype} is not supported on {platform}",
                                  f"pass one of {', '.join(kernel.dtypes)} there")

    def __call__(self, *arrays: Any, **attrs: Any) -> Any:
        """Run the op on JAX arrays (works under ``jax.jit`` and ``jax.vmap``): the JAX
        frontend's :func:`~xla_kernels.frontends.jax.call`."""
        return jax_frontend.call(self, arrays, attrs)


def _undecidable(error: Exception) -> bool:
    """Whether ``error`` is JAX's: a symbolic dimension was compared or made an int."""
    jax = sys.modules.get("jax")  # symbolic dimensions exist only once JAX is imported
    errors = getattr(jax, "errors", None)
    kind = getattr(errors, "InconclusiveDimensionOperation", None)
    return kind is not None and isinstance(error, kind)


def declared_ops() -> dict[str, Op]:
    """Every op declared in this process (its current declaration), by name.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> declared_ops()["xla_kernels.simple_add"] is simple_add
        True
    """
    return {name: record.op for name, record in records().items()}


def _caller_location() -> tuple[Path | None, str | None]:
    """Folder and module name of the first file on the stack outside this module.

    The folder resolves relative kernel sources; the module is what a process that loads
    an exported program must import to have the op declared again.
    """
    frame = inspect.currentframe()
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != __file__ and not filename.startswith("<"):
            return Path(filename).resolve().parent, frame.f_globals.get("__name__")
        frame = frame.f_back
    return None, None
