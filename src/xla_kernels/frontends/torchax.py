"""The torchax frontend: the torch operator of an op lowers to the op's XLA custom-call.

torchax runs PyTorch programs on JAX: each torch operator is replaced by a JAX function.
:func:`register_torchax` registers, for ``torch_op(op)`` (or an operator you defined
yourself, e.g. with ``torch.library.custom_op``), a JAX function that calls the op's JAX
frontend, so on torchax tensors the op becomes the same typed-FFI ``custom-call`` that
JAX emits: eagerly, under ``torchax.interop.jax_jit`` and under ``jax.jit`` of a
``jax_view``-ed function.

**Inputs updated in place** (``xk.Tensor(..., in_place=True)``, e.g. the caches of
``reshape_and_cache``): a torchax tensor holds an immutable JAX array, so the lowering calls
the op (whose custom call aliases the operand, as in JAX) and rebinds each updated torch
tensor to the result, the way torchax's own ``copy_`` does; a torchax view writes through
to its base. The torch call returns nothing for them, as on CPU/CUDA tensors. Under
``jax.jit(jax_view(f), donate_argnums=...)`` (or ``interop.jax_jit`` with those
``kwargs_for_jax_jit``) with the updated tensors donated and returned by ``f``, the
compiled program aliases them: no copy. Without donation XLA copies the buffer first, and
the caller's old array stays valid.

Example:
    >>> import torch
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> register_torchax(simple_add)
    >>> torchax = import_torchax()
    >>> with torchax.default_env():                                   # doctest: +SKIP
    ...     a = torch.tensor([1.0, 2.0, 3.0], device="jax")
    ...     torch.ops.xla_kernels.simple_add(a, a)
    Tensor(<class 'jaxlib._jax.ArrayImpl'> [2. 4. 6.])
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from xla_kernels.errors import RegistrationError
from xla_kernels.frontends.torch.operator import define
from xla_kernels.frontends.torch.schema import attrs_from_torch, qualified_name
from xla_kernels.op import Op

__all__ = ["import_torchax", "in_place_impl", "jax_impl", "register_torchax"]

# Named-tensor overloads ("prod.dim_Dimname", "std.names_dim", ...) that torchax 0.0.13
# names at import time and that newer torch releases no longer have.
_NAMED_TENSOR_OVERLOAD = re.compile(r"dimname|names", re.IGNORECASE)


class _MissingOverload:
    """Stands for an operator overload this torch does not have (never called)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<overload {self.name} missing in torch {torch.__version__}>"


#: The overloads torchax named that this torch lacks (filled by :func:`import_torchax`).
tolerated_missing_overloads: list[str] = []


@contextlib.contextmanager
def _tolerate_missing_named_tensor_overloads() -> Iterator[None]:
    """While torchax imports, a missing named-tensor overload is a placeholder, not an
    ``AttributeError`` (torchax 0.0.13 lists overloads that torch 2.13 removed)."""
    packet_type = torch._ops.OpOverloadPacket
    original = packet_type.__getattr__
    missing = tolerated_missing_overloads

    def getattr_or_placeholder(self: Any, key: str) -> Any:
        try:
            return original(self, key)
        except AttributeError:
            if key.startswith("__") or not _NAMED_TENSOR_OVERLOAD.search(key):
                raise
            missing.append(f"{self._qualified_op_name}.{key}")
            return _MissingOverload(f"{self._qualified_op_name}.{key}")

    packet_type.__getattr__ = getattr_or_placeholder
    try:
        yield
    finally:
        packet_type.__getattr__ = original


_import_lock = threading.Lock()


def import_torchax() -> ModuleType:
    """Import torchax (and the op tables it loads lazily), working around overloads that
    this torch no longer has; returns the module.

    Example:
        >>> import_torchax().__name__
        'torchax'
    """
    module = sys.modules.get("torchax")
    if module is not None and "torchax.decompositions" in sys.modules:
        _default_rng_device(module)
        return module
    with _import_lock, _tolerate_missing_named_tensor_overloads():
        try:
            import torchax
            import torchax.decompositions
            import torchax.interop
            import torchax.ops.jaten
            import torchax.ops.jtorch
        except ImportError as e:
            raise RegistrationError(
                f"torchax is not importable: {e}. Fix: pip install torchax "
                "(or xla-kernels[torchax]).") from e
    _default_rng_device(torchax)
    return torchax


def _default_rng_device(torchax: ModuleType) -> None:
    """Let torch call ``set_rng_state(state)`` on torchax's device module.

    torchax makes "jax" torch's accelerator; torch's ``freeze_rng_state`` (used by
    ``torch.library.opcheck``) then calls ``set_rng_state(state)`` without a device,
    which torchax 0.0.13's no-op ``set_rng_state(new_state, device)`` rejects.
    """
    module = getattr(torchax, "device_module", None)
    original = getattr(module, "set_rng_state", None)
    if original is None or getattr(original, "_xla_kernels_wrapped", False):
        return
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        return
    device = signature.parameters.get("device")
    if device is None or device.default is not inspect.Parameter.empty:
        return

    def set_rng_state(new_state: Any, device: Any = "jax") -> Any:
        return original(new_state, device)

    set_rng_state._xla_kernels_wrapped = True  # type: ignore[attr-defined]
    module.set_rng_state = set_rng_state


def jax_impl(op: Op) -> Callable[..., Any]:
    """The JAX function torchax runs for ``op``'s torch operator.

    It takes JAX arrays and the torch call's keyword attributes (``None`` meaning "not
    passed", ``bytes`` attributes as bytes or lists of ints) and calls the current
    declaration of ``op``'s target (see :mod:`xla_kernels.record`).

    Example:
        >>> import jax.numpy as jnp
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> jax_impl(simple_add)(jnp.ones(2), jnp.ones(2))           # doctest: +SKIP
        Array([2., 2.], dtype=float32)
    """
    record = op.record

    def impl(*arrays: Any, **attrs: Any) -> Any:
        current = record.op
        return current(*arrays, **attrs_from_torch(current, attrs))

    return _named(impl, op)


def in_place_impl(op: Op) -> Callable[..., Any]:
    """The torchax implementation of an op that updates inputs in place (see the module
    doc): it takes torchax tensors or views and the environment, calls the op on their JAX
    arrays, writes each updated input back with ``copy_`` (a rebinding, or a write through
    a view) and returns the op's other outputs as torchax tensors (``None`` if none).

    Example:
        >>> from xla_kernels.kernels.kv_cache import reshape_and_cache
        >>> in_place_impl(reshape_and_cache).__name__
        'reshape_and_cache_torchax'
    """
    record = op.record

    def impl(*tensors: Any, env: Any, **attrs: Any) -> Any:
        current = record.op
        attrs = attrs_from_torch(current, attrs)
        arrays = env.t2j_iso(env.v2t_iso(tensors))
        visible = current.bind(arrays, attrs).visible_outputs
        out = current(*arrays, **attrs)
        results = (out,) if len(visible) == 1 else tuple(out or ())
        position = {spec.name: i for i, spec in enumerate(current.inputs)}
        returned = []
        for spec, value in zip(visible, results, strict=True):
            if spec.updates:
                tensors[position[spec.updates]].copy_(env.j2t_iso(value))
            else:
                returned.append(env.j2t_iso(value))
        if not returned:
            return None
        return returned[0] if len(returned) == 1 else tuple(returned)

    return _named(impl, op)


def _named(impl: Callable[..., Any], op: Op) -> Callable[..., Any]:
    impl.__name__ = impl.__qualname__ = f"{qualified_name(op).partition('::')[2]}_torchax"
    impl.__doc__ = op.doc
    return impl


_lock = threading.Lock()


def _overload(target: Any) -> Any:
    """The ``OpOverload`` torchax looks up, from an overload, a packet or a custom op."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.default
    inner = getattr(target, "_opoverload", None)  # torch.library.custom_op's CustomOpDef
    if isinstance(inner, torch._ops.OpOverload):
        return inner
    raise RegistrationError(
        f"register_torchax: {target!r} is not a torch operator. Fix: pass an OpOverload "
        "(torch.ops.ns.name.default), its packet, or a torch.library.custom_op function.")


def register_torchax(op: Op, *, torch_target: Any = None, env: Any = None) -> None:
    """Lower ``torch_target`` (default: the op's own torch operator) to ``op`` on torchax
    tensors.

    Idempotent. The lowering goes into torchax's global op table (used by every
    ``torchax.tensor.Environment`` created afterwards) and into the environments that
    already exist: torchax's default one and ``env`` if given.

    Args:
        op: the declared op whose custom-call the operator becomes.
        torch_target: an existing torch operator with the same tensor arguments and
            attributes, e.g. one made with ``torch.library.custom_op``; by default every
            operator ``torch_op(op, namespace=...)`` defined, or ``torch_op(op)`` if none.
        env: a ``torchax.tensor.Environment`` to register in as well.

    Example:
        >>> from xla_kernels.kernels.simple_add import simple_add
        >>> register_torchax(simple_add)
        >>> register_torchax(simple_add)   # a second call changes nothing
    """
    torchax = import_torchax()
    from torchax.ops import ops_registry

    record = op.record
    if torch_target is not None:
        targets = [torch_target]
    else:  # every operator torch_op made for the op, in whichever namespace
        targets = [o.packet for o in list(record.torch_operators.values())] or [
            define(op).packet]
    for target in targets:
        _register(torchax, ops_registry, op, _overload(target), env)


def _register(torchax: ModuleType, ops_registry: Any, op: Op, overload: Any, env: Any) -> None:
    """Lower ``overload`` to ``op`` in torchax's op table and in its live environments."""
    record = op.record
    with _lock:
        if overload not in record.torchax_overloads:
            if any(t.in_place for t in op.inputs):
                # Views arrive as views (is_view_op), so an update writes through them.
                ops_registry.register_torch_dispatch_op(
                    overload, in_place_impl(op), is_jax_function=False, is_user_defined=True,
                    needs_env=True, is_view_op=True)
            else:
                ops_registry.register_torch_dispatch_op(
                    overload, jax_impl(op), is_jax_function=True, is_user_defined=True)
            record.torchax_overloads.add(overload)
        operator = ops_registry.all_aten_ops[overload]
        envs = [e for e in (getattr(torchax, "_env", None), env) if e is not None]
        for e in envs:
            if e._ops.get(overload) is not operator:
                e._ops[overload] = operator
