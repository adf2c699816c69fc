"""How a call of an op with a sharding rule is split across devices under plain ``jax.jit``.

The rule names a factor for every dimension of each input and visible output. Shardy picks
the results' shardings from it, but hands each operand to the partition callback split as
it arrived, so two operands that share a factor may be split differently (or one split and
one whole), and a kernel run on such shards would compute with data that does not
correspond. :func:`partition_shardings` therefore derives one assignment of mesh axes per
factor and gives every operand and result the sharding it implies: XLA reshards the
operands to match, the kernel sees corresponding shards, and only factors the kernel must
see whole are gathered.

Example:
    >>> rule = bind_rule("docs.add", "..., ... -> ...", {},
    ...                  [("a", (8, 6)), ("b", (8, 6))], [("out", (8, 6))])
    >>> rule.inputs[0]
    (('...0.0',), ('...0.1',))
    >>> axes = factor_axes(rule, [("x", "y")], {"x": 2, "y": 3})
    >>> tuple(term_spec(rule.inputs[1], (8, 6), axes))
    ('x', 'y')
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from xla_kernels.errors import OpDeclarationError

# One dimension of a term: its factors, major to minor (several for a compound "(k g)").
Dim = tuple[str, ...]

# Factor kinds the kernel cannot compute per shard: Shardy would all-reduce a split reduction
# factor and permute a split permutation factor, and the kernel does neither.
_WHOLE_KINDS = ("need_replication_factors", "reduction_factors", "permutation_factors")

_TOKEN = re.compile(r"\(([^()]*)\)|\.\.\.(\d*)|([A-Za-z_]\w*)|(\S)")


@dataclasses.dataclass(frozen=True)
class BoundRule:
    """An op's sharding rule checked against one call's shapes (hashable: it is a static
    argument of the ``custom_partitioning``).

    Attributes:
        text, options: the rule as Shardy receives it.
        inputs, outputs: per term, its dimensions (``...`` expanded into factors named
            ``...<group>.<i>``).
        sizes: ``(factor, size)`` pairs.
        splittable: the factors a kernel may see split: on an input and an output, longer
            than 1, and not of a kind it must see whole.
    """

    text: str
    options: tuple[tuple[str, Any], ...]
    inputs: tuple[tuple[Dim, ...], ...]
    outputs: tuple[tuple[Dim, ...], ...]
    sizes: tuple[tuple[str, int], ...]
    splittable: frozenset[str]

    def size(self, factor: str) -> int:
        """How long ``factor`` is."""
        return dict(self.sizes)[factor]


class _Binder:
    """Checks a rule's terms against the call's arrays, one error naming op and array."""

    def __init__(self, op: str, text: str):
        self.op, self.text = op, text
        self.sizes: dict[str, tuple[int, str]] = {}  # factor -> (size, where it was seen)
        self.ellipses: dict[str, tuple[int, str]] = {}  # group -> (rank, where)
        self.checked: list[tuple[tuple[Dim, ...], tuple[int, ...], str]] = []

    def fail(self, where: str, problem: str, fix: str) -> OpDeclarationError:
        return OpDeclarationError(self.op, f"{where}: {problem}", fix)

    def side(self, side: str, arrays: Sequence[tuple[str, tuple[int, ...]]], kind: str,
             label: str) -> tuple[tuple[Dim, ...], ...]:
        """One side's terms, each checked against its ``(name, shape)`` array and with
        ``...`` expanded; plain factors' sizes recorded."""
        terms = [t.strip() for t in side.split(",")]
        if len(terms) != len(arrays):
            problem = (f"its sharding rule {self.text!r} has {_count(len(terms), kind + ' term')}"
                       f" for {_count(len(arrays), kind)} "
                       f"({', '.join(n for n, _ in arrays) or 'none'})")
            fix = f"give one term per {kind}, in order"
            if len(terms) < len(arrays):
                raise self.fail(f"{label} '{arrays[len(terms)][0]}'", problem, fix)
            raise OpDeclarationError(self.op, problem, fix)
        bound = []
        for term, (name, shape) in zip(terms, arrays, strict=True):
            where, shape = f"{label} '{name}'", tuple(shape)
            dims = self.expand(self.parse(term, where), shape, where, term)
            self.record_sizes(dims, shape, where)
            self.checked.append((dims, shape, where))
            bound.append(dims)
        return tuple(bound)

    def parse(self, term: str, where: str) -> tuple[Dim | str, ...]:
        """A term's dimensions; a leading ``...`` stays a string (its group)."""
        dims: list[Dim | str] = []
        for match in _TOKEN.finditer(term):
            compound, group, factor, other = match.groups()
            if other is not None:
                raise self.fail(where, f"sharding rule term {term!r} cannot be read",
                                "write factor names, '(f g)' groups and a leading '...'")
            if compound is not None:
                dims.append(tuple(compound.split()))
            elif factor is not None:
                dims.append((factor,))
            else:
                dims.append(str(int(group)) if group else "0")
        if any(isinstance(d, str) for d in dims[1:]):
            raise self.fail(where, f"sharding rule term {term!r} has '...' after a factor",
                            "put '...' first in the term")
        return tuple(dims)

    def expand(self, dims: tuple[Dim | str, ...], shape: tuple[int, ...], where: str,
               term: str) -> tuple[Dim, ...]:
        """``dims`` with a leading ``...`` replaced by one factor per dimension it covers."""
        named = [d for d in dims if not isinstance(d, str)]
        if not dims or not isinstance(dims[0], str):
            if len(named) != len(shape):
                raise self.fail(where, f"sharding rule term {term!r} names {_dims(len(named))}"
                                f", the array has {len(shape)} (shape {shape})",
                                "give one factor per dimension, or a leading '...' for the "
                                "leading ones")
            return tuple(named)
        group, count = dims[0], len(shape) - len(named)
        if count < 0:
            raise self.fail(where, f"sharding rule term {term!r} names {_dims(len(named))}, "
                            f"the array has only {len(shape)} (shape {shape})",
                            "name at most one factor per dimension")
        seen = self.ellipses.setdefault(group, (count, where))
        if seen[0] != count:
            raise self.fail(where, f"'...' stands for {_dims(count)} here (shape {shape}) "
                            f"and {_dims(seen[0])} in {seen[1]}",
                            "pass arrays with as many leading dimensions, or broadcast them "
                            "first")
        return tuple((f"...{group}.{i}",) for i in range(count)) + tuple(named)

    def record_sizes(self, dims: tuple[Dim, ...], shape: tuple[int, ...], where: str) -> None:
        """Each plain factor's size; a size of 1 against a longer one is a broadcast."""
        for dim, size in zip(dims, shape, strict=True):
            if len(dim) != 1:
                continue
            known, at = self.sizes.setdefault(dim[0], (size, where))
            if known != size and 1 not in (known, size):
                raise self.fail(where, f"factor {dim[0]!r} has size {size} here and {known} "
                                f"in {at}", "pass arrays whose dimensions of one factor have "
                                "one length, or give them different factors in the rule")
            if size > known:
                self.sizes[dim[0]] = (size, where)

    def compound_sizes(self, given: Mapping[str, int]) -> None:
        """Sizes of factors seen only in compound dimensions: given, or the one unknown of
        a compound inferred from its dimension's length."""
        for factor, size in given.items():
            self.sizes.setdefault(factor, (size, "the rule's options"))
        pending = [(dim, size, where) for dims, shape, where in self.checked
                   for dim, size in zip(dims, shape, strict=True) if len(dim) > 1]
        while pending:
            left = []
            for dim, size, where in pending:
                unknown = [f for f in dim if f not in self.sizes]
                known = math.prod(self.sizes[f][0] for f in dim if f in self.sizes)
                if len(unknown) > 1:
                    left.append((dim, size, where))
                elif (size % known if unknown else size != known):
                    raise self.fail(where, f"compound factor ({' '.join(dim)}) cannot span a "
                                    f"dimension of {size}: its known factors make {known}",
                                    "give factor sizes whose product is the dimension")
                elif unknown:
                    self.sizes[unknown[0]] = (size // known, where)
            if len(left) == len(pending):
                dim, _, where = left[0]
                raise self.fail(where, f"the sizes of compound factor ({' '.join(dim)}) are "
                                "unknown", "give all but one of its factors' sizes in the "
                                "rule's options, or use them alone in another dimension")
            pending = left


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _dims(n: int) -> str:
    return _count(n, "dimension")


def bind_rule(op: str, text: str, options: Mapping[str, Any],
              inputs: Sequence[tuple[str, tuple[int, ...]]],
              outputs: Sequence[tuple[str, tuple[int, ...]]]) -> BoundRule:
    """Check ``text`` against the call's ``(name, shape)`` inputs and visible outputs.

    Raises:
        OpDeclarationError: naming the op and the array a term does not fit.
    """
    binder = _Binder(op, text)
    if text.count("->") != 1:
        raise OpDeclarationError(op, f"its sharding rule {text!r} has no single '->'",
                                 "write 'inputs -> outputs', e.g. '..., ... -> ...'")
    left, right = text.split("->")
    ins = binder.side(left, inputs, "input", "argument")
    outs = binder.side(right, outputs, "output", "result")
    binder.compound_sizes({k: int(v) for k, v in options.items() if not k.endswith("_factors")})
    sizes = {f: s for f, (s, _) in binder.sizes.items()}
    whole = {f for kind in _WHOLE_KINDS for f in options.get(kind, ())}
    factors_in = {f for dims in ins for dim in dims for f in dim}
    factors_out = {f for dims in outs for dim in dims for f in dim}
    splittable = frozenset(f for f in factors_in & factors_out
                           if f not in whole and sizes.get(f, 1) > 1)
    return BoundRule(text, tuple(sorted(options.items())), ins, outs,
                     tuple(sorted(sizes.items())), splittable)


def _entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry, major to minor."""
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, tuple):
        return tuple(a for a in entry if isinstance(a, str))
    return ()


def _split_dim(rule: BoundRule, dim: Dim, axes: Sequence[str], mesh: Mapping[str, int]
               ) -> dict[str, tuple[str, ...]]:
    """The axes of one result dimension shared out among its factors, major to minor. A
    minor factor gets axes only once the major ones are split to single elements: otherwise
    a device's slice of the dimension would not be one block of each factor."""
    queue = [a for a in axes if mesh.get(a, 1) > 1] if all(a in mesh for a in axes) else []
    shares: dict[str, tuple[str, ...]] = {}
    for factor in dim:
        left, taken = rule.size(factor), []
        while (queue and factor in rule.splittable and left > 1
               and left % mesh[queue[0]] == 0):
            left //= mesh[queue[0]]
            taken.append(queue.pop(0))
        shares[factor] = tuple(taken)
        if left > 1:
            break
    return shares


def factor_axes(rule: BoundRule, result_specs: Sequence[Sequence[Any]],
                mesh: Mapping[str, int]) -> dict[str, tuple[str, ...]]:
    """One assignment of mesh axes per factor, taken from the results' shardings (Shardy
    chose them from the rule; the first result to split a factor decides), then made
    consistent: each axis on one factor at most, and minor factors of every compound
    dimension split only where the major ones are fully split."""
    axes: dict[str, tuple[str, ...]] = {}
    for dims, spec in zip(rule.outputs, result_specs, strict=True):
        entries = list(spec) + [None] * (len(dims) - len(spec))
        for dim, entry in zip(dims, entries, strict=False):
            for factor, share in _split_dim(rule, dim, _entry_axes(entry), mesh).items():
                if share and factor not in axes:
                    axes[factor] = share
    used: set[str] = set()
    for factor, share in list(axes.items()):
        clash = next((i for i, a in enumerate(share) if a in used), len(share))
        axes[factor] = share[:clash]
        used.update(axes[factor])
    return _contiguous(rule, axes, mesh)


def _contiguous(rule: BoundRule, axes: dict[str, tuple[str, ...]], mesh: Mapping[str, int]
                ) -> dict[str, tuple[str, ...]]:
    """``axes`` less the minor factors' axes wherever a major factor of a compound
    dimension is not fully split (repeated: dropping axes can leave another major factor
    partly split)."""
    compounds = {dim for dims in rule.inputs + rule.outputs for dim in dims if len(dim) > 1}
    changed = True
    while changed:
        changed = False
        for dim in compounds:
            for i, factor in enumerate(dim[:-1]):
                if rule.size(factor) // math.prod(mesh[a] for a in axes.get(factor, ())) > 1:
                    for minor in dim[i + 1:]:
                        changed |= bool(axes.pop(minor, ()))
                    break
    return axes


def term_spec(dims: tuple[Dim, ...], shape: tuple[int, ...],
              axes: Mapping[str, tuple[str, ...]]) -> PartitionSpec:
    """The PartitionSpec a term's array has under ``axes`` (a broadcast dimension of length
    1 stays whole)."""
    entries: list[Any] = []
    for dim, size in zip(dims, shape, strict=True):
        split = () if size == 1 else tuple(a for f in dim for a in axes.get(f, ()))
        entries.append(None if not split else split[0] if len(split) == 1 else split)
    return PartitionSpec(*entries)


def partition_shardings(rule: BoundRule, mesh: Any, arg_shapes: Sequence[Any],
                        results: Sequence[Any]) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]]:
    """``(mesh, result shardings, operand shardings)`` for ``custom_partitioning``'s
    partition callback: the shardings one factor assignment implies, so that operands and
    results all correspond (an input updated in place has its result's term, hence its
    sharding)."""
    from jax.sharding import NamedSharding

    chosen = [getattr(r.sharding, "spec", None) for r in results]
    mesh = next((r.sharding.mesh for r, s in zip(results, chosen, strict=True)
                 if s is not None), mesh)
    axes = factor_axes(rule, [s if s is not None else () for s in chosen], dict(mesh.shape))

    def named(dims: tuple[Dim, ...], value: Any) -> Any:
        return NamedSharding(mesh, term_spec(dims, tuple(value.shape), axes))

    return (mesh, tuple(named(d, r) for d, r in zip(rule.outputs, results, strict=True)),
            tuple(named(d, a) for d, a in zip(rule.inputs, arg_shapes, strict=True)))
