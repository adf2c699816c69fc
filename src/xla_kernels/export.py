"""Exporting programs that use xla-kernels ops, and loading them in another process.

``jax.export`` refuses custom calls it does not know (each target needs
``jax.export.DisabledSafetyCheck.custom_call(target)``), and a process that loads the
serialized program must have every op's handler registered before it runs it. This
module does both: :func:`export` lowers once, finds the xla-kernels targets in the
program and allows exactly those; :func:`serialize` writes the ``jax.export`` payload
after a small manifest naming each op, the module that declares it and the platforms;
:func:`deserialize` imports those modules, registers the handlers, and returns a
program whose ``.call`` runs.

``xla_kernels.export`` is the function once the package is imported; import this
module's other names with ``from xla_kernels.export import ...``.

Example:
    >>> import jax.numpy as jnp
    >>> import xla_kernels as xk
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> def f(a, b):
    ...     return simple_add(a, b) * 2
    >>> exp = xk.export(f, jnp.ones(3), jnp.ones(3))                   # doctest: +SKIP
    >>> [(o.target, o.module) for o in exp.ops]                        # doctest: +SKIP
    [('xla_kernels.simple_add', 'xla_kernels.kernels.simple_add')]
    >>> data = xk.serialize(exp)                                       # doctest: +SKIP
    >>> xk.deserialize(data).call(jnp.ones(3), jnp.ones(3))            # doctest: +SKIP
    Array([4., 4., 4.], dtype=float32)
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
from jax import export as jax_export

from xla_kernels._version import __version__
from xla_kernels.diagnostics import explained_errors
from xla_kernels.errors import OpDeclarationError, RegistrationError, XlaKernelsError
from xla_kernels.op import PLATFORMS, declared_ops
from xla_kernels.runtime.registry import ensure_registered

MAGIC = b"xla-kernels-export\n"
FORMAT_VERSION = 1
_HEADER_LEN = struct.Struct(">I")
# `stablehlo.custom_call @target(` (the name quoted when it has unusual characters) and
# the generic form `custom_call_target = "target"`.
_TARGETS = re.compile(r'stablehlo\.custom_call\s+@(?:"(?P<quoted>[^"]+)"|(?P<bare>[\w.$\-]+))'
                      r'|custom_call_target\s*=\s*"(?P<attr>[^"]+)"')


class ExportFormatError(XlaKernelsError, ValueError):
    """The bytes given to :func:`deserialize` are not an xla-kernels export."""


@dataclasses.dataclass(frozen=True)
class ExportedOp:
    """One xla-kernels op an exported program calls: what a loader must import and register.

    Example:
        >>> ExportedOp("xla_kernels.simple_add", "xla_kernels.kernels.simple_add", ("cpu",))
        ExportedOp(target='xla_kernels.simple_add', module='xla_kernels.kernels.simple_add', platforms=('cpu',))
    """  # noqa: E501

    target: str
    module: str | None
    platforms: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ExportedProgram:
    """A ``jax.export.Exported`` plus the xla-kernels ops it needs.

    Attributes of the ``jax.export.Exported`` (``platforms``, ``in_avals``,
    ``mlir_module()``, ...) are available on this object directly.

    Example:
        >>> exp.call(jnp.ones(3), jnp.ones(3))                         # doctest: +SKIP
        Array([4., 4., 4.], dtype=float32)
    """

    exported: jax_export.Exported
    ops: tuple[ExportedOp, ...]

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program; an unregistered target raises an explained RegistrationError."""
        with explained_errors():
            return self.exported.call(*args, **kwargs)

    def serialize(self, *, vjp_order: int = 0) -> bytes:
        """The same as :func:`serialize` of this program."""
        return serialize(self, vjp_order=vjp_order)

    @property
    def targets(self) -> tuple[str, ...]:
        """The custom-call targets of the ops, in order."""
        return tuple(o.target for o in self.ops)

    def __getattr__(self, name: str) -> Any:
        if name == "exported":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.exported, name)


def custom_call_targets(module_text: str) -> list[str]:
    """The distinct custom-call targets in StableHLO (or MHLO) text, in order of appearance.

    Example:
        >>> custom_call_targets('%0 = stablehlo.custom_call @my.op(%a) : ...\\n'
        ...                     '%1 = stablehlo.custom_call @"ns:weird"(%0) : ...')
        ['my.op', 'ns:weird']
    """
    found: dict[str, None] = {}
    for m in _TARGETS.finditer(module_text):
        found[m.group("quoted") or m.group("bare") or m.group("attr")] = None
    return list(found)


def export(fn: Callable[..., Any], *args: Any, platforms: Sequence[str] | None = None,
           disabled_checks: Iterable[jax_export.DisabledSafetyCheck] = (),
           **kwargs: Any) -> ExportedProgram:
    """``jax.export`` of ``jax.jit(fn)(*args, **kwargs)`` with every xla-kernels op allowed.

    Args:
        fn: the function to export; a ``jax.jit``-wrapped function is used as it is.
        *args, **kwargs: example arguments (arrays or ``jax.ShapeDtypeStruct``).
        platforms: the platforms to lower for, e.g. ``("cpu", "cuda")``; default: the
            default backend. Lowering builds each op's kernel for each platform.
        disabled_checks: further ``jax.export.DisabledSafetyCheck``\\ s, for targets that
            are not xla-kernels ops.

    The program is lowered once; the custom-call checks it keeps disabled are exactly
    those of the xla-kernels ops found in it.

    Example:
        >>> x = jnp.ones(3)                                            # doctest: +SKIP
        >>> exp = xk.export(simple_add, x, x, platforms=["cpu"])       # doctest: +SKIP
        >>> exp.targets, exp.platforms                                 # doctest: +SKIP
        (('xla_kernels.simple_add',), ('cpu',))
    """
    jitted = fn if hasattr(fn, "trace") and hasattr(fn, "lower") else jax.jit(fn)
    extra = tuple(disabled_checks)
    allowed = [jax_export.DisabledSafetyCheck.custom_call(t) for t in declared_ops()]
    exported = jax_export.export(jitted, platforms=platforms,
                                 disabled_checks=[*extra, *allowed])(*args, **kwargs)
    ops = _ops_in(exported)
    keep = [jax_export.DisabledSafetyCheck.custom_call(o.target) for o in ops]
    # Lowered once with every declared op allowed; record only the ones the program uses.
    exported = dataclasses.replace(exported, disabled_safety_checks=(*extra, *keep))
    return ExportedProgram(exported, ops)


def _ops_in(exported: jax_export.Exported) -> tuple[ExportedOp, ...]:
    ops = declared_ops()
    platforms = tuple(exported.platforms)
    return tuple(ExportedOp(t, ops[t].module, tuple(p for p in platforms if p in ops[t].kernels))
                 for t in custom_call_targets(exported.mlir_module()) if t in ops)


def serialize(exported: ExportedProgram | jax_export.Exported, *, vjp_order: int = 0) -> bytes:
    """Bytes holding a manifest of the ops and the ``jax.export`` payload.

    A plain ``jax.export.Exported`` is accepted too; its ops are found the same way as
    in :func:`export`. Raises :class:`OpDeclarationError` for an op declared where a
    loading process cannot import it (a script run as ``__main__``).

    Example:
        >>> data = xk.serialize(exp)                                   # doctest: +SKIP
        >>> from xla_kernels.export import MAGIC
        >>> data.startswith(MAGIC)                                     # doctest: +SKIP
        True
    """
    if not isinstance(exported, ExportedProgram):
        exported = ExportedProgram(exported, _ops_in(exported))
    for op in exported.ops:
        if op.module in (None, "__main__"):
            raise OpDeclarationError(
                op.target, f"it is declared in {op.module or 'an unknown module'}, which a "
                "process loading the exported program cannot import",
                "move the op's declaration into an importable module (a .py file on "
                "sys.path or in your package) and import it from there before exporting")
    header = json.dumps({"format": FORMAT_VERSION, "xla_kernels": _version(),
                         "ops": [dataclasses.asdict(o) for o in exported.ops]},
                        sort_keys=True).encode()
    payload = bytes(exported.exported.serialize(vjp_order=vjp_order))
    return MAGIC + _HEADER_LEN.pack(len(header)) + header + payload


def read_manifest(data: bytes | bytearray) -> tuple[tuple[ExportedOp, ...], bytes]:
    """The ops recorded in serialized bytes, and the ``jax.export`` payload; imports nothing.

    Example:
        >>> ops, payload = read_manifest(xk.serialize(exp))            # doctest: +SKIP
        >>> ops[0].module                                              # doctest: +SKIP
        'xla_kernels.kernels.simple_add'
    """
    data = bytes(data)
    if not data.startswith(MAGIC):
        raise ExportFormatError(
            "deserialize: argument 'data': not an xla-kernels export (it does not start "
            f"with {MAGIC!r}). Fix: pass bytes from xla_kernels.serialize; bytes from "
            "Exported.serialize() load with jax.export.deserialize after "
            "xla_kernels.ensure_registered(op, platform) for each op they use.")
    start = len(MAGIC) + _HEADER_LEN.size
    try:
        (length,) = _HEADER_LEN.unpack_from(data, len(MAGIC))
        header = json.loads(data[start:start + length])
        if header["format"] != FORMAT_VERSION:
            raise ExportFormatError(
                f"deserialize: argument 'data': export format {header['format']} is not "
                f"supported (this xla-kernels reads format {FORMAT_VERSION}). Fix: load it "
                f"with the xla-kernels version that wrote it ({header.get('xla_kernels')}).")
        ops = tuple(ExportedOp(o["target"], o["module"], tuple(o["platforms"]))
                    for o in header["ops"])
    except (struct.error, ValueError, KeyError, TypeError) as e:
        if isinstance(e, ExportFormatError):
            raise
        raise ExportFormatError(
            f"deserialize: argument 'data': the xla-kernels manifest is damaged ({e}). "
            "Fix: serialize the program again; write and read the file in binary mode.") from e
    return ops, data[start + length:]


def deserialize(data: bytes | bytearray, *,
                platforms: Sequence[str] | None = None) -> ExportedProgram:
    """Load bytes from :func:`serialize`: import each op's module and register its handler.

    Args:
        data: the bytes.
        platforms: the platforms to register handlers for. Default: those of the
            program's platforms that JAX has devices for in this process.

    Raises :class:`RegistrationError` naming the op and the module when the module
    cannot be imported or does not declare the op; build errors propagate as
    :class:`BuildError` / :class:`CompilerNotFoundError`.

    Example:
        >>> with open("prog.xk", "rb") as f:                           # doctest: +SKIP
        ...     prog = xk.deserialize(f.read())
        >>> prog.call(jnp.ones(3), jnp.ones(3))                        # doctest: +SKIP
        Array([4., 4., 4.], dtype=float32)
    """
    ops, payload = read_manifest(data)
    for recorded in ops:
        op = _declare(recorded)
        for platform in _platforms_to_register(recorded, platforms):
            ensure_registered(op, platform)
    return ExportedProgram(jax_export.deserialize(bytearray(payload)), ops)


def _declare(recorded: ExportedOp) -> Any:
    target, module = recorded.target, recorded.module
    op = declared_ops().get(target)
    if op is not None:
        return op
    try:
        importlib.import_module(module or "")
    except Exception as e:
        raise RegistrationError(
            f"{target}: the exported program calls this op, which module '{module}' "
            f"declares, and importing '{module}' failed ({type(e).__name__}: {e}). Fix: "
            f"install the package that provides '{module}' or put its folder on sys.path "
            f"(PYTHONPATH), or import the module that declares '{target}' yourself, before "
            "xla_kernels.deserialize") from e
    op = declared_ops().get(target)
    if op is None:
        raise RegistrationError(
            f"{target}: module '{module}' was imported but declares no op '{target}' "
            "(the declaration moved or was renamed since the export). Fix: import the "
            f"module that declares '{target}' before xla_kernels.deserialize, or export "
            "the program again")
    return op


def _platforms_to_register(recorded: ExportedOp, requested: Sequence[str] | None) -> list[str]:
    if requested is not None:
        unknown = sorted(set(requested) - set(PLATFORMS))
        if unknown:
            raise RegistrationError(
                f"{recorded.target}: argument 'platforms': unknown platforms {unknown}. "
                f"Fix: pass some of {', '.join(PLATFORMS)}")
        return [p for p in requested if p in recorded.platforms]
    return [p for p in recorded.platforms if _jax_has(p)]


def _jax_has(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


def _version() -> str:
    return __version__
