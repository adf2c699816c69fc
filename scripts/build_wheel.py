"""Build ``dist/xla_kernels-*.whl`` with every shipped library prebuilt (``make wheel``).

Steps: fetch the XLA FFI headers of the oldest supported jaxlib (``--ffi-jaxlib``; one
library then serves it and every newer jaxlib with the same FFI major version) and, for the
CUDA libraries, CUTLASS's headers from the ``nvidia-cutlass`` release the kernels are
written against (``linear``'s and ``fp8_linear``'s Hopper GEMMs; a user of the wheel needs
neither); copy the package into ``build/wheel/``; prebuild there (``xla-kernels build --aot
xla_kernels``): the CPU and CUDA libraries of every shipped op, the eager FFI runtime and the
torch dispatcher library for this Python's torch; check that the CUDA libraries hold their
Hopper paths; add the torch dispatcher library of every other torch interpreter given
(``--torch-python``, one prebuilt per torch build, chosen at import); pack the wheel (tagged
``py3-none-linux_x86_64``: its libraries are x86-64 Linux code loaded with ctypes, for any
Python 3) and check its size.

Example:
    $ python scripts/build_wheel.py --torch-python /tmp/venv212/bin/python
    $ python scripts/build_wheel.py --platform cpu          # no CUDA libraries (quick)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The oldest jaxlib whose FFI headers the wheel's libraries are built against.
FFI_JAXLIB = "0.10.0"
MAX_WHEEL_MIB = 64
#: The nvidia-cutlass release whose headers the CUDA libraries are built with (the one
#: xla_kernels.builder.cutlass names).
CUTLASS = "4.2.0.0"
PLATFORM_TAG = "linux_x86_64"


def downloaded_wheel(project: str, version: str, work: Path) -> Path:
    """``project`` ``version``'s wheel in ``work`` (downloaded once, without its
    dependencies: only files are taken from it)."""
    wheels = work / f"{project}-wheels"
    pattern = f"{project.replace('-', '_')}-{version}-*.whl"
    if not any(wheels.glob(pattern)):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", str(wheels), f"{project}=={version}"],
                       check=True)
    return next(wheels.glob(pattern))


def unpacked(wheel: Path, prefix: str, keep: tuple[str, ...], dest: Path) -> Path:
    """``dest`` holding the files of ``wheel`` under ``prefix`` whose path below it starts
    with one of ``keep``, unpacked whole or not at all (an interrupted run leaves only a
    ``.partial`` folder, replaced by the next).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> with zipfile.ZipFile(d / "w.whl", "w") as z:
        ...     z.writestr("pkg/include/a.h", "a"); z.writestr("pkg/other.py", "")
        >>> sorted(p.name for p in unpacked(d / "w.whl", "pkg/", ("include/",), d / "x").rglob("*"))
        ['a.h', 'include']
    """
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            inside = name.removeprefix(prefix)
            if name.startswith(prefix) and not name.endswith("/") and inside.startswith(keep):
                target = partial / inside
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


def ffi_headers(version: str, work: Path) -> Path:
    """The ``include`` folder of jaxlib ``version`` (its wheel downloaded once, not installed)."""
    include = work / f"jaxlib-{version}" / "include"
    if (include / "xla" / "ffi" / "api" / "c_api.h").is_file():
        return include
    return unpacked(downloaded_wheel("jaxlib", version, work), "jaxlib/include/", ("",),
                    include)


def cutlass_headers(version: str, work: Path) -> Path:
    """A folder holding CUTLASS ``version``'s ``include`` and ``tools/util/include``, as
    ``XLA_KERNELS_CUTLASS_DIR`` takes it: that variable's folder where it is set, else the
    ``nvidia-cutlass`` wheel's headers (downloaded once, not installed: its Python
    requirements are not needed)."""
    if given := os.environ.get("XLA_KERNELS_CUTLASS_DIR"):
        return Path(given)
    root = work / f"cutlass-{version}"
    if root.is_dir():
        return root
    return unpacked(downloaded_wheel("nvidia-cutlass", version, work),
                    "cutlass_library/source/", ("include/", "tools/util/include/"), root)


def missing_hopper_paths(prebuilt_dir: Path) -> list[str]:
    """The CUDA libraries among ``linear``'s and ``fp8_linear``'s that hold no CUTLASS code
    (built where CUTLASS's headers were not found: their Hopper GEMMs left out), or the
    library names where none was built. CUTLASS's host code in the file stands for its
    sm_90a kernels, which the same translation unit compiles or leaves out as a whole.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "linear-cuda-0.so").write_bytes(b"_ZN7cutlass4gemm")
        >>> _ = (d / "fp8_linear-cuda-0.so").write_bytes(b"no such code")
        >>> missing_hopper_paths(d)
        ['fp8_linear-cuda-0.so']
    """
    missing = []
    for name in ("linear", "fp8_linear"):
        libraries = sorted(prebuilt_dir.glob(f"{name}-cuda-*.so"))
        missing += [p.name for p in libraries if b"cutlass" not in p.read_bytes()]
        missing += [] if libraries else [f"{name} (no CUDA library)"]
    return missing


def stage(out: Path) -> Path:
    """A copy of the project's packaging files and ``src/`` without caches or old builds."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, out / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "_prebuilt", "*.pyc")
    shutil.copytree(ROOT / "src", out / "src", ignore=ignore)
    return out


def aot(python: str, prebuilt_dir: Path, args: argparse.Namespace, ffi: Path,
        only: list[str], cutlass_dir: Path | None = None) -> None:
    """``xla-kernels build --aot xla_kernels`` under ``python`` (this checkout's sources),
    with CUTLASS's headers from ``cutlass_dir`` where given."""
    cmd = [python, "-m", "xla_kernels.cli", "build", "--aot", "xla_kernels",
           "--out", str(prebuilt_dir), "--ffi-include", str(ffi),
           "--cuda-archs", args.cuda_archs, "--jobs", str(args.jobs),
           "--cache-dir", str(args.work / "aot-cache")]
    for platform in args.platform:
        cmd += ["--platform", platform]
    for name in only:
        cmd += ["--only", name]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "XLA_KERNELS_QUIET": "1"}
    if cutlass_dir is not None:
        env["XLA_KERNELS_CUTLASS_DIR"] = str(cutlass_dir)
    subprocess.run(cmd, check=True, env=env)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def retag(wheel: Path, tag: str) -> Path:
    """The wheel rewritten as ``py3-none-<tag>`` and not pure Python (its libraries are
    platform code), with its RECORD updated."""
    with zipfile.ZipFile(wheel) as z:
        items = {n: z.read(n) for n in z.namelist()}
    wheel_file = next(n for n in items if n.endswith(".dist-info/WHEEL"))
    lines = [ln for ln in items[wheel_file].decode().splitlines()
             if not ln.startswith(("Tag:", "Root-Is-Purelib:"))]
    items[wheel_file] = ("\n".join([*lines, "Root-Is-Purelib: false", f"Tag: py3-none-{tag}"])
                         + "\n").encode()
    record = next(n for n in items if n.endswith(".dist-info/RECORD"))
    items[record] = ("\n".join([_record_line(n, d) for n, d in items.items() if n != record]
                               + [f"{record},,"]) + "\n").encode()
    name, version = wheel.name.split("-")[:2]
    out = wheel.with_name(f"{name}-{version}-py3-none-{tag}.whl")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for n, d in items.items():
            z.writestr(n, d)
    if out != wheel:
        wheel.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ffi-jaxlib", default=FFI_JAXLIB,
                        help=f"jaxlib whose FFI headers to build against (default {FFI_JAXLIB})")
    parser.add_argument("--torch-python", action="append", default=[],
                        help="another Python with another torch: add its torch dispatcher "
                             "library (repeatable)")
    parser.add_argument("--platform", action="append", default=[], choices=["cpu", "cuda"],
                        help="platforms to prebuild (default: cpu and cuda)")
    parser.add_argument("--cuda-archs", default="80,90,100")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=ROOT / "build")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist")
    args = parser.parse_args(argv)
    args.platform = args.platform or ["cpu", "cuda"]
    start = time.monotonic()
    ffi = ffi_headers(args.ffi_jaxlib, args.work)
    with_cuda = "cuda" in args.platform
    cutlass_dir = cutlass_headers(CUTLASS, args.work) if with_cuda else None
    tree = stage(args.work / "wheel")
    prebuilt_dir = tree / "src" / "xla_kernels" / "_prebuilt"
    aot(sys.executable, prebuilt_dir, args, ffi, [], cutlass_dir)
    if with_cuda and (missing := missing_hopper_paths(prebuilt_dir)):
        print(f"error: built without CUTLASS's code: {', '.join(missing)}", file=sys.stderr)
        return 1
    for python in args.torch_python:
        aot(python, prebuilt_dir, args, ffi, ["xk_torch_native"])
    args.dist.mkdir(parents=True, exist_ok=True)
    for old in args.dist.glob("xla_kernels-*.whl"):
        old.unlink()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(args.dist), str(tree)], check=True)
    wheel = retag(next(args.dist.glob("xla_kernels-*.whl")), PLATFORM_TAG)
    mib = wheel.stat().st_size / 2**20
    print(f"{wheel} ({mib:.1f} MiB, built in {time.monotonic() - start:.0f} s)")
    if mib > MAX_WHEEL_MIB:
        print(f"error: the wheel is larger than {MAX_WHEEL_MIB} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
