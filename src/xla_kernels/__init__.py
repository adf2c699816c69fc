"""xla-kernels: hand-written CPU/CUDA kernels as first-class, opaque XLA custom-calls.

Declare an op once with :class:`Op`; call it from JAX (``jax.jit``, ``jax.vmap``),
PyTorch (``torch.ops``, eager CPU/CUDA, ``torch.compile``), torchax and torch_xla.

Example:
    >>> import xla_kernels as xk
    >>> sorted(xk.PLATFORMS)
    ['cpu', 'cuda']
"""

from xla_kernels import hlo
from xla_kernels._version import __version__ as __version__
from xla_kernels.attrs import REQUIRED, Attr
from xla_kernels.diagnostics import explain, explained_errors
from xla_kernels.errors import (
    BuildError,
    CompilerNotFoundError,
    GradientError,
    OpDeclarationError,
    OpInputError,
    OpTypeError,
    PlatformError,
    RegistrationError,
    XlaKernelsError,
)
from xla_kernels.export import (
    ExportedOp,
    ExportedProgram,
    ExportFormatError,
    custom_call_targets,
    deserialize,
    export,
    read_manifest,
    serialize,
)
from xla_kernels.hlo import assert_single_custom_call, hlo_text
from xla_kernels.op import (
    PLATFORMS,
    BoundCall,
    CallPlan,
    Invalid,
    Kernel,
    Op,
    Spec,
    Tensor,
    Vjp,
    declared_ops,
    like,
    updated,
)
from xla_kernels.record import OpRecord, record_of
from xla_kernels.runtime.registry import ensure_registered, registrations

__all__ = [
    "PLATFORMS",
    "REQUIRED",
    "Attr",
    "BoundCall",
    "BuildError",
    "CallPlan",
    "CompilerNotFoundError",
    "ExportFormatError",
    "ExportedOp",
    "ExportedProgram",
    "GradientError",
    "Invalid",
    "Kernel",
    "Op",
    "OpDeclarationError",
    "OpInputError",
    "OpRecord",
    "OpTypeError",
    "PlatformError",
    "RegistrationError",
    "Spec",
    "Tensor",
    "Vjp",
    "XlaKernelsError",
    "assert_single_custom_call",
    "custom_call_targets",
    "declared_ops",
    "deserialize",
    "ensure_registered",
    "explain",
    "explained_errors",
    "export",
    "hlo",
    "hlo_text",
    "like",
    "read_manifest",
    "record_of",
    "registrations",
    "serialize",
    "updated",
]
