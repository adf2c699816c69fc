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

from xla_kernels.attr_types import (
    FFI_ARRAY,
    FFI_DICTIONARY,
    FFI_SCALAR,
    FFI_STRING,
    EagerAttr,
)
from xla_kernels.errors import RegistrationError
from xla_kernels.op import declared_ops
from xla_kernels.runtime.eager import AttrMismatchError, KernelError

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

_DECODE = re.compile(r"Failed to decode all FFI handler operands \(bad operands at: "
                     r"(?P<at>[\d, ]+)\)")
_WRONG = re.compile(r"Wrong (?P<what>scalar data type|array data type|attribute type): "
                    r"expected (?P<want>\w+) but got (?P<got>\w+?)(?=Wrong |\s|$)")
# (the FFI joins its diagnostics without a separator: "...got S64Wrong scalar...")
# XLA_FFI_DataType name -> (Python declaration, C++ type) of the scalar.
_FFI_TYPES = {"PRED": ("bool", "bool"), "S8": ("np.int8", "int8_t"),
              "S16": ("np.int16", "int16_t"), "S32": ("np.int32", "int32_t"),
              "S64": ("int", "int64_t"), "U8": ("np.uint8", "uint8_t"),
              "U16": ("np.uint16", "uint16_t"), "U32": ("np.uint32", "uint32_t"),
              "U64": ("np.uint64", "uint64_t"), "F32": ("float", "float"),
              "F64": ("np.float64", "double"), "C64": ("np.complex64", "std::complex<float>"),
              "C128": ("np.complex128", "std::complex<double>")}
_CODES = {1: "PRED", 2: "S8", 3: "S16", 4: "S32", 5: "S64", 6: "U8", 7: "U16", 8: "U32",
          9: "U64", 11: "F32", 12: "F64", 15: "C64", 18: "C128"}
_KINDS = {FFI_ARRAY: "array", FFI_DICTIONARY: "dictionary", FFI_SCALAR: "scalar",
          FFI_STRING: "string"}
_KIND_TYPES = {"scalar": ("a scalar type (int, float, bool, np.int32, ...)",
                          "a scalar (int64_t, float, ...)"),
               "array": ("list[...]", "ffi::Span<const T>"),
               "string": ("str", "std::string_view"),
               "dictionary": ("dict", "ffi::Dictionary")}


class _Passed:
    """One attribute as the call passes it: kind and dtype name, and how it was declared."""

    def __init__(self, name: str, encoded: EagerAttr, declared: str, cpp: str):
        self.name, self.declared, self.cpp = name, declared, cpp
        self.kind = _KINDS.get(encoded.kind, str(encoded.kind))
        self.dtype = _CODES.get(encoded.dtype)

    def presents(self, what: str, got: str) -> bool:
        """Whether XLA's "got" of a decoding diagnostic describes this attribute."""
        if what == "attribute type":
            return self.kind == got
        return self.kind == what.split()[0] and self.dtype == got


def _expected(what: str, want: str) -> tuple[str, str]:
    """(Python declaration, C++ type) of what the handler's binding decodes."""
    if what == "attribute type":
        return _KIND_TYPES.get(want, (want, want))
    py, cpp = _FFI_TYPES.get(want, (want, want))
    if what == "array data type":
        return f"list[{py}]", f"ffi::Span<const {cpp}>"
    return py, cpp


def _mismatch(message: str, op_name: str, passed: Sequence[_Passed],
              first_attr: int | None) -> tuple[AttrMismatchError, int] | None:
    """The attribute a decoding failure is about and how surely (2: every bad operand is
    the attribute at its binding position; 1: every one has an attribute of its type; 0:
    the first has), or None if ``passed`` does not explain it.

    ``passed`` is in the handler's likely binding order (the declaration's); ``first_attr``
    is the binding index of the first attribute (arguments + results): a bad operand ``N``
    is then the attribute at ``N - first_attr`` in that order.
    """
    found = _DECODE.search(message)
    wrongs = [w.group("what", "want", "got") for w in _WRONG.finditer(message)]
    if found is None or not wrongs:
        return None
    indices = [int(i) for i in found.group("at").replace(" ", "").split(",") if i]
    matches = [[p for p in passed if p.presents(what, got)] for what, _, got in wrongs]
    if not matches[0]:
        return None
    sure = 1 if all(matches) else 0
    pick = matches[0][0]
    if first_attr is not None and len(indices) == len(wrongs):
        at = [i - first_attr for i in indices]
        if all(0 <= p < len(passed) and passed[p] in m for p, m in zip(at, matches,
                                                                        strict=True)):
            sure, pick = 2, passed[at[0]]
    what, want, _ = wrongs[0]
    want_py, want_cpp = _expected(what, want)
    others = [m.name for m in matches[0] if m is not pick] if sure < 2 else []
    maybe = f" (or one of {', '.join(repr(n) for n in others)}, of the same type)" if others \
        else ""
    more = f"; {len(wrongs) - 1} more attribute(s) mismatch too" if len(wrongs) > 1 else ""
    problem = (f"{op_name}: argument '{pick.name}'{maybe}: declared {pick.declared} (C++ "
               f"{pick.cpp}), but the kernel's handler binds {want_cpp}, so XLA's typed FFI "
               f"cannot decode it{more}")
    fix = (f"declare xk.Attr('{pick.name}', {want_py}) to match the handler, or bind "
           f".Attr<{pick.cpp}>(\"{pick.name}\") in the handler")
    head = found.group(0)
    said = " ".join(w.group(0) for w in _WRONG.finditer(message))
    text = f"{problem}. Fix: {fix}. (XLA said: {head} {said})"
    return AttrMismatchError(op_name, pick.name, f"{pick.declared} ({pick.cpp})", want_cpp,
                             text, message), sure


def _declared_passed(op: Op) -> list[_Passed]:
    """The op's declared attributes in declaration order, as a call passes them."""
    out = []
    for a in op.attrs:
        codec = a.codec
        sample = codec.eager(codec.coerce(codec.probe(), op=op.name, name=a.name))
        out.append(_Passed(a.name, sample, codec.python_name, codec.cpp_type))
    return out


def explain_decode(message: str, op: Op | None = None) -> AttrMismatchError | None:
    """An :class:`AttrMismatchError` for XLA's decoding failure ``message`` (from a JAX
    call), or None if it is not one or no op's attributes explain it.

    Without ``op`` it looks among the ops registered with JAX in this process whose
    declared attributes explain the failure (naming them all when several could).

    Example:
        >>> explain_decode("something else") is None
        True
    """
    if _DECODE.search(message) is None:
        return None
    candidates = [op] if op is not None else [
        o for o in declared_ops().values() if o.record.jax_registrations]
    found: list[tuple[AttrMismatchError, int]] = []
    for o in candidates:
        try:
            passed = _declared_passed(o)
        except Exception:  # a codec whose probe does not coerce: skip the op
            continue
        # Arguments, then results (one unless output_names says), then attributes.
        first = len(o.inputs) + (len(o.output_names) if o.output_names is not None else 1)
        result = _mismatch(message, o.name, passed, first)
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
    typed FFI could not decode an attribute as the op declares it, else ``error`` itself.

    The call's attributes and encodings (kept on the error by the eager runtime) locate
    the attribute; without them the declaration of ``op`` (default: the op named by the
    error) does.

    Example:
        >>> e = KernelError("my_op", "bad shape", 3)
        >>> explain_kernel_error(e) is e
        True
    """
    if isinstance(error, AttrMismatchError) or _DECODE.search(error.handler_message) is None:
        return error
    if error.call_attrs is not None and error.call_encoded is not None:
        mismatch = explain_eager_decode(error.handler_message, error.op, error.call_attrs,
                                        error.call_encoded, first_attr=error.first_attr)
    else:
        declared = op if op is not None else declared_ops().get(error.op)
        mismatch = None if declared is None else explain_decode(error.handler_message,
                                                                declared)
    return error if mismatch is None else mismatch


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
            kind = _KINDS.get(e.kind, "")
            declared, cpp = _expected(f"{kind} data type" if kind in ("scalar", "array")
                                      else "attribute type",
                                      _CODES.get(e.dtype, "") if kind in ("scalar", "array")
                                      else kind)
        passed.append(_Passed(name, e, declared, cpp))
    result = _mismatch(message, op_name, passed, first_attr)
    return None if result is None else result[0]
