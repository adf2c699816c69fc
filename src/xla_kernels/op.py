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
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from xla_kernels import op_help
from xla_kernels import platforms as _platforms
from xla_kernels.attr_types import attr_type_of_value
from xla_kernels.attrs import Attr
from xla_kernels.call_plan import BoundCall, CallPlan
from xla_kernels.errors import OpDeclarationError, OpInputError, OpTypeError
from xla_kernels.frontends import jax as jax_frontend
from xla_kernels.kernel_decl import STAGES, Kernel
from xla_kernels.record import OpRecord, declare, record_of, records
from xla_kernels.spec import Invalid, Spec, Tensor, _bad_dim, is_symbolic, like, updated
from xla_kernels.vjp import Vjp, differentiable_dtype

# The declaration's parts live in their own modules; importing them from here keeps working.
__all__ = [
    "PLATFORMS",
    "STAGES",
    "VMAP_METHODS",
    "BoundCall",
    "CallPlan",
    "Invalid",
    "Kernel",
    "Op",
    "Spec",
    "Tensor",
    "Vjp",
    "declared_ops",
    "differentiable_dtype",
    "is_symbolic",
    "like",
    "updated",
]

PLATFORMS = _platforms.NAMES
VMAP_METHODS = ("sequential", "broadcast_all", "expand_dims")
# XLA takes any string as a custom-call target ("foo-fwd" in JAX's own FFI examples); an op's
# name is also typed on command lines and quoted in messages, so it has no whitespace.
_TARGET_NAME = re.compile(r"^[^\s\x00-\x1f\x7f]+$")



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
