"""One validated call of an op (:class:`CallPlan`): its inputs, coerced attributes and
outputs, and the attribute encodings every frontend reads from it.

Example:
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> simple_add.bind([Spec((3,), "f32")] * 2, {}).outputs
    (Spec(shape=(3,), dtype='f32', workspace=False),)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from xla_kernels.attr_types import AttrType, EagerAttr, attr_type_of_value
from xla_kernels.attrs import mlir_dict
from xla_kernels.runtime.library import kernel_of
from xla_kernels.spec import Spec

if TYPE_CHECKING:
    from xla_kernels.op import Op
    from xla_kernels.runtime.library import LoadedKernel


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
