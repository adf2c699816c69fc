"""What a handler's failure to decode its call frame means in the words of the declaration.

XLA's typed FFI (``xla/ffi/api/api.h``) checks a call frame before the handler's body
runs, in this order: the number of arguments, of results, of attributes (each an exact
count unless the binding has ``RemainingArgs``/``Optional``/a dictionary), then decodes
every bound operand (buffer dtype and rank, attribute name and type), all of them, and
reports the bad ones together::

    [execute] Wrong number of arguments: expected 2 but got 1
    [execute] Failed to decode all FFI handler operands (bad operands at: 0, 2)
    Diagnostics:
    Wrong buffer dtype: expected F32 but got F16Wrong scalar data type: expected F32 but got S64

:func:`explain_binding` turns such a message into one naming the op, the item (argument
``i 'name'``, result ``i``, attribute ``'name'``), what the declaration passes and what the
handler binds. JAX's calls get it from the handler guard (:mod:`xla_kernels.runtime.guard`),
the torch frontends and :func:`xla_kernels.explain` from :mod:`xla_kernels.diagnostics`.
A bad operand's index counts the handler's bindings in its order; like the attribute
explanation below, the argument/result/attribute split assumes the handler binds
arguments, then results, then attributes, as the declaration passes them.

Example:
    >>> explain_binding("something else", None) is None
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xla_kernels.attr_types import (
    FFI_ARRAY,
    FFI_DICTIONARY,
    FFI_SCALAR,
    FFI_STRING,
    EagerAttr,
)
from xla_kernels.runtime.eager import AttrMismatchError

if TYPE_CHECKING:
    from xla_kernels.op import Op

DECODE_FAILURE = re.compile(r"Failed to decode all FFI handler operands \(bad operands at: "
                     r"(?P<at>[\d, ]+)\)")
WRONG_ATTR = re.compile(r"Wrong (?P<what>scalar data type|array data type|attribute type): "
                    r"expected (?P<want>\w+) but got (?P<got>\w+?)(?=Wrong |\s|$)")
# (the FFI joins its diagnostics without a separator: "...got S64Wrong scalar...")
# XLA_FFI_DataType name -> (Python declaration, C++ type) of the scalar.
FFI_TYPES = {"PRED": ("bool", "bool"), "S8": ("np.int8", "int8_t"),
              "S16": ("np.int16", "int16_t"), "S32": ("np.int32", "int32_t"),
              "S64": ("int", "int64_t"), "U8": ("np.uint8", "uint8_t"),
              "U16": ("np.uint16", "uint16_t"), "U32": ("np.uint32", "uint32_t"),
              "U64": ("np.uint64", "uint64_t"), "F32": ("float", "float"),
              "F64": ("np.float64", "double"), "C64": ("np.complex64", "std::complex<float>"),
              "C128": ("np.complex128", "std::complex<double>")}
FFI_CODES = {1: "PRED", 2: "S8", 3: "S16", 4: "S32", 5: "S64", 6: "U8", 7: "U16", 8: "U32",
          9: "U64", 11: "F32", 12: "F64", 15: "C64", 18: "C128"}
ATTR_KINDS = {FFI_ARRAY: "array", FFI_DICTIONARY: "dictionary", FFI_SCALAR: "scalar",
          FFI_STRING: "string"}
KIND_TYPES = {"scalar": ("a scalar type (int, float, bool, np.int32, ...)",
                          "a scalar (int64_t, float, ...)"),
               "array": ("list[...]", "ffi::Span<const T>"),
               "string": ("str", "std::string_view"),
               "dictionary": ("dict", "ffi::Dictionary")}


class Passed:
    """One attribute as the call passes it: kind and dtype name, and how it was declared."""

    def __init__(self, name: str, encoded: EagerAttr, declared: str, cpp: str):
        self.name, self.declared, self.cpp = name, declared, cpp
        self.kind = ATTR_KINDS.get(encoded.kind, str(encoded.kind))
        self.dtype = FFI_CODES.get(encoded.dtype)

    def presents(self, what: str, got: str) -> bool:
        """Whether XLA's "got" of a decoding diagnostic describes this attribute."""
        if what == "attribute type":
            return self.kind == got
        return self.kind == what.split()[0] and self.dtype == got


def expected_types(what: str, want: str) -> tuple[str, str]:
    """(Python declaration, C++ type) of what the handler's binding decodes."""
    if what == "attribute type":
        return KIND_TYPES.get(want, (want, want))
    py, cpp = FFI_TYPES.get(want, (want, want))
    if what == "array data type":
        return f"list[{py}]", f"ffi::Span<const {cpp}>"
    return py, cpp


def attr_mismatch(message: str, op_name: str, passed: Sequence[Passed],
              first_attr: int | None) -> tuple[AttrMismatchError, int] | None:
    """The attribute a decoding failure is about and how surely (2: every bad operand is
    the attribute at its binding position; 1: every one has an attribute of its type; 0:
    the first has), or None if ``passed`` does not explain it.

    ``passed`` is in the handler's likely binding order (the declaration's); ``first_attr``
    is the binding index of the first attribute (arguments + results): a bad operand ``N``
    is then the attribute at ``N - first_attr`` in that order.
    """
    found = DECODE_FAILURE.search(message)
    wrongs = [w.group("what", "want", "got") for w in WRONG_ATTR.finditer(message)]
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
    want_py, want_cpp = expected_types(what, want)
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
    said = " ".join(w.group(0) for w in WRONG_ATTR.finditer(message))
    text = f"{problem}. Fix: {fix}. (XLA said: {head} {said})"
    return AttrMismatchError(op_name, pick.name, f"{pick.declared} ({pick.cpp})", want_cpp,
                             text, message), sure


def declared_passed(op: Op) -> list[Passed]:
    """The op's declared attributes in declaration order, as a call passes them."""
    out = []
    for a in op.attrs:
        codec = a.codec
        sample = codec.eager(codec.coerce(codec.probe(), op=op.name, name=a.name))
        out.append(Passed(a.name, sample, codec.python_name, codec.cpp_type))
    return out




# ------------------------------------------------------------------ every binding mismatch

_STAGE = re.compile(r"^\[\w+\]\s*")
_COUNT = re.compile(r"Wrong number of (?P<what>arguments|results|attributes): expected "
                    r"(?P<least>at least )?(?P<want>\d+) but got (?P<got>\d+)"
                    r"(?: with name\(s\): (?P<names>.*))?")
# One diagnostic of a decoding failure (they follow "Diagnostics:" with no separator).
_DIAGNOSTIC = re.compile(r"(?:Wrong [a-z ]+|Attribute name mismatch): .*?"
                         r"(?=Wrong [a-z ]+: |Attribute name mismatch: |$)", re.S)
_BUFFER = re.compile(r"Wrong buffer (?P<what>dtype|rank): expected (?P<want>\w+) but got "
                     r"(?P<got>\w+)")
_FIX = re.compile(r"Fix: (.*?)\. \(XLA said")
_NAME = re.compile(r"Attribute name mismatch: (?P<passed>.*) vs (?P<bound>.*)", re.S)
# XLA_FFI_DataType names as the FFI prints them -> xla-kernels dtype names.
_DTYPE_NAMES = {"PRED": "bool", "S8": "i8", "S16": "i16", "S32": "i32", "S64": "i64",
                "U8": "u8", "U16": "u16", "U32": "u32", "U64": "u64", "F16": "f16",
                "F32": "f32", "F64": "f64", "BF16": "bf16", "C64": "c64", "C128": "c128",
                "F8E4M3FN": "f8e4m3fn"}


def result_count(op: Op) -> int:
    """How many results the declaration passes: its ``output_names``, else one."""
    return len(op.output_names) if op.output_names is not None else 1


def _buffer_item(op: Op, index: int, nargs: int) -> str:
    """Argument ``i 'name'`` or result ``j`` for the bound operand at ``index``."""
    if index < nargs:
        return f"argument {index} '{op.inputs[index].name}'"
    j = index - nargs
    names = op.output_names or ()
    return f"result {j}" + (f" '{names[j]}'" if j < len(names) else "")


def _count_problem(op: Op, match: re.Match[str]) -> tuple[str, str]:
    """(problem, fix) of a count mismatch."""
    what, want, got = match.group("what"), int(match.group("want")), int(match.group("got"))
    least = "at least " if match.group("least") else ""
    if what == "arguments":
        names = ", ".join(f"'{t.name}'" for t in op.inputs) or "none"
        side = f"the declaration passes {got} input buffer(s) ({names})"
        fix = (f"declare {least}{want} inputs in xk.Op(inputs=[...]), or bind {got} with "
               ".Arg<...>() in the handler")
    elif what == "results":
        names = op.output_names
        listed = f" ({', '.join(repr(n) for n in names)})" if names else ""
        side = f"the declaration passes {got} result buffer(s){listed}"
        fix = (f"make the shape rule return {least}{want} outputs, or bind {got} with "
               ".Ret<...>() in the handler")
    else:
        declared = ", ".join(f"'{a.name}' ({a.codec.python_name}, C++ {a.codec.cpp_type})"
                             for a in op.attrs) or "none"
        side = f"the declaration passes {got} attribute(s): {declared}"
        fix = (f"declare the {want} attribute(s) the handler binds with xk.Attr(name, type), "
               "or bind each declared one with .Attr<T>(\"name\") in the handler")
    problem = f"the number of {what}: {side}, but the handler binds {least}{want}"
    return problem, fix


def _operand_problem(op: Op, index: int, diagnostic: str, nargs: int,
                     passed: Sequence[Passed], first_attr: int) -> tuple[str, str] | None:
    """(problem, fix) of one bad operand, or None if the diagnostic is not understood."""
    buffer = _BUFFER.match(diagnostic)
    if buffer is not None:
        item = _buffer_item(op, index, nargs)
        want, got = buffer.group("want"), buffer.group("got")
        if buffer.group("what") == "rank":
            return (f"{item}: the call passes a rank-{got} buffer, but the handler binds "
                    f"rank {want}", "bind ffi::Buffer<T> (any rank) or the declared rank")
        got_name, want_name = _DTYPE_NAMES.get(got, got), _DTYPE_NAMES.get(want, want)
        if index < nargs:
            declared = f" (declared dtypes: {', '.join(op.inputs[index].dtypes)})"
            other = f"declare '{op.inputs[index].name}' as {want_name}"
        else:
            declared, other = "", f"make the shape rule give it {want_name}"
        return (f"{item}: the declaration passes {got_name}{declared}, but the handler binds "
                f"ffi::Buffer<ffi::{want}> ({want_name})",
                f"bind ffi::Buffer<ffi::{got}> or ffi::AnyBuffer for {item} in the handler, "
                f"or {other}")
    name = _NAME.match(diagnostic)
    if name is not None:
        got, want = name.group("passed").strip(), name.group("bound").strip()
        return (f"attribute '{got}': the declaration passes an attribute named '{got}' where "
                f"the handler binds one named '{want}' (the typed FFI matches attributes by "
                "name, in sorted order)",
                f"use one name on both sides: xk.Attr('{want}', ...) in the declaration or "
                f".Attr<T>(\"{got}\") in the handler")
    single = (f"Failed to decode all FFI handler operands (bad operands at: {index})\n"
              f"Diagnostics:\n{diagnostic}")
    found = attr_mismatch(single, op.name, passed, first_attr)
    if found is None:
        return None
    error = found[0]
    fix = _FIX.search(str(error))
    return (f"attribute '{error.attr}': the declaration passes {error.declared}, but the "
            f"handler binds {error.expected}",
            fix.group(1) if fix else f"declare xk.Attr('{error.attr}', ...) with the "
            "handler's type, or bind the declared type in the handler")


def explain_binding(message: str, op: Op | None, platform: str | None = None,
                    handler: str | None = None) -> str | None:
    """The message of a handler's decoding failure ``message`` naming ``op``, the item, the
    declaration's side and the handler's, or None if it is not one (or ``op`` is None).

    Example:
        >>> import xla_kernels as xk
        >>> op = xk.Op("docs.bind", inputs=[xk.Tensor("x", ("f32",))], outputs=xk.like,
        ...            kernels={"cpu": xk.Kernel(["a.cc"], "A")})
        >>> text = explain_binding("[execute] Wrong number of arguments: expected 2 but got 1",
        ...                        op, "cpu", "A")
        >>> text.startswith("docs.bind: its cpu handler A does not bind what the declaration "
        ...                 "passes: the number of arguments: the declaration passes 1 input "
        ...                 "buffer(s) ('x'), but the handler binds 2. Fix: ")
        True
    """
    if op is None:
        return None
    text = _STAGE.sub("", message.strip())
    problems: list[tuple[str, str]] = []
    count = _COUNT.search(text)
    decode = DECODE_FAILURE.search(text)
    if count is not None:
        problems.append(_count_problem(op, count))
    elif decode is not None:
        indices = [int(i) for i in decode.group("at").replace(" ", "").split(",") if i]
        details = text.split("Diagnostics:", 1)[1] if "Diagnostics:" in text else ""
        diagnostics = [d.strip() for d in _DIAGNOSTIC.findall(details.strip())]
        nargs = len(op.inputs)
        nrets = result_count(op)
        try:
            passed = declared_passed(op)
        except Exception:  # a codec whose probe does not coerce: attributes unexplained
            passed = []
        for index, diagnostic in zip(indices, diagnostics, strict=False):
            found = _operand_problem(op, index, diagnostic, nargs, passed, nargs + nrets)
            if found is not None:
                problems.append(found)
    if not problems:
        return None
    who = " ".join(w for w in ("its", platform, "handler", handler) if w)
    what = "; ".join(p for p, _ in problems)
    fixes = "; ".join(dict.fromkeys(f for _, f in problems))
    return (f"{op.name}: {who} does not bind what the declaration passes: {what}. Fix: "
            f"{fixes}. XLA's typed FFI said: {' '.join(message.split())}")
