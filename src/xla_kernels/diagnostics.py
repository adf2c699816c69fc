"""Turning XLA's runtime errors into messages that say how to fix them.

Two kinds are recognized. An attribute whose declared type differs from the handler's
binding makes XLA's typed FFI fail with ``Failed to decode all FFI handler operands (bad
operands at: N)``, where ``N`` counts the handler's bindings (arguments, results, then
attributes, in the order the handler binds them); :func:`explain` maps it back to the
declaration: an :class:`~xla_kernels.runtime.eager.AttrMismatchError` naming the op, the
attribute, its declared type and C++ type, and what the handler decodes. The eager runtime
raises a plain :class:`~xla_kernels.runtime.eager.KernelError` and explains nothing; the
torch frontends explain it (:func:`explain_kernel_error`); around JAX calls, or direct
calls of the eager runtime, use :func:`explained_errors`.

XLA reports a custom-call target nobody registered only when the program runs, as
``No FFI handler registered for T on a platform Host`` (or, on GPU, ``No registered
implementation for custom call to T for platform CUDA``). That happens with programs
serialized by ``jax.export`` and loaded in a new process, with hand-written
``jax.ffi.ffi_call``\\ s, and with torch_xla. :func:`explain` recognizes it; when the
target is an xla-kernels op it names the op and the fix. For a target no module has
declared yet, the fix has two steps: import the declaring module, then register the
handler (``xla_kernels.ensure_registered``, a call of the op, or
``xla-kernels doctor TARGET --import MODULE --register``); :func:`xla_kernels.deserialize`
does both for programs saved with :func:`xla_kernels.serialize`.

Example:
    >>> err = RuntimeError("NOT_FOUND: No FFI handler registered for my.op on a platform "
    ...                    "Host (canonical host)")
    >>> print(explain(err))  # doctest: +ELLIPSIS
    my.op: no handler is registered for platform cpu in this process...
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xla_kernels.attr_types import EagerAttr
from xla_kernels.errors import RegistrationError
from xla_kernels.op import declared_ops
from xla_kernels.runtime.bindings import (
    ATTR_KINDS,
    DECODE_FAILURE,
    FFI_CODES,
    Passed,
    attr_mismatch,
    declared_passed,
    expected_types,
    explain_binding,
    result_count,
)
from xla_kernels.runtime.eager import AttrMismatchError, BindingMismatchError, KernelError

if TYPE_CHECKING:
    from xla_kernels.op import Op

_UNREGISTERED = re.compile(
    r"(?:No FFI handler registered for|No registered implementation for (?:FFI )?custom "
    r"call to)\s+(?P<target>[\w.:\-]+)\s+(?:on a platform|for platform)\s+(?P<platform>\w+)")
_PLATFORMS = {"host": "cpu", "cpu": "cpu", "cuda": "cuda", "gpu": "cuda", "rocm": "rocm"}


def explain(error: BaseException, op: Op | None = None
            ) -> RegistrationError | AttrMismatchError | None:
    """An error explaining ``error`` (a :class:`RegistrationError` or an
    :class:`~xla_kernels.runtime.eager.AttrMismatchError`), or None if it is another error.

    ``op`` names the op that failed, when the caller knows it; otherwise an attribute
    mismatch is matched against the ops registered with JAX in this process.
    """
    if isinstance(error, KernelError) and not isinstance(error, AttrMismatchError):
        explained = explain_kernel_error(error, op)
        return None if explained is error else explained
    mismatch = explain_decode(str(error), op)
    if mismatch is not None:
        return mismatch
    match = _UNREGISTERED.search(str(error))
    if not match:
        return None
    target = match.group("target")
    platform = _PLATFORMS.get(match.group("platform").lower(), match.group("platform"))
    op = declared_ops().get(target)
    if op is None:
        fix = (f"if '{target}' is an xla-kernels op, (1) import the module that declares it, "
               f"then (2) register its handler: call xla_kernels.ensure_registered(op, "
               f"'{platform}') with that op, or call the op once through xla-kernels, before "
               "running; a program saved with xla_kernels.serialize and loaded with "
               "xla_kernels.deserialize does both steps by itself. "
               f"`xla-kernels doctor {target} --import MODULE --register` checks both. "
               f"Otherwise register a handler with jax.ffi.register_ffi_target('{target}', "
               "..., platform=...) before running")
    elif platform not in op.kernels:
        fix = (f"the op has kernels for {', '.join(sorted(op.kernels))} only: run it there, "
               f"or declare kernels={{'{platform}': Kernel(...)}}")
    else:
        fix = (f"call xla_kernels.ensure_registered(op, '{platform}') once in this process "
               "before running a program that was compiled or deserialized elsewhere "
               "(calling the op through xla-kernels registers it by itself; "
               "xla_kernels.deserialize does it for programs saved with xla_kernels.serialize"
               f"). The op is declared in module {op.module}")
    return RegistrationError(f"{target}: no handler is registered for platform {platform} in "
                             f"this process (XLA said: {match.group(0)}). Fix: {fix}.")


@contextlib.contextmanager
def explained_errors(op: Op | None = None) -> Iterator[None]:
    """Re-raise XLA's unregistered-target and attribute-decoding errors inside the block
    as explained ones (``op``: the op the block runs, when known).

    Example:
        >>> with explained_errors():
        ...     pass
    """
    try:
        yield
    except Exception as e:
        if isinstance(e, AttrMismatchError):
            raise
        explained = explain(e, op)
        if explained is None:
            raise
        raise explained from e


# ------------------------------------------------------------------ attribute mismatches

def explain_decode(message: str, op: Op | None = None) -> AttrMismatchError | None:
    """An :class:`AttrMismatchError` for XLA's decoding failure ``message`` (from a JAX
    call), or None if it is not one or no op's attributes explain it.

    Without ``op`` it looks among the ops registered with JAX in this process whose
    declared attributes explain the failure (naming them all when several could).

    Example:
        >>> explain_decode("something else") is None
        True
    """
    if DECODE_FAILURE.search(message) is None:
        return None
    candidates = [op] if op is not None else [
        o for o in declared_ops().values() if o.record.jax_registrations]
    found: list[tuple[AttrMismatchError, int]] = []
    for o in candidates:
        try:
            passed = declared_passed(o)
        except Exception:  # a codec whose probe does not coerce: skip the op
            continue
        # Arguments, then results (one unless output_names says), then attributes.
        first = len(o.inputs) + result_count(o)
        result = attr_mismatch(message, o.name, passed, first)
        if result is not None:
            found.append(result)
    best = max((sure for _, sure in found), default=0)
    found_best = [e for e, sure in found if sure == best]
    if len(found_best) == 1:
        return found_best[0]
    if found_best:
        names = " or ".join(e.op for e in found_best)
        first_error = found_best[0]
        return AttrMismatchError(names, first_error.attr, first_error.declared,
                                 first_error.expected, f"one of {names} failed (pass the op "
                                 "to explained_errors(op) to name it): "
                                 + "; ".join(str(e) for e in found_best),
                                 first_error.xla_message)
    return None


def explain_kernel_error(error: KernelError, op: Op | None = None) -> KernelError:
    """The eager runtime's ``error`` explained: an :class:`AttrMismatchError` when XLA's
    typed FFI could not decode an attribute as the op declares it, a
    :class:`~xla_kernels.runtime.eager.BindingMismatchError` when the handler binds other
    counts, buffer dtypes or attribute names than the declaration passes, else ``error``.

    The call's attributes and encodings (kept on the error by the eager runtime) locate
    the attribute; without them the declaration of ``op`` (default: the op named by the
    error) does.

    Example:
        >>> e = KernelError("my_op", "bad shape", 3)
        >>> explain_kernel_error(e) is e
        True
    """
    if isinstance(error, (AttrMismatchError, BindingMismatchError)):
        return error
    declared = op if op is not None else declared_ops().get(error.op)
    if DECODE_FAILURE.search(error.handler_message) is None:
        return _binding_error(error, declared)
    if error.call_attrs is not None and error.call_encoded is not None:
        mismatch = explain_eager_decode(error.handler_message, error.op, error.call_attrs,
                                        error.call_encoded, first_attr=error.first_attr)
    else:
        mismatch = None if declared is None else explain_decode(error.handler_message,
                                                                declared)
    return _binding_error(error, declared) if mismatch is None else mismatch


def _binding_error(error: KernelError, op: Op | None) -> KernelError:
    """``error`` as a BindingMismatchError when it is one (JAX's words), else itself."""
    text = explain_binding(error.handler_message, op)
    if text is None or op is None:
        return error
    return BindingMismatchError(op.name, text, error.handler_message, error.code)


def explain_eager_decode(message: str, op_name: str, attrs: Mapping[str, Any],
                         encoded: Sequence[EagerAttr], *, first_attr: int | None
                         ) -> AttrMismatchError | None:
    """The eager runtime's decoding failure ``message`` mapped to the attribute it is about.

    ``attrs``/``encoded`` are the call's attributes and their encodings (same order);
    ``first_attr`` is the number of argument and result buffers.

    Example:
        >>> explain_eager_decode("other", "op", {}, [], first_attr=2) is None
        True
    """
    op = declared_ops().get(op_name)
    names = list(attrs)
    by_name = dict(zip(names, encoded, strict=True))
    order = ([a.name for a in op.attrs if a.name in by_name] if op is not None else []) + \
        sorted(n for n in names if op is None or n not in op.attr_types)
    passed = []
    for name in order:
        codec = op.attr_types.get(name) if op is not None else None
        e = by_name[name]
        if codec is not None:
            declared, cpp = codec.python_name, codec.cpp_type
        else:
            kind = ATTR_KINDS.get(e.kind, "")
            declared, cpp = expected_types(f"{kind} data type" if kind in ("scalar", "array")
                                      else "attribute type",
                                      FFI_CODES.get(e.dtype, "") if kind in ("scalar", "array")
                                      else kind)
        passed.append(Passed(name, e, declared, cpp))
    result = attr_mismatch(message, op_name, passed, first_attr)
    return None if result is None else result[0]
