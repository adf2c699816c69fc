"""Turning XLA's "no handler registered" runtime errors into messages that say how to fix them.

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
from collections.abc import Iterator

from xla_kernels.errors import RegistrationError
from xla_kernels.op import declared_ops

_UNREGISTERED = re.compile(
    r"(?:No FFI handler registered for|No registered implementation for (?:FFI )?custom "
    r"call to)\s+(?P<target>[\w.:\-]+)\s+(?:on a platform|for platform)\s+(?P<platform>\w+)")
_PLATFORMS = {"host": "cpu", "cpu": "cpu", "cuda": "cuda", "gpu": "cuda", "rocm": "rocm"}


def explain(error: BaseException) -> RegistrationError | None:
    """A :class:`RegistrationError` explaining ``error``, or None if it is another error."""
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
def explained_errors() -> Iterator[None]:
    """Re-raise XLA's unregistered-target errors inside the block as explained ones.

    Example:
        >>> with explained_errors():
        ...     pass
    """
    try:
        yield
    except Exception as e:
        explained = explain(e)
        if explained is None:
            raise
        raise explained from e
