"""An op's backward, declared once for every frontend (:class:`Vjp`), and which dtypes
carry gradients (:func:`differentiable_dtype`).

The doctests import :class:`~xla_kernels.op.Op` themselves: this module only names it in
annotations, since ``op`` imports this one.

Example:
    >>> Vjp(backward=None, args=("x", "dy"), grads=("x",)).takes_cotangent("y")
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xla_kernels.errors import OpDeclarationError
from xla_kernels.spec import Spec

if TYPE_CHECKING:
    from xla_kernels.op import Op


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

        >>> from xla_kernels.op import Kernel, Op, Tensor, like
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
            >>> from xla_kernels.op import Kernel, Op, Tensor, like
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
