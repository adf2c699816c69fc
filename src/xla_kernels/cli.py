"""The ``xla-kernels`` command: ``doctor``, ``build`` and ``demo``.

Example:
    $ xla-kernels doctor xla_kernels.simple_add
    $ xla-kernels build xla_kernels.kernels.simple_add:simple_add --platform cuda
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable

from xla_kernels import builder
from xla_kernels.op import Op, declared_ops
from xla_kernels.runtime.registry import ensure_registered, registrations


def _line(label: str, value: object) -> None:
    print(f"  {label:<24} {value}")


def _runtimes() -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        import jax

        platforms = sorted({d.platform for d in jax.devices()})
        found["jax"] = f"{jax.__version__}, default backend {jax.default_backend()}, " \
                       f"devices: {', '.join(platforms)}"
    except Exception as e:  # a broken install is exactly what doctor must report
        found["jax"] = f"not usable: {e}"
    for name, describe in (("torch", _torch), ("torchax", _version), ("torch_xla", _torch_xla)):
        try:
            found[name] = describe(_import(name))
        except ImportError:
            found[name] = "not installed"
        except Exception as e:
            found[name] = f"not usable: {e}"
    return found


def _import(name: str) -> object:
    if name == "torchax":  # through the frontend, which tolerates torch/torchax skew
        from xla_kernels.frontends.torchax import import_torchax

        return import_torchax()
    return importlib.import_module(name)


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


def doctor(target: str | None, try_register: bool) -> int:
    """Print what is installed and registered; for ``target``, what is missing and the fix."""
    print("runtimes:")
    for name, text in _runtimes().items():
        _line(name, text)
    report = builder.toolchain_report()
    print("compilers:")
    for key in ("cxx", "nvcc"):
        entry = report[key]
        _line(key, f"{entry['path']} ({entry['version']})" if entry.get("found")
              else f"missing: {entry.get('error')}")
    _line("CUDA archs", report["cuda_archs"])
    _line("cache", report["cache_dir"])
    ops = shipped_ops()
    print("declared ops (target: platforms with kernels):")
    for name, op in ops.items():
        _line(name, ", ".join(sorted(op.kernels)))
    if target is None:
        _print_registrations()
        return 0
    print(f"target {target}:")
    op = ops.get(target)
    if op is None:
        _line("declared", "no: not an op xla-kernels knows in this process")
        print(f"  fix: import the module that declares '{target}' before running; a target "
              "registered outside xla-kernels needs jax.ffi.register_ffi_target in the same "
              "process that runs the program")
        return 1
    _line("declared", f"yes, kernels for {', '.join(sorted(op.kernels))}")
    status = 0
    if try_register:
        for platform in op.kernels:
            if platform == "cuda" and "gpu" not in _runtimes()["jax"]:
                _line(f"register {platform}", "skipped: JAX sees no GPU")
                continue
            try:
                reg = ensure_registered(op, platform)
                _line(f"register {platform}", f"ok: {reg.handler} from {reg.library}")
            except Exception as e:
                status = 1
                _line(f"register {platform}", f"FAILED: {e}")
    else:
        print("  registration is per process and lazy: xla-kernels registers the handler the "
              "first time it lowers the op for a platform. A program compiled or exported "
              "elsewhere needs xla_kernels.ensure_registered(op, platform) first. "
              "Pass --register to build and register it now.")
    _print_registrations()
    return status


def _print_registrations() -> None:
    regs = registrations()
    print("registered in this process:" + ("" if regs else " nothing yet"))
    for r in regs:
        _line(f"{r.target} [{r.platform}]", f"{r.handler} ({r.runtime}) from {r.library}")


def build_op(spec: str, platforms: list[str]) -> int:
    """Build an op's kernels ahead of time: ``module.path:op_name``."""
    module_name, _, attr = spec.partition(":")
    op = getattr(importlib.import_module(module_name), attr or "op")
    from xla_kernels.runtime.library import load_kernel

    for platform in platforms or sorted(op.kernels):
        print(f"{op.name} [{platform}]: {load_kernel(op, platform).library}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xla-kernels", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="what is installed and registered; why a target is not")
    doc.add_argument("target", nargs="?", help="a custom_call_target, e.g. xla_kernels.simple_add")
    doc.add_argument("--register", action="store_true", help="build and register it now")
    bld = sub.add_parser("build", help="build an op's kernels ahead of time")
    bld.add_argument("op", help="module.path:op_variable")
    bld.add_argument("--platform", action="append", default=[], choices=["cpu", "cuda"])
    sub.add_parser("demo", help="run the demo (the README's main job)")
    args = parser.parse_args(argv)
    commands: dict[str, Callable[[], int]] = {
        "doctor": lambda: doctor(args.target, args.register),
        "build": lambda: build_op(args.op, args.platform),
        "demo": lambda: __import__("xla_kernels.demo", fromlist=["main"]).main([]),
    }
    return commands[args.command]()


if __name__ == "__main__":
    sys.exit(main())
