"""One record per declared target: everything the process made from its declarations.

Every :class:`~xla_kernels.op.Op` is filed under its target name in an :class:`OpRecord`,
which owns what frontends derive from it: the kernels loaded per platform, the JAX
primitive and handler registrations, the torch operator, the torchax and torch_xla
registrations, and per-call caches. Frontends keep no per-op state of their own; they read
and write the record, and always run ``record.op``, the current declaration.

The rule for a second declaration of the same target (a re-executed module, a notebook
cell, two libraries picking one name) is made here, once, for every frontend:

* it **replaces** the first declaration everywhere, unless
* something made from the first cannot be replaced in a running process: a kernel already
  loaded for a platform (XLA cannot unregister a handler) whose declaration differs, or a
  torch operator already defined with another schema (torch cannot redefine one). Then the
  new declaration raises :class:`~xla_kernels.errors.OpDeclarationError` naming what is in
  the way and the fix, whichever frontends were used and in whichever order.

Example:
    >>> import xla_kernels as xk
    >>> op = xk.Op("docs.record_demo", inputs=[xk.Tensor("x", ("f32",))],
    ...            outputs=lambda x: xk.like(x), kernels={"cpu": xk.Kernel(["a.cc"], "A")})
    >>> record_of(op).op is op
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xla_kernels.errors import OpDeclarationError

if TYPE_CHECKING:
    from xla_kernels.op import Op
    from xla_kernels.runtime.library import LoadedKernel

Guard = Callable[["Op"], "str | None"]
"""Says why a new declaration cannot replace the current one (None: it can)."""


class OpRecord:
    """What the process made from the declarations of one target.

    Attributes:
        target: the ``custom_call_target``.
        op: the current declaration.
        kernels: handlers loaded into this process, by platform (the runtime fills it:
            :func:`xla_kernels.runtime.library.kernel_of`; the record never loads).
        jax_primitive: the JAX primitive of the current declaration (JAX frontend).
        jax_differentiable: its ``jax.custom_vjp`` wrapper, for ops that declare a vjp.
        jax_partitioned: its ``custom_partitioning`` wrapper, for ops with a sharding rule.
        jax_registrations: handlers registered with JAX, by platform.
        torch_operators: the torch operators defined for it (schema, packet), by qualname.
        torch_eager: (qualname, platform) pairs whose eager torch kernel is installed.
        torchax_overloads: torch overloads lowered to this op under torchax.
        torch_xla_platforms: platforms whose handler is registered with torch_xla.
        torch_xla_dispatch: whether the torch operator's ``XLA`` key emits the call.
        plans: validated call shapes cached by frontends; emptied on redeclaration.
    """

    def __init__(self, op: Op):
        self.target = op.target
        self.op = op
        self.kernels: dict[str, LoadedKernel] = {}
        self.jax_primitive: Any = None
        self.jax_differentiable: Any = None
        self.jax_partitioned: Any = None
        self.jax_registrations: dict[str, Any] = {}
        self.torch_operators: dict[str, Any] = {}
        self.torch_eager: set[tuple[str, str]] = set()
        self.torchax_overloads: set[Any] = set()
        self.torch_xla_platforms: set[str] = set()
        self.torch_xla_dispatch = False
        self.plans: dict[Any, Any] = {}
        self.lock = threading.RLock()
        self._guards: list[Guard] = []
        self._on_replace: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        made = [f"kernels={sorted(self.kernels)}"] if self.kernels else []
        made += sorted(self.torch_operators)
        return f"OpRecord({self.target}{', ' if made else ''}{', '.join(made)})"

    def guard(self, guard: Guard) -> None:
        """Add a reason a later declaration may have to be refused (see the module doc)."""
        with self.lock:
            self._guards.append(guard)

    def on_replace(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a redeclaration replaces the op (to drop caches)."""
        with self.lock:
            self._on_replace.append(callback)

    def _kernels_guard(self, new: Op) -> str | None:
        for platform in sorted(self.kernels):
            if new.kernels.get(platform) != self.op.kernels.get(platform):
                return (f"its {platform} kernel ({self.kernels[platform].handler} from "
                        f"{self.kernels[platform].library.name}) is already loaded, and XLA "
                        "cannot replace a loaded handler")
        return None

    def redeclare(self, new: Op) -> None:
        """Make ``new`` the current declaration, or raise if something is in the way."""
        with self.lock:
            for guard in (self._kernels_guard, *self._guards):
                reason = guard(new)
                if reason:
                    where = f" in {self.op.module}" if self.op.module else ""
                    raise OpDeclarationError(
                        new.name, f"already declared{where}, and {reason}",
                        "give this op another name, or reuse the first declaration "
                        f"(import it{' from ' + self.op.module if self.op.module else ''}); "
                        "a new process takes the new declaration")
            self.op = new
            self.jax_primitive = None
            self.jax_differentiable = None
            self.jax_partitioned = None
            self.plans.clear()
            for callback in self._on_replace:
                callback()


_records: dict[str, OpRecord] = {}
_lock = threading.Lock()


def declare(op: Op) -> OpRecord:
    """File ``op`` under its target (called by ``Op.__init__``); see the module doc."""
    with _lock:
        record = _records.get(op.target)
        if record is None:
            record = _records[op.target] = OpRecord(op)
            return record
    record.redeclare(op)
    return record


def record_of(op: Op | str) -> OpRecord:
    """The record of an op (or of a target name).

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> record_of("xla_kernels.simple_add").target
        'xla_kernels.simple_add'
    """
    name = op if isinstance(op, str) else op.target
    with _lock:
        record = _records.get(name)
    if record is None:
        raise OpDeclarationError(name, "no op with this target is declared in this process",
                                 "import the module that declares it")
    return record


def records() -> dict[str, OpRecord]:
    """Every record, by target, sorted.

    Example:
        >>> "xla_kernels.simple_add" in records()
        True
    """
    with _lock:
        return dict(sorted(_records.items()))
