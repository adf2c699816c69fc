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
from xla_kernels.serving import cli as serving_cli

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
    serving_cli.add_parser(sub)
    return parser


def _serve_bench(args: argparse.Namespace) -> int:
    """``serve-bench``: run it (:mod:`xla_kernels.serving.cli`), print its summary."""
    _print_table("serve-bench:", serving_cli.run(args))
    return 0


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
        "serve-bench": lambda: _serve_bench(args),
    }
    try:
        return commands[args.command]()
    except (CommandError, XlaKernelsError) as e:
        print(f"xla-kernels {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
