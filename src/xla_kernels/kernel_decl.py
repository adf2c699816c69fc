"""Declaring the kernel of an op on one platform: its sources, handler symbols by XLA FFI
stage, custom FFI types and build options (:class:`Kernel`).

Example:
    >>> Kernel(["add.cc"], handler="Add").stages
    {'execute': 'Add'}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xla_kernels import dtypes as _dtypes
from xla_kernels.errors import OpDeclarationError

STAGES = ("instantiate", "prepare", "initialize", "execute")
"""The XLA FFI execution stages a kernel may name a handler for (``XLA_FFI_ExecutionStage``)."""


@dataclasses.dataclass(frozen=True)
class Kernel:
    """The sources and handler symbol implementing an op on one platform.

    Relative source paths are resolved against the folder of the file that declares
    the op. ``handler`` is the ``XLA_FFI_DEFINE_HANDLER_SYMBOL`` name of the execute
    handler, or a dict with one handler per XLA FFI stage (``"instantiate"``,
    ``"prepare"``, ``"initialize"``, ``"execute"``; execute is required). ``types``
    names the custom FFI types (the state an instantiate handler returns) to register
    before the handlers: ``{"my_lib.MyState": "MyStateTypeId"}`` names a function
    declared with ``XLA_FFI_DECLARE_TYPE_ID_SYMBOL`` returning ``&MyState::id``; the form
    ``{"type_id": "MyStateTypeId", "type_info": "MyStateTypeInfo"}`` adds the
    ``XLA_FFI_DECLARE_TYPE_INFO_SYMBOL`` function whose deleter frees states. See
    docs/stages.md. For kernels written for XLA's old custom-call API, use :meth:`legacy`.
    ``arch_specific=True`` (CUDA) builds every target arch that has an architecture-specific
    variant as that variant, e.g. ``90`` as ``sm_90a`` (for wgmma; guard such code with
    ``__CUDA_ARCH_FEAT_SM90_ALL``); other archs are built as usual.

    Example:
        >>> Kernel(["add.cu"], handler="Add").handler
        'Add'
        >>> Kernel(["attn.cu"], handler="Attn", arch_specific=True).arch_specific
        True
        >>> k = Kernel(["k.cc"], handler={"instantiate": "MyInit", "execute": "MyRun"},
        ...            types={"my_lib.MyState": {"type_id": "MyStateId",
        ...                                      "type_info": "MyStateInfo"}})
        >>> k.handler, k.stages["instantiate"], k.stateful
        ('MyRun', 'MyInit', True)
    """

    sources: tuple[str, ...]
    handler: str | Mapping[str, str]
    include_dirs: tuple[str, ...] = ()
    defines: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flags: tuple[str, ...] = ()
    legacy_function: str | None = None
    base_dir: Path | None = None
    dtypes: tuple[str, ...] | None = None
    stages: Mapping[str, str] = dataclasses.field(default_factory=dict)
    types: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    arch_specific: bool = False

    def __post_init__(self) -> None:
        self._normalize_stages()
        if isinstance(self.sources, (str, Path)):
            object.__setattr__(self, "sources", (str(self.sources),))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        object.__setattr__(self, "include_dirs", tuple(str(s) for s in self.include_dirs))
        object.__setattr__(self, "flags", tuple(self.flags))
        if self.dtypes is not None:
            object.__setattr__(self, "dtypes", tuple(_dtypes.canonical(d) for d in self.dtypes))
        if not self.sources:
            raise OpDeclarationError(None, f"kernel '{self.handler}' has no sources")
        if not self.handler.isidentifier():
            raise OpDeclarationError(None, f"handler {self.handler!r} is not a C identifier")

    @property
    def stateful(self) -> bool:
        """Whether the kernel names a handler for a stage other than execute, or custom FFI
        types: the eager runtime then keeps a state per call attributes for it."""
        return bool(self.types) or any(stage != "execute" for stage in self.stages)

    def _normalize_stages(self) -> None:
        """``handler`` (a str or a stage dict) and ``stages`` into ``handler`` = the execute
        symbol and ``stages`` = every stage's symbol; ``types`` into ``{name: {"type_id":
        symbol, "type_info": symbol or None}}``. Raises OpDeclarationError on bad input."""
        example = 'handler={"instantiate": "MyInstantiate", "execute": "MyExecute"}'
        handler = self.handler
        stages = dict(handler) if isinstance(handler, Mapping) else dict(self.stages)
        if not isinstance(handler, Mapping):
            if not isinstance(handler, str):
                raise OpDeclarationError(None, f"handler must be a symbol name or a dict of "
                                         f"them by stage, got {type(handler).__name__}", example)
            stages.setdefault("execute", handler)
        unknown = sorted(str(k) for k in stages if k not in STAGES)
        if unknown:
            raise OpDeclarationError(None, f"Kernel handler: unknown stage {unknown[0]!r}",
                                     f"name handlers for stages {', '.join(STAGES)}")
        if "execute" not in stages:
            raise OpDeclarationError(None, f"Kernel handler {handler!r} has no execute stage",
                                     example)
        for stage, symbol in stages.items():
            if not isinstance(symbol, str) or not symbol.isidentifier():
                raise OpDeclarationError(None, f"the {stage} handler {symbol!r} is not a C "
                                         "identifier", "pass the symbol name as a str")
        if not isinstance(handler, Mapping) and stages["execute"] != handler:
            raise OpDeclarationError(None, f"handler {handler!r} differs from the execute "
                                     f"stage's {stages['execute']!r}", example)
        types = {}
        for name, symbols in dict(self.types).items():
            if isinstance(symbols, str):
                symbols = {"type_id": symbols}
            if (not isinstance(name, str) or not name or not isinstance(symbols, Mapping)
                    or not set(symbols) <= {"type_id", "type_info"} or "type_id" not in symbols
                    or not all(isinstance(v, str) and v.isidentifier()
                               for v in symbols.values() if v is not None)):
                raise OpDeclarationError(
                    None, f"Kernel types: bad entry {name!r}: {symbols!r}",
                    'write types={"my_lib.MyState": "MyStateTypeId"} or {"my_lib.MyState": '
                    '{"type_id": "MyStateTypeId", "type_info": "MyStateTypeInfo"}}')
            types[name] = {"type_id": symbols["type_id"], "type_info": symbols.get("type_info")}
        object.__setattr__(self, "handler", stages["execute"])
        object.__setattr__(self, "stages", {s: stages[s] for s in STAGES if s in stages})
        object.__setattr__(self, "types", types)

    @classmethod
    def legacy(cls, sources: Sequence[str] | str, function: str, *,
               signature: str = "buffers", **kwargs: Any) -> Kernel:
        """A kernel with the old signature, run unchanged through a typed-FFI adapter.

        ``signature="buffers"`` (default):
        ``void fn(cudaStream_t stream, void** buffers, const char* opaque, size_t len)``
        (on the CPU the stream is a ``void*`` and is null). ``buffers`` holds the inputs,
        then the outputs; ``opaque`` is the op's ``opaque`` bytes attribute.
        ``signature="cpu_classic"`` (CPU only): ``void fn(void* out, const void** in)`` or
        ``void fn(void* out, const void** in, XlaCustomCallStatus* status)``; with several
        outputs ``out`` is a ``void**`` table of them. See docs/legacy_and_dtypes.md.

        Example:
            >>> Kernel.legacy(["add.cu"], function="XlaGpuSimpleAdd").handler
            'XlaKernelsLegacy_XlaGpuSimpleAdd'
            >>> Kernel.legacy("add.cc", "Add", signature="cpu_classic").defines["XK_LEGACY_ADAPTER"]
            'XLA_KERNELS_LEGACY_CPU_CLASSIC_HANDLER'
        """
        adapters = {"buffers": None, "cpu_classic": "XLA_KERNELS_LEGACY_CPU_CLASSIC_HANDLER"}
        if signature not in adapters:
            raise OpDeclarationError(None, f"Kernel.legacy({function!r}): unknown signature "
                                     f"{signature!r}", f"use one of {', '.join(adapters)}")
        if adapters[signature]:  # picked by include/xla_kernels/legacy_adapter.cc
            kwargs["defines"] = {**kwargs.get("defines", {}),
                                 "XK_LEGACY_ADAPTER": adapters[signature]}
        return cls(sources=sources, handler=f"XlaKernelsLegacy_{function}",
                   legacy_function=function, **kwargs)

    def resolved_sources(self) -> list[Path]:
        """Absolute paths of the sources."""
        return [self._resolve(s) for s in self.sources]

    def resolved_include_dirs(self) -> list[Path]:
        """Absolute paths of the extra include directories."""
        return [self._resolve(s) for s in self.include_dirs]

    def _resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() or self.base_dir is None else (self.base_dir / p).resolve()
