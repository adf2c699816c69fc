"""Repack the FlashInfer wheel without the JIT sources its decode kernels never build, so
that it fits the device tool's 64 MiB carry next to the repository.

``flashinfer-python`` 0.7.2.post1 is a 62 MB wheel, most of it CUDA sources under
``flashinfer/data/csrc`` that FlashInfer's JIT compiles on first use. Decode
(``BatchDecodeWithPagedKVCacheWrapper``, the peer of ``benchmarks/flashinfer_decode.py``)
builds none of the folders in :data:`DROP`; the repacked wheel (41 MB) built all four
decode variants (bf16/fp8, with and without tensor cores) on an H200 on 2026-11-26
(``benchmarks/results/latest/h200/flashinfer_decode.md`` was measured with it). The dropped
files also leave the wheel's ``RECORD``, so pip installs it as a normal wheel.

Example (here, before a device call that carries ``.whl-fi``):
    $ python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 -d /tmp/fi flashinfer-python==0.7.2.post1
    $ python3 scripts/repack_flashinfer_wheel.py /tmp/fi/flashinfer_python-*.whl .whl-fi/
    .whl-fi/flashinfer_python-0.7.2.post1-py3-none-any.whl: 62.1 MB -> 41.3 MB, 1293 files dropped
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

DROP = (
    "flashinfer/data/csrc/cake_sampling/",
    "flashinfer/data/csrc/cake_dsv4/",
    "flashinfer/data/csrc/fused_moe/cake_mxfp4_situ_moe/",
    "flashinfer/data/csrc/fused_moe/cake_kimi_k3_situ/",
    "flashinfer/data/csrc/kda/",
    "flashinfer/data/csrc/gdn/",
    "flashinfer/data/csrc/alphamoe_nvfp4_sm100.cu",
    "flashinfer/data/csrc/cake_sage_block_sparse_attention/",
)
"""Path prefixes inside the wheel that are left out (sampling, DeepSeek-V4, MoE, KDA/GDN
linear attention and block-sparse attention sources)."""


def repack(wheel: Path, out: Path, drop: tuple[str, ...] = DROP) -> tuple[int, int, int]:
    """Write ``wheel`` without the members whose names start with one of ``drop`` (and
    without their ``RECORD`` lines) to ``out``; returns (bytes in, bytes out, files dropped).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> with zipfile.ZipFile(d / "w.whl", "w") as z:
        ...     z.writestr("pkg/a.py", "a"); z.writestr("pkg/big/b.cu", "b" * 100)
        ...     z.writestr("pkg-1.dist-info/RECORD", "pkg/a.py,,\\npkg/big/b.cu,,\\n")
        >>> repack(d / "w.whl", d / "out.whl", ("pkg/big/",))[2]
        1
        >>> zipfile.ZipFile(d / "out.whl").read("pkg-1.dist-info/RECORD").decode()
        'pkg/a.py,,\\n'
    """
    dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(drop):
                dropped += 1
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in data.decode().splitlines(keepends=True)
                        if not line.startswith(drop)]
                data = "".join(kept).encode()
            dst.writestr(info, data)
    return wheel.stat().st_size, out.stat().st_size, dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="flashinfer_python-*.whl as downloaded")
    parser.add_argument("out_dir", type=Path, help="where the repacked wheel goes (same name)")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        print(f"repack_flashinfer_wheel: no wheel at {args.wheel}. Fix: pip download it first "
              "(see this script's docstring).", file=sys.stderr)
        return 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / args.wheel.name
    if out.resolve() == args.wheel.resolve():
        print("repack_flashinfer_wheel: the output would overwrite the input. Fix: download "
              "the wheel to another folder.", file=sys.stderr)
        return 1
    size_in, size_out, dropped = repack(args.wheel, out)
    print(f"{out}: {size_in / 1e6:.1f} MB -> {size_out / 1e6:.1f} MB, {dropped} files dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
