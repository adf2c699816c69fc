"""HLO text of jitted functions, and assertions about the custom-calls in it.

Example:
    >>> import jax.numpy as jnp
    >>> from xla_kernels.kernels.simple_add import simple_add
    >>> text = hlo_text(simple_add, jnp.ones(3), jnp.ones(3))             # doctest: +SKIP
    >>> assert_single_custom_call(text, "xla_kernels.simple_add").api_version  # doctest: +SKIP
    'API_VERSION_TYPED_FFI'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

_CUSTOM_CALL = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
                          r"custom-call\((?P<operands>[^)]*)\)(?P<rest>.*)$", re.MULTILINE)
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
_API = re.compile(r"api_version=(?P<api>\w+)")
_CONFIG = re.compile(r"backend_config=(?P<config>\{.*\}|\"(?:[^\"\\]|\\.)*\")")
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%(?P<name>[\w.\-]+)\s*\(.*\{\s*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class CustomCall:
    """One custom-call instruction found in HLO text."""

    name: str
    target: str
    api_version: str
    result_shape: str
    operands: str
    backend_config: str
    line: str


def hlo_text(fn: Callable[..., Any], *args: Any, optimized: bool = True, **kwargs: Any) -> str:
    """HLO text of ``jax.jit(fn)`` for these arguments, after (default) or before XLA's passes.

    Example:
        >>> import jax.numpy as jnp
        >>> "add" in hlo_text(lambda x: x + 1, jnp.ones(2), optimized=False)
        True
    """
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = jitted.lower(*args, **kwargs)
    if optimized:
        return lowered.compile().as_text()
    return lowered.as_text(dialect="hlo")


def custom_calls(hlo: str) -> list[CustomCall]:
    """Every custom-call instruction in ``hlo``, in order of appearance.

    Example:
        >>> line = ('%r = f32[3]{0} custom-call(f32[3]{0} %a), custom_call_target="t", '
        ...         'api_version=API_VERSION_TYPED_FFI, backend_config={n = 1 : i64}')
        >>> custom_calls(line)[0].target
        't'
    """
    calls = []
    for m in _CUSTOM_CALL.finditer(hlo):
        rest = m.group("rest")
        target = _TARGET.search(rest)
        if not target:
            continue
        api = _API.search(rest)
        config = _CONFIG.search(rest)
        calls.append(CustomCall(
            name=m.group("name"), target=target.group("target"),
            api_version=api.group("api") if api else "API_VERSION_ORIGINAL",
            result_shape=m.group("shape").strip(), operands=m.group("operands"),
            backend_config=config.group("config") if config else "", line=m.group(0).strip()))
    return calls


def assert_single_custom_call(hlo: str, target: str,
                              api_version: str = "API_VERSION_TYPED_FFI") -> CustomCall:
    """Check that ``hlo`` calls ``target`` exactly once, with ``api_version``, outside fusions.

    Returns the custom-call; raises ``AssertionError`` with the evidence otherwise.

    Example:
        >>> line = ('%r = f32[3]{0} custom-call(f32[3]{0} %a), custom_call_target="t", '
        ...         'api_version=API_VERSION_TYPED_FFI')
        >>> assert_single_custom_call(line, "t").name
        'r'
    """
    found = [c for c in custom_calls(hlo) if c.target == target]
    if len(found) != 1:
        others = sorted({c.target for c in custom_calls(hlo)})
        raise AssertionError(f"expected exactly one custom-call to {target!r}, found "
                             f"{len(found)} (custom-call targets present: {others})\n{hlo}")
    call = found[0]
    if call.api_version != api_version:
        raise AssertionError(f"custom-call to {target!r} has {call.api_version}, expected "
                             f"{api_version}:\n{call.line}")
    if _inside_fusion(hlo, call.line):
        raise AssertionError(f"custom-call to {target!r} sits inside a fusion:\n{hlo}")
    return call


def _inside_fusion(hlo: str, line: str) -> bool:
    """Whether ``line`` belongs to a computation that a fusion instruction calls."""
    index = hlo.find(line)
    headers = [m for m in _COMPUTATION.finditer(hlo) if m.start() < index]
    if not headers or headers[-1].group("entry"):
        return False
    name = re.escape(headers[-1].group("name"))
    return re.search(rf"fusion\(.*calls=%{name}\b", hlo) is not None
