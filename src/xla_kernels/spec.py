"""What a shape rule sees and says: the Specs of arrays, array inputs (:class:`Tensor`),
outputs made from inputs (:func:`like`, :func:`updated`) and a rejected call (:class:`Invalid`).

Example:
    >>> rule = lambda x: like(x, dtype="f32")
    >>> rule(Spec((2, 3), "bf16"))
    Spec(shape=(2, 3), dtype='f32', workspace=False)
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from xla_kernels import dtypes as _dtypes
from xla_kernels.errors import OpDeclarationError, OpInputError, OpTypeError


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
