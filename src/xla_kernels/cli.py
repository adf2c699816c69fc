"""The ``xla-kernels`` command: ``doctor``, ``build``, ``demo`` and ``serve-bench``.

Expected failures (a build error, a missing compiler, a bad op path, a module that
cannot be imported) print one message and exit with status 1, without a traceback.

Example:
    $ xla-kernels doctor xla_kernels.simple_add
    $ xla-kernels doctor my_lib.scale --import my_lib.ops --register
    $ xla-kernels build xla_kernels.kernels.simple_add:simple_add --platform cuda
    $ xla-kernels build path/to/my_ops.py:scale
    $ xla-kernels build --aot my_pkg --cuda-archs 80,90,100
    $ xla-kernels serve-bench --preset tiny --platform cpu --frontend torchax --json out.json
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from xla_kernels import builder
from xla_kernels.errors import XlaKernelsError
from xla_kernels.op import Op, declared_ops
from xla_kernels.runtime.registry import ensure_registered, registrations

DESCRIPTION = ("xla-kernels: check the installation (doctor), build op kernels ahead of "
               "time (build), run the demo (demo), benchmark the serving loop (serve-bench).")


class CommandError(Exception):
    """An expected failure of a command: printed as one line, exit status 1."""


def _print_table(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """``title`` then one ``label  value`` line per row, the values in one column."""
    print(title)
    width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def _runtimes() -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        import jax

        platforms = sorted({d.platform for d in jax.devices()})
        found["jax"] = f"{jax.__version__}, default backend {jax.default_backend()}, " \
                       f"devices: {', '.join(platforms)}"
    except Exception as e:  # a broken install is exactly what doctor must report
        found["jax"] = f"not usable: {e}"
    found["torch"] = _describe("torch", _torch)
    found["torchax"] = _torchax()
    found["torch_xla"] = _describe("torch_xla", _torch_xla)
    found["vllm"] = _vllm()
    return found


def _vllm() -> str:
    """Doctor's vLLM row, without importing vLLM: its distribution and version, and whether
    vLLM will find xla-kernels' platform (its entry points, which only an installed
    xla-kernels has)."""
    from importlib.metadata import packages_distributions, version

    dists = packages_distributions().get("vllm")
    if not dists:
        return "not installed"
    from xla_kernels.vllm.platform import ENV, active, plugin_problem

    found = f"{dists[0]} {version(dists[0])}"
    problem = plugin_problem()
    if problem:
        return f"{found}; {problem}"
    selected = ("selected where JAX has no TPU" if active() else
                f"not selected (a TPU host, or {ENV}=0)")
    return f"{found}; xla-kernels' platform plugin installed, {selected}"


def _describe(name: str, describe: Callable[[Any], str]) -> str:
    try:
        return describe(importlib.import_module(name))
    except ImportError:
        return "not installed"
    except Exception as e:
        return f"not usable: {e}"


# Run in a fresh interpreter: this process may already hold torchax, imported through
# xla-kernels' workaround, and a failed import leaves half-imported modules behind.
_PLAIN_TORCHAX = """
import sys
try:
    import torchax
except ModuleNotFoundError as e:
    if e.name != "torchax":
        raise
    sys.exit(3)
print(torchax.__version__)
"""
_NOT_INSTALLED = 3


@functools.cache  # the installed packages do not change while doctor runs
def plain_torchax_import() -> tuple[bool, str]:
    """What a plain ``import torchax`` does in a new Python process of this interpreter:
    (True, version) or (False, the error's last line, or ``"not installed"``)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PLAIN_TORCHAX], capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False, "timed out after 300 s"
    if done.returncode == 0:
        return True, done.stdout.strip() or "installed"
    if done.returncode == _NOT_INSTALLED:
        return False, "not installed"
    lines = done.stderr.strip().splitlines()
    return False, lines[-1] if lines else f"exit status {done.returncode}"


def _torchax() -> str:
    """Doctor's torchax row: exactly what a plain ``import torchax`` does, and, when it
    fails, whether xla-kernels' own import (``import_torchax``) works around it."""
    ok, said = plain_torchax_import()
    if ok or said == "not installed":
        return said
    try:
        from xla_kernels.frontends.torchax import import_torchax

        version = _version(import_torchax())
    except Exception:
        return f"not usable: a plain `import torchax` fails ({said})"
    import torch

    return (f"{version}, but a plain `import torchax` fails with torch {torch.__version__} "
            f"({said}); only xla-kernels' import works (register_torchax, or "
            "xla_kernels.frontends.torchax.import_torchax()). Fix: install torch<2.13 "
            "(torchax <= 0.0.13 names the named-tensor overloads torch 2.13 removed), or "
            "import torchax through import_torchax() before any plain import")


def _version(module: object) -> str:
    return str(getattr(module, "__version__", "installed"))


def _torch(torch: object) -> str:
    cuda = torch.cuda.is_available()  # type: ignore[attr-defined]
    return f"{torch.__version__}, CUDA {'available' if cuda else 'not available'}"  # type: ignore[attr-defined]


def _torch_xla(torch_xla: object) -> str:
    import torch_xla.runtime as xr

    return f"{_version(torch_xla)}, PJRT device {xr.device_type()}"


def shipped_ops() -> dict[str, Op]:
    """Import every op that ships in ``xla_kernels.kernels`` and return all declared ops."""
    import xla_kernels.kernels as kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        importlib.import_module(f"xla_kernels.kernels.{info.name}")
    return declared_ops()


def import_user_module(spec: str, context: str | None = None) -> ModuleType:
    """Import a module by name (``my_pkg.ops``) or by the path of a ``.py`` file.

    A file is imported as a top-level module named after it, with its folder put on
    ``sys.path`` (so the ops it declares record an importable module). ``context``
    starts each error message (default: ``--import SPEC``).

    Example:
        >>> import_user_module("xla_kernels.kernels.simple_add").simple_add.name
        'xla_kernels.simple_add'
    """
    context = context or f"--import {spec}"
    name = spec
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise CommandError(f"{context}: no such file. Fix: pass the path of a .py "
                               "file that declares your ops, or a module name such as my_pkg.ops")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        name = path.stem
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise CommandError(f"{context}: cannot import module '{name}' ({e}). Fix: "
                           "install its package or add its folder to PYTHONPATH, or pass the "
                           "path of the .py file") from e
    except XlaKernelsError as e:
        raise CommandError(f"{context}: importing module '{name}' failed: {e}") from e
    except Exception as e:  # the user's module raised: say which and why, no traceback
        raise CommandError(f"{context}: importing module '{name}' raised "
                           f"{type(e).__name__}: {e}. Fix: run python -c 'import {name}' to "
                           "see the traceback") from e


def _cuda_archs(entry: dict[str, Any]) -> str:
    if entry.get("error"):
        return f"none: {entry['error']}"
    archs = ", ".join(f"sm_{a}" for a in entry.get("archs", ())) or "none"
    source = {"env": "from XLA_KERNELS_CUDA_ARCHS", "nvidia-smi": "from nvidia-smi",
              "fallback": "default list, no GPU detected"}.get(str(entry.get("source")),
                                                               f"from {entry.get('source')}")
    ptx = "; PTX embedded for newer GPUs" if entry.get("ptx") else ""
    return f"{archs} ({source}{ptx})"


def doctor(target: str | None, try_register: bool, imports: Sequence[str] = ()) -> int:
    """Print what is installed and registered; for ``target``, what is missing and the fix.

    ``imports`` are modules (or ``.py`` files) that declare the user's ops, imported first.
    """
    imported = [(spec, import_user_module(spec)) for spec in imports]
    _print_table("runtimes:", list(_runtimes().items()))
    report = builder.toolchain_report()
    rows = []
    for key in ("cxx", "nvcc"):
        entry = report[key]
        rows.append((key, f"{entry['path']} ({entry['version']})" if entry.get("found")
                     else f"missing: {entry.get('error')}"))
    rows += [("CUDA archs", _cuda_archs(report["cuda_archs"])), ("cache", report["cache_dir"])]
    from xla_kernels.builder import cutlass

    rows.append(("CUTLASS", cutlass.describe()))
    _print_table("compilers:", rows)
    if imported:
        _print_table("imported:", [(spec, module.__name__) for spec, module in imported])
    ops = shipped_ops()
    kernels = {name: ", ".join(sorted(op.kernels)) for name, op in ops.items()}
    width = max(map(len, kernels.values()), default=0)
    _print_table("declared ops (target: platforms with kernels, declaring module):",
                 [(name, f"{kernels[name]:<{width}}  {op.module}") for name, op in ops.items()])
    _print_table("libraries (where each comes from, and why):", library_rows(ops))
    if target is None:
        _print_registrations()
        return 0
    op = ops.get(target)
    if op is None:
        _print_table(f"target {target}:", [
            ("declared", "no: not an op xla-kernels knows in this process")])
        if imported:
            print(f"  imported {', '.join(m.__name__ for _, m in imported)}, which declare "
                  f"no op '{target}'")
        print(f"  fix: import the module that declares '{target}': run "
              f"xla-kernels doctor {target} --import MODULE (a module name or a .py file), "
              "and add --register to build and register it. A target registered outside "
              "xla-kernels needs jax.ffi.register_ffi_target in the process that runs the "
              "program")
        return 1
    rows = [("declared", f"yes, in module {op.module}, kernels for "
                         f"{', '.join(sorted(op.kernels))}")]
    status = 0
    if try_register:
        for platform in sorted(op.kernels):
            if platform == "cuda" and "gpu" not in _runtimes()["jax"]:
                rows.append((f"register {platform}", "skipped: JAX sees no GPU"))
                continue
            try:
                reg = ensure_registered(op, platform)
                rows.append((f"register {platform}", f"ok: {reg.handler} from {reg.library}"))
            except Exception as e:
                status = 1
                rows.append((f"register {platform}", f"FAILED: {e}"))
    _print_table(f"target {target}:", rows)
    if not try_register:
        print("  registration is per process and lazy: xla-kernels registers the handler the "
              "first time it lowers the op for a platform. A program compiled or exported "
              "elsewhere needs the declaring module imported and "
              "xla_kernels.ensure_registered(op, platform) (xla_kernels.deserialize does both). "
              "Pass --register to build and register it now.")
    _print_registrations()
    return status


def _resolution(spec: Any) -> str:
    try:
        found = spec.resolve()
    except XlaKernelsError as e:
        return f"unresolved: {e}"
    where = {"prebuilt": f"prebuilt {found.path}", "cache": f"cache {found.path}",
             "build": "built on first use (needs the compilers)"}[found.kind]
    return where if found.kind == "prebuilt" else f"{where}: {found.reason}"


def library_rows(ops: dict[str, Op]) -> list[tuple[str, str]]:
    """Per op and platform (and for the eager runtime and the torch dispatcher), the
    library a call would load, and why it is not a prebuilt one where it is not."""
    from xla_kernels.runtime import eager, guard
    from xla_kernels.runtime.library import kernel_spec

    rows = []
    for name, op in ops.items():
        for platform in sorted(op.kernels):
            try:
                rows.append((f"{name} [{platform}]", _resolution(kernel_spec(op, platform))))
            except XlaKernelsError as e:
                rows.append((f"{name} [{platform}]", f"unresolved: {e}"))
    rows.append(("eager runtime", _resolution(eager.runtime_spec())))
    rows.append(("JAX handler guard", _resolution(guard.guard_spec())))
    try:
        from xla_kernels.frontends.torch import native
    except ImportError:
        rows.append(("torch dispatcher", "torch is not installed"))
    else:
        rows.append(("torch dispatcher", _resolution(native.library_spec())))
    return _once(rows)


_NO_PREBUILT = re.compile(r"package (?P<package>\S+) ships no prebuilt libraries \([^)]*\)")


def _once(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``rows`` with a package's "ships no prebuilt libraries (...)" said once, first."""
    said: dict[str, str] = {}
    out = []
    for name, text in rows:
        match = _NO_PREBUILT.search(text)
        if match is not None:
            package = match.group("package")
            said.setdefault(package, match.group(0))
            text = text.replace(match.group(0), f"no prebuilt {package} library")
        out.append((name, text))
    return [("prebuilt libraries", reason) for reason in said.values()] + out


def _print_registrations() -> None:
    regs = registrations()
    _print_table("registered in this process:" + ("" if regs else " nothing yet"),
                 [(f"{r.target} [{r.platform}]", f"{r.handler} ({r.runtime}) from {r.library}")
                  for r in regs])


def load_op(spec: str) -> Op:
    """The op named by ``module.path:variable`` or ``path/to/file.py:variable``.

    The variable defaults to ``op``.

    Example:
        >>> load_op("xla_kernels.kernels.simple_add:simple_add").name
        'xla_kernels.simple_add'
    """
    module_spec, _, attr = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not module_spec:
        raise CommandError(f"op path {spec!r}: no module before ':'. Fix: write "
                           "module.path:op_variable, e.g. xla_kernels.kernels.simple_add:"
                           "simple_add")
    module = import_user_module(module_spec, context=f"op path {spec!r}")
    attr = attr or "op"
    op = getattr(module, attr, None)
    if not isinstance(op, Op):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, Op))
        problem = (f"module '{module.__name__}' has no variable '{attr}'" if op is None
                   else f"'{attr}' in module '{module.__name__}' is a {type(op).__name__}, "
                        "not an xla_kernels.Op")
        hint = (f"ops in that module: {', '.join(found)}" if found
                else "that module declares no ops")
        raise CommandError(f"op path {spec!r}: {problem}. Fix: write "
                           f"{module_spec}:OP_VARIABLE ({hint})")
    return op


def build_op(spec: str, platforms: list[str]) -> int:
    """Build an op's kernels ahead of time: ``module.path:op_name``."""
    op = load_op(spec)
    from xla_kernels.runtime.library import load_kernel

    for platform in platforms or sorted(op.kernels):
        if platform not in op.kernels:
            raise CommandError(f"{op.name}: --platform {platform}: the op has no kernel for "
                               f"{platform}. Fix: pass --platform "
                               f"{' or '.join(sorted(op.kernels))}")
        print(f"{op.name} [{platform}]: {load_kernel(op, platform).library}")
    return 0


def build_aot(args: argparse.Namespace) -> int:
    """``build --aot PACKAGE``: prebuild the package's libraries (:mod:`xla_kernels.aot`)."""
    from xla_kernels import aot

    try:
        importlib.import_module(args.op)
    except ImportError as e:
        raise CommandError(f"--aot {args.op}: cannot import package '{args.op}' ({e}). Fix: "
                           "install it (pip install -e .) or add its folder to PYTHONPATH") from e
    built = aot.build_aot(args.op, out=args.out, platforms=args.platform,
                          cuda_archs=args.cuda_archs.split(","), ffi_dir=args.ffi_include,
                          only=args.only, jobs=args.jobs, cache_dir=args.cache_dir)
    print(f"{len(built)} libraries prebuilt")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xla-kernels", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="what is installed and registered; why a target is not",
                         description="Show runtimes, compilers, declared ops and registered "
                                     "handlers; with TARGET, whether that op is declared and "
                                     "can be registered.")
    doc.add_argument("target", nargs="?", help="a custom-call target, e.g. xla_kernels.simple_add")
    doc.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                     help="import this module (my_pkg.ops) or .py file first, so the ops it "
                          "declares are known; repeatable")
    doc.add_argument("--register", action="store_true",
                     help="build the target's kernels and register them now")
    bld = sub.add_parser("build", help="build an op's kernels ahead of time",
                         description="Compile an op's kernels into the cache, so the first "
                                     "call does not wait for the compiler.")
    bld.add_argument("op", help="module.path:op_variable or path/to/file.py:op_variable; "
                                "with --aot, a package name")
    bld.add_argument("--platform", action="append", default=[], choices=["cpu", "cuda"],
                     help="platform to build for (repeatable; default: every platform the "
                          "op has a kernel for)")
    bld.add_argument("--aot", action="store_true",
                     help="prebuild every op the package declares into PACKAGE/_prebuilt/, "
                          "to ship in its wheel (docs/prebuilt.md)")
    bld.add_argument("--out", type=Path, help="with --aot: the prebuilt folder to write "
                                              "(default: PACKAGE/_prebuilt)")
    bld.add_argument("--cuda-archs", default="80,90,100",
                     help="with --aot: CUDA archs to build for (default: 80,90,100; "
                          "arch-specific kernels get 90a/100a)")
    bld.add_argument("--ffi-include", type=Path,
                     help="with --aot: XLA FFI headers to build against (an older jaxlib's "
                          "include folder; default: the installed jaxlib's)")
    bld.add_argument("--only", action="append", default=[], metavar="LIBRARY",
                     help="with --aot: build only the library of this name (repeatable)")
    bld.add_argument("--jobs", type=int, default=2, help="with --aot: builds run at once")
    bld.add_argument("--cache-dir", type=Path,
                     help="with --aot: build cache to reuse across runs (default: a fresh one)")
    sub.add_parser("demo", help="run the demo (the README's main job)")
    _serve_bench_parser(sub)
    return parser


def _serve_bench_parser(sub: Any) -> None:
    srv = sub.add_parser(
        "serve-bench", help="run a Llama-style model in the paged-KV serving loop; time it",
        description="Generate greedily for a seeded workload with continuous batching over "
                    "a paged KV cache, time it, and check the tokens against a dense "
                    "(unpaged) reference. Unset options take the preset's defaults.")
    srv.add_argument("--preset", default="tiny",
                     help="tiny, 1b, 8b, tiny-moe or moe (default tiny)")
    srv.add_argument("--frontend", default="jax", help="jax or torchax (default jax)")
    srv.add_argument("--attention", default="xla-kernels",
                     help="xla-kernels (the library's custom calls) or plain-xla (their "
                          "plain-XLA fallbacks); default xla-kernels")
    srv.add_argument("--moe", default="auto",
                     help="a mixture-of-experts preset's expert layer: auto (default: as "
                          "--attention, fused_moe under xla-kernels, fused_moe_xla under "
                          "plain-xla), xla-kernels (the fused_moe custom call), ragged-dot "
                          "(fused_moe_ragged_dot: two jax.lax.ragged_dot grouped GEMMs) or "
                          "plain-xla (fused_moe_xla: every expert over every token); the "
                          "attention stays as --attention says. Dense presets take only auto")
    srv.add_argument("--platform", default=None,
                     help="cpu or gpu (default: JAX's default backend)")
    # Whole numbers are parsed by serve_bench, so a bad one gets the same one-line error
    # (naming the option and the fix) as a bad value of the right type.
    srv.add_argument("--requests", help="number of requests")
    srv.add_argument("--prompt-len", help="mean prompt length (tokens)")
    srv.add_argument("--new-tokens", help="most tokens generated per request")
    srv.add_argument("--arrival-every",
                     help="request i arrives before step i * N (0: all at once)")
    srv.add_argument("--dtype", help="float32, bfloat16 or float16 (default: the preset's)")
    srv.add_argument("--weights", default="model",
                     help="the decoder's q/k/v/o and gate/up/down projections: model (the "
                          "model's dtype; default), fp8 (e4m3, per-channel scales, weight-only "
                          "W8A16) or fp8-dynamic (W8A8, per-token activation scales)")
    srv.add_argument("--kv-cache-dtype", default="auto",
                     help="the paged K and V caches: auto (the model's dtype; default) or fp8 "
                          "(float8_e4m3fn, per-tensor scales 1.0, as vLLM's "
                          "kv_cache_dtype=\"fp8\")")
    srv.add_argument("--check-dtype",
                     help="dtype of the token-for-token reference check (default float32; "
                          "a model in another dtype is re-run untimed in it)")
    srv.add_argument("--no-reference", action="store_true",
                     help="skip the dense reference check")
    srv.add_argument("--no-breakdown", action="store_true",
                     help="skip the decode-step replay (device time, attention share)")
    srv.add_argument("--max-num-seqs", help="most sequences per step")
    srv.add_argument("--token-budget", help="most query rows per step")
    srv.add_argument("--block-size", help="tokens per cache block: 16, 32, 64, 128 or 256 "
                     "(the attention kernels' block sizes)")
    srv.add_argument("--num-blocks",
                     help="cache blocks per layer (default: all admitted requests fit)")
    srv.add_argument("--shuffle-blocks", action="store_true",
                     help="hand cache blocks out in a random order")
    srv.add_argument("--seed", default="0", help="weights and workload seed")
    srv.add_argument("--json", dest="json_path", metavar="PATH", help="write the results here")
    srv.add_argument("--plot", dest="plot_path", metavar="PATH",
                     help="step time plot, .svg or .png (default: the JSON path with .svg)")
    srv.add_argument("--profile", dest="profile_dir", metavar="DIR",
                     help="write a jax.profiler trace of the replayed decode step")
    srv.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    srv.add_argument("--tp", default="1",
                     help="tensor parallel degree: split the kv heads over the platform's "
                          "first N devices (default 1)")
    srv.add_argument("--temperature", default="0",
                     help="sampling temperature; 0 (default) picks greedily, above 0 draws with "
                          "the sample op (needs --no-reference)")
    srv.add_argument("--top-k", help="keep the k most likely tokens (default: off)")
    srv.add_argument("--top-p", default="1", help="keep the most likely tokens of this mass "
                                                  "(default 1: off)")
    srv.add_argument("--min-p", default="0", help="keep tokens at least this times as likely as "
                                                  "the most likely (default 0: off)")
    srv.add_argument("--sampling-seed", help="request i draws with seed SEED + i (default 0)")
    srv.add_argument("--async-scheduling", action="store_true",
                     help="keep one step in flight: schedule and dispatch step N + 1 while "
                          "the device runs step N; with --frontend jax on a GPU this also "
                          "turns on the PjRt client's async dispatch "
                          "(PJRT_GPU_ENABLE_ASYNC_DISPATCH=1) unless that variable is set")


ASYNC_DISPATCH_ENV = "PJRT_GPU_ENABLE_ASYNC_DISPATCH"


def async_dispatch_env(async_scheduling: bool, platform: str | None, frontend: str,
                       environ: dict[str, str]) -> dict[str, str]:
    """The variables serve-bench sets before JAX creates its GPU client: with
    ``--async-scheduling --frontend jax`` on a GPU (or the default platform), the PjRt GPU
    client's asynchronous dispatch (``PJRT_GPU_ENABLE_ASYNC_DISPATCH=1``: a jitted call
    returns before its work is launched), unless ``environ`` already sets it (``0`` keeps
    it off).

    Measured on 2 H200s, 1b preset, JAX, async scheduling: the tp 2 decode step 4.81 ->
    2.76 ms (the host's dispatch was the limit), tp 1 tokens/s +2.6 %
    (``benchmarks/results/latest/h200x2/dispatch_variants.md``). Left alone where it was not
    shown to help: the synchronous engine waits every step (JAX gained nothing; torchax lost
    6-14 %), and torchax with async scheduling was not measured with it.

    Example:
        >>> async_dispatch_env(True, "gpu", "jax", {})
        {'PJRT_GPU_ENABLE_ASYNC_DISPATCH': '1'}
        >>> async_dispatch_env(True, "gpu", "jax", {"PJRT_GPU_ENABLE_ASYNC_DISPATCH": "0"})
        {}
        >>> [async_dispatch_env(*case, {}) for case in
        ...  ((False, "gpu", "jax"), (True, "cpu", "jax"), (True, "gpu", "torchax"))]
        [{}, {}, {}]
    """
    if not async_scheduling or platform == "cpu" or frontend != "jax" \
            or ASYNC_DISPATCH_ENV in environ:
        return {}
    return {ASYNC_DISPATCH_ENV: "1"}


def serve_bench(args: argparse.Namespace) -> int:
    """Run ``serve-bench`` and print a summary; the JSON goes to ``--json``."""
    # Before anything creates JAX's GPU client, which reads it once.
    os.environ.update(async_dispatch_env(args.async_scheduling, args.platform, args.frontend,
                                         dict(os.environ)))
    from xla_kernels.serving.bench import BenchOptions
    from xla_kernels.serving.bench import serve_bench as run

    options = BenchOptions(
        preset=args.preset, frontend=args.frontend, attention=args.attention, moe=args.moe,
        platform=args.platform, dtype=args.dtype, check_dtype=args.check_dtype,
        weights=args.weights, kv_cache_dtype=args.kv_cache_dtype,
        shuffle_blocks=args.shuffle_blocks, reference=not args.no_reference,
        breakdown=not args.no_breakdown, progress=not args.no_progress,
        json_path=args.json_path, plot_path=args.plot_path, profile_dir=args.profile_dir,
        async_scheduling=args.async_scheduling, **_whole_numbers(args), **_reals(args))
    result = run(options)
    config = result["config"]
    weights = "" if config["weights"] == "model" else f" {config['weights']} weights"
    if config["kv_cache_dtype"] != "auto":
        weights += f" {config['kv_cache_dtype']} KV cache"
    moe = f", MoE {config['moe']}" if config["moe"] else ""
    rows = [("config", f"{config['preset']} {config['dtype']}{weights}, {config['frontend']}, "
                       f"{config['attention']}{moe}, {config['device']}"
                       + (f" x {config['tp']} (tp)" if config["tp"] > 1 else "")
                       + (", async scheduling" if config["async_scheduling"] else "")
                       + _sampling_text(config["sampling"])),
            ("tokens/s", f"{result['tokens_per_s']} ({result['generated_tokens']} tokens "
                         f"in {result['wall_s']} s, {result['steps_run']} steps)"),
            ("decode step", f"{result['decode_step_ms']} ms"),
            ("weights read", _weights_line(result["weights"], config["tp"])),
            ("KV cache read", _kv_cache_line(result["kv_cache"], config["tp"])),
            ("prefill", f"{result['prefill_tokens_per_s']} tokens/s"),
            ("matches_reference", str(result["matches_reference"]))]
    divergence = result["reference_check"].get("first_divergence")
    if divergence:
        rows.append(("first divergence", _divergence_line(divergence)))
    breakdown = result.get("breakdown")
    if breakdown:
        rows.append(("breakdown", f"device step {breakdown['decode_step_device_ms']} ms, "
                                  f"attention {breakdown['attention_ms']} ms "
                                  f"({breakdown['attention_share']:.0%})"))
        rows.append(("host", f"dispatch {breakdown['dispatch_ms']} ms; device step with a "
                             f"new batch each step {breakdown['decode_step_fresh_batch_ms']} ms"))
    for key in ("plot",):
        if key in result:
            rows.append((key, result[key]))
    if args.json_path:
        rows.append(("json", args.json_path))
    _print_table("serve-bench:", rows)
    return 0


def _weights_line(read: dict[str, Any], tp: int) -> str:
    """What a step reads of the weights (serve-bench's ``weights`` record).

    Example:
        >>> _weights_line({"bytes_read_per_step": 3 * 2**20, "per_device": 2**21}, 2)
        '3.0 MiB per step (all but the embedding), 2.0 MiB per device'
    """
    line = f"{read['bytes_read_per_step'] / 2**20:.1f} MiB per step (all but the embedding)"
    return line + (f", {read['per_device'] / 2**20:.1f} MiB per device" if tp > 1 else "")


def _kv_cache_line(read: dict[str, Any], tp: int) -> str:
    """What a decode step reads of the KV cache (serve-bench's ``kv_cache`` record).

    Example:
        >>> _kv_cache_line({"dtype": "float8_e4m3fn", "bytes_per_token": 65536,
        ...                 "decode_bytes_read_per_step": 3 * 2**20, "per_device": 32768,
        ...                 "decode_bytes_read_per_step_per_device": 3 * 2**19}, 2)
        '3.0 MiB per decode step (median; float8_e4m3fn, 64.0 KiB per token), 1.5 MiB per device'
    """
    kind = f"{read['dtype']}, {read['bytes_per_token'] / 2**10:.1f} KiB per token"
    step = read["decode_bytes_read_per_step"]
    if step is None:
        return f"no decode step ({kind})"
    line = f"{step / 2**20:.1f} MiB per decode step (median; {kind})"
    return line + (f", {read['decode_bytes_read_per_step_per_device'] / 2**20:.1f} MiB per "
                   "device" if tp > 1 else "")


def _sampling_text(sampling: dict[str, Any]) -> str:
    """``, sampled (...)`` for a run that draws tokens, empty for a greedy one.

    Example:
        >>> _sampling_text({"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.0,
        ...                 "seed": 3})
        ', sampled (temperature 0.7, top-k 50, top-p 0.9, min-p 0, seed 3)'
    """
    if not sampling["temperature"] > 0:
        return ""
    return (f", sampled (temperature {sampling['temperature']:g}, top-k {sampling['top_k']}, "
            f"top-p {sampling['top_p']:g}, min-p {sampling['min_p']:g}, seed "
            f"{sampling['seed']})")


SERVE_BENCH_WHOLE_NUMBERS = ("requests", "prompt_len", "new_tokens", "arrival_every", "seed",
                             "block_size", "num_blocks", "max_num_seqs", "token_budget", "tp",
                             "top_k", "sampling_seed")
SERVE_BENCH_REALS = ("temperature", "top_p", "min_p")


def _reals(args: argparse.Namespace) -> dict[str, float]:
    """serve-bench's decimal options, parsed; a bad one is a one-line error naming it."""
    from xla_kernels.serving.options import parse_real

    return {name: parse_real("--" + name.replace("_", "-"), getattr(args, name))
            for name in SERVE_BENCH_REALS}


def _whole_numbers(args: argparse.Namespace) -> dict[str, int | None]:
    """serve-bench's whole-number options, parsed; a bad one is a one-line error naming it."""
    from xla_kernels.serving.options import parse_whole

    return {name: None if getattr(args, name) is None
            else parse_whole("--" + name.replace("_", "-"), getattr(args, name))
            for name in SERVE_BENCH_WHOLE_NUMBERS}


def _divergence_line(divergence: dict[str, Any]) -> str:
    """One line for serve-bench's first divergence from the reference.

    Example:
        >>> print(_divergence_line({"request": 3, "index": 9, "engine": 5, "reference": 7,
        ...                         "diverged_requests": 1, "engine_took_runner_up": True,
        ...                         "reference_margin": 2e-06, "margin_quantile": 0.0001}))
        ... # doctest: +NORMALIZE_WHITESPACE
        request 3, token 9: 5 instead of 7 (the runner-up, by a margin of 2e-06, smaller than
        99.99% of margins); 1 request(s) differ
    """
    line = (f"request {divergence['request']}, token {divergence['index']}: "
            f"{divergence['engine']} instead of {divergence['reference']}")
    if "reference_margin" in divergence:
        which = "the runner-up" if divergence["engine_took_runner_up"] else "not the runner-up"
        line += (f" ({which}, by a margin of {divergence['reference_margin']:.3g}, smaller than "
                 f"{1 - divergence['margin_quantile']:.2%} of margins)")
    return line + f"; {divergence['diverged_requests']} request(s) differ"


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    Example:
        >>> main(["build", "no_such_module:op"])                       # doctest: +SKIP
        xla-kernels build: error: op path no_such_module: cannot import module ...
        1
    """
    args = _parser().parse_args(argv)
    commands: dict[str, Callable[[], int]] = {
        "doctor": lambda: doctor(args.target, args.register, args.imports),
        "build": lambda: (build_aot(args) if args.aot else build_op(args.op, args.platform)),
        "demo": lambda: __import__("xla_kernels.demo", fromlist=["main"]).main([]),
        "serve-bench": lambda: serve_bench(args),
    }
    try:
        return commands[args.command]()
    except (CommandError, XlaKernelsError) as e:
        print(f"xla-kernels {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
