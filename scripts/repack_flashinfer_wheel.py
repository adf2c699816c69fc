"""Repack the FlashInfer wheel without the JIT sources that the benchmarks' peers never
build, so that it fits the device tool's 64 MiB carry next to the repository.

``flashinfer-python`` 0.7.2.post1 is a 62 MB wheel, most of it CUDA sources under
``flashinfer/data`` that FlashInfer's JIT compiles on first use. Three peers use it, and
:data:`NEEDED` lists the sources their JIT specs name (read from the wheel's
``flashinfer/jit/attention/modules.py``, ``jit/sampling.py``, ``jit/topk.py`` and
``jit/fused_moe.py``):

* ``decode``: ``BatchDecodeWithPagedKVCacheWrapper`` (``benchmarks/flashinfer_decode.py``),
  the batch decode and (tensor cores) batch prefill sources at the top of ``csrc``;
* ``sampling``: ``flashinfer.sampling`` (``benchmarks/sampling.py``): ``sampling.cu``,
  ``renorm.cu`` and their binding, and the radix top-k (``topk.cu`` ...) that
  ``top_k_top_p_sampling_from_logits``'s "top_k_first" fast path calls. The
  ``csrc/cake_sampling`` folder is a different module (``flashinfer.cake_sampling``), unused;
* ``fused_moe``: ``flashinfer.fused_moe.cutlass_fused_moe`` on sm_90
  (``benchmarks/moe.py --peers flashinfer``): ``csrc/nv_internal`` (TensorRT-LLM's MoE
  GEMMs), ``csrc/fused_moe/cutlass_backend`` and the kernels that
  ``flashinfer/jit/gemm/cutlass/generate_kernels.py`` writes at build time.

All three also include ``data/include``, CUTLASS's ``include`` and ``tools/util/include``,
CCCL and spdlog. None of the :data:`DROP` prefixes is in the ``#include`` closure of those
sources (2101 files), and ``nvcc -E`` (CUDA 13.0, sm_90a, the JIT specs' include paths)
found every header of each of them and of the 220 generated sm_90 MoE kernel files in the
repacked wheel (2026-11-27, on a machine without a GPU). :func:`repack` refuses to write a
wheel that lacks one of :data:`NEEDED`. The
decode-only repack (41 MB, the first eight prefixes) built all four decode variants on an
H200 on 2026-11-26; this one (32 MB) has not yet been built on a GPU. The dropped files
also leave the wheel's ``RECORD``, so pip installs it as a normal wheel.

Example (here, before a device call that carries ``.whl-fi``):
    $ python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 -d /tmp/fi flashinfer-python==0.7.2.post1
    $ python3 scripts/repack_flashinfer_wheel.py /tmp/fi/flashinfer_python-*.whl .whl-fi/
    .whl-fi/flashinfer_python-0.7.2.post1-py3-none-any.whl: 62.1 MB -> 32.1 MB, 2755 files dropped
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

_DATA = "flashinfer/data/"
DROP = tuple(_DATA + path for path in (
    # decode-only repack of 2026-11-26
    "csrc/cake_sampling/", "csrc/cake_dsv4/", "csrc/fused_moe/cake_mxfp4_situ_moe/",
    "csrc/fused_moe/cake_kimi_k3_situ/", "csrc/kda/", "csrc/gdn/",
    "csrc/alphamoe_nvfp4_sm100.cu", "csrc/cake_sage_block_sparse_attention/",
    # other modules' sources (Blackwell, VSA, DeepGEMM, MLA, fused-MoE variants)
    "csrc/cake_fmha/", "csrc/blackwell_bf16_fp4/", "csrc/blackwell_msa/", "csrc/cake_bgmv_moe/",
    "csrc/cake_batch_deepgemm_fp8/", "csrc/cake_vsa_sm90/", "csrc/cake_vsa/",
    "csrc/cake_trtllm_mla_blackwell/", "csrc/cake_all_gather_matmul/",
    "csrc/cake_grouped_fp8_gemm/", "csrc/cake_kimi_k3_mla/", "csrc/fused_moe/warp_decode/",
    # CUTLASS and CCCL beyond their include folders (examples, tests, Python packages, CI)
    "cutlass/examples/", "cutlass/test/", "cutlass/python/", "cccl/python/", "cccl/ci/",
    "cccl/benchmarks/", "cccl/docs/", "cccl/cudax/", "cccl/libcudacxx/test/",
    "cccl/libcudacxx/codegen/", "cccl/cub/benchmarks/", "cccl/thrust/scripts/",
))
"""Path prefixes inside the wheel that are left out."""

_MOE_GEMM = "csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_"
NEEDED = {
    "decode": ("csrc/batch_decode.cu", "csrc/batch_decode_jit_binding.cu",
               "csrc/batch_decode_customize_config.jinja", "csrc/batch_decode_kernel_inst.jinja",
               "csrc/batch_prefill.cu", "csrc/batch_prefill_jit_binding.cu",
               "csrc/batch_prefill_customize_config.jinja",
               "csrc/batch_prefill_paged_kernel_inst.jinja",
               "csrc/batch_prefill_ragged_kernel_inst.jinja", "csrc/batch_prefill_sm90.cu",
               "csrc/batch_prefill_sm90_jit_binding.cu",
               "csrc/batch_prefill_sm90_customize_config.jinja",
               "csrc/batch_prefill_paged_sm90_kernel_inst.jinja",
               "csrc/batch_prefill_ragged_sm90_kernel_inst.jinja", "csrc/page.cu"),
    "sampling": ("csrc/sampling.cu", "csrc/renorm.cu", "csrc/flashinfer_sampling_binding.cu",
                 "csrc/topk.cu", "csrc/cub_topk.cu", "csrc/flashinfer_topk_binding.cu",
                 "csrc/flashinfer_fast_topk_clusters_binding.cu"),
    "fused_moe": (
        *(f"{_MOE_GEMM}kernels_{types}.cu" for types in (
            "fp8_uint4", "fp8_fp8", "fp8_fp4", "fp4_fp4", "fp32_fp32", "fp16_uint8",
            "fp16_uint4", "fp16_fp16", "bf16_uint8", "bf16_uint4", "bf16_fp8", "bf16_bf16",
            "bf16_fp4", "fp16_fp4")),
        f"{_MOE_GEMM}tma_warp_specialized_input.cu", f"{_MOE_GEMM}mixed_utils.cu",
        "csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/fp8_blockscale_gemm/"
        "fp8_blockscale_gemm.cu",
        "csrc/fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding.cu",
        "csrc/fused_moe/cutlass_backend/deepgemm_jit_setup.cu",
        "csrc/fused_moe/cutlass_backend/cutlass_fused_moe_instantiation.cu",
        *(f"csrc/nv_internal/cpp/common/{name}" for name in (
            "envUtils.cpp", "logger.cpp", "stringUtils.cpp", "tllmException.cpp",
            "memoryUtils.cu")),
        "csrc/nv_internal/tensorrt_llm/kernels/preQuantScaleKernel.cu",
        "csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp",
        "csrc/nv_internal/tensorrt_llm/kernels/lora/lora.cpp",
        "flashinfer/jit/gemm/cutlass/generate_kernels.py"),
}
"""Per peer, the files (under ``flashinfer/data/`` unless they start with ``flashinfer/``)
that its JIT builds from and that the repacked wheel must keep."""


def needed_members(peers: tuple[str, ...] = tuple(NEEDED)) -> list[str]:
    """The wheel members that ``peers`` build from.

    Example:
        >>> needed_members(("sampling",))[0]
        'flashinfer/data/csrc/sampling.cu'
    """
    return [name if name.startswith("flashinfer/") else _DATA + name
            for peer in peers for name in NEEDED[peer]]


def repack(wheel: Path, out: Path, drop: tuple[str, ...] = DROP,
           needed: list[str] | tuple[str, ...] = ()) -> tuple[int, int, int]:
    """Write ``wheel`` without the members whose names start with one of ``drop`` (and
    without their ``RECORD`` lines) to ``out``; returns (bytes in, bytes out, files dropped).
    Raises ``ValueError`` (and writes nothing) if a member named in ``needed`` is not in
    ``wheel`` or would be dropped.

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
        >>> repack(d / "w.whl", d / "out.whl", ("pkg/big/",), ["pkg/big/b.cu"])
        Traceback (most recent call last):
        ValueError: needed but missing or dropped: pkg/big/b.cu
    """
    with zipfile.ZipFile(wheel) as src:
        names = set(src.namelist())
    lost = [name for name in needed if name not in names or name.startswith(drop)]
    if lost:
        raise ValueError(f"needed but missing or dropped: {', '.join(lost)}")
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
    parser.add_argument("--needs", nargs="*", choices=sorted(NEEDED), default=sorted(NEEDED),
                        help="peers whose JIT sources the wheel must keep (checked before "
                             "writing; default: all)")
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
    try:
        size_in, size_out, dropped = repack(args.wheel, out, needed=needed_members(args.needs))
    except ValueError as e:
        print(f"repack_flashinfer_wheel: {e}. Fix: take those paths out of DROP (or check the "
              "FlashInfer version).", file=sys.stderr)
        return 1
    print(f"{out}: {size_in / 1e6:.1f} MB -> {size_out / 1e6:.1f} MB, {dropped} files dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
