"""Exceptions raised by xla-kernels.

Every error names the op (when there is one), the argument, and how to fix it.
All of them derive from :class:`XlaKernelsError`, so one ``except`` catches the lot;
input errors also derive from the built-in ``TypeError``/``ValueError`` that callers
of array functions already expect.

Example:
    >>> try:
    ...     raise OpInputError("my_op", "x", "expected dtype f32, got i32", "cast x first")
    ... except ValueError as e:
    ...     print(e)
    my_op: argument 'x': expected dtype f32, got i32. Fix: cast x first.
"""

from __future__ import annotations


class XlaKernelsError(Exception):
    """Base class of every error raised by xla-kernels."""


def _compose(op: str | None, arg: str | None, problem: str, fix: str | None) -> str:
    head = f"{op}: " if op else ""
    where = f"argument '{arg}': " if arg else ""
    tail = f". Fix: {fix}" if fix else ""
    return f"{head}{where}{problem}{tail}{'.' if fix and not fix.endswith('.') else ''}"


class OpDeclarationError(XlaKernelsError, ValueError):
    """The op itself is declared wrongly (bad name, duplicate argument, unknown type)."""

    def __init__(self, op: str | None, problem: str, fix: str | None = None):
        self.op = op
        super().__init__(_compose(op, None, problem, fix))


class OpInputError(XlaKernelsError, ValueError):
    """A call passed an input or attribute the op does not accept."""

    def __init__(self, op: str, arg: str | None, problem: str, fix: str | None = None):
        self.op, self.arg, self.problem, self.fix = op, arg, problem, fix
        super().__init__(_compose(op, arg, problem, fix))


class OpTypeError(OpInputError, TypeError):
    """An input has the wrong dtype or an attribute the wrong Python type."""


class CompilerNotFoundError(XlaKernelsError, RuntimeError):
    """No C++ or CUDA compiler could be found to build an op's sources."""


class BuildError(XlaKernelsError, RuntimeError):
    """Compiling an op's sources failed; ``compiler_output`` holds the messages."""

    def __init__(self, message: str, compiler_output: str = "", command: list[str] | None = None):
        self.compiler_output = compiler_output
        self.command = command or []
        super().__init__(message)


class PlatformError(XlaKernelsError, RuntimeError):
    """The op has no kernel for the platform it was asked to run on."""


class RegistrationError(XlaKernelsError, RuntimeError):
    """A handler could not be registered with a runtime, or is missing there."""


class GradientError(XlaKernelsError, TypeError, RuntimeError):
    """A gradient the op's declaration does not provide was requested: through an output
    its :class:`~xla_kernels.op.Vjp` declares non-differentiable, or of second order
    through a backward op without a vjp of its own. A ``TypeError`` as JAX raises for what
    it cannot differentiate, and a ``RuntimeError`` as torch autograd does."""
