"""One profiled call each of our paged_attention and FlashInfer's decode, for Nsight tools.

For each config (the names of :mod:`flashinfer_decode`'s matrix, e.g. ``"32x2048 32/8 bf16"``)
it sets up the data, warms every variant up (ours; FlashInfer with ``use_tensor_cores``
False and True), then calls each variant ``--calls`` times inside
``cudaProfilerStart``/``Stop`` and an NVTX range ``<variant> <config>``. Run it under
``ncu --profile-from-start off`` (every kernel of those calls is profiled) or
``nsys profile --capture-range=cudaProfilerApi`` (the back-to-back timeline).

Example (on the GPU machine):
    $ ncu --profile-from-start off --clock-control none --set full -o decode \\
        python benchmarks/profile_decode.py --configs "32x2048 32/8 bf16"
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch


def variants(fd: Any, fi: Any, cfg: dict[str, Any], op: Any) -> dict[str, Any]:
    """``name -> zero-argument call`` for ours and each FlashInfer setting on ``cfg``."""
    device = torch.device("cuda")
    data = fd.make_data(cfg, device, sets=1)
    kv = cfg["kv_dtype"]
    if kv == "fp8":
        data.update(fd.quantized(data))
    scale = cfg["head_dim"] ** -0.5
    q, k, v = data["q"][0], data["k"][0], data["v"][0]
    calls = {"ours": lambda: op(q, k, v, data["block_tables"], data["seq_lens"], scale=scale)}
    if fi is not None:
        for tc in (False, True):
            workspace = torch.zeros(fd.WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            wrapper = fd.fi_wrapper(fi, workspace, tc, data, cfg, fd.KV_DTYPES[kv], scale)
            calls[f"fi_tc{int(tc)}"] = lambda w=wrapper: w.run(q, (k, v))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", required=True,
                        help='config names as in flashinfer_decode.py, e.g. "32x2048 32/8 bf16"')
    parser.add_argument("--calls", type=int, default=1, help="profiled calls per variant")
    parser.add_argument("--no-flashinfer", action="store_true", help="ours only")
    parser.add_argument("--build-logs", type=Path, default=Path("/tmp"),
                        help="folder for FlashInfer's JIT build logs")
    args = parser.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from xla_kernels.bench import load_script

    fd = load_script(Path(__file__).with_name("flashinfer_decode.py"))
    from xla_kernels.frontends.torch import torch_op
    from xla_kernels.kernels.paged_attention import paged_attention

    fi = None
    if not args.no_flashinfer:
        fd.fi_toolchain()
        fi, info = fd.import_flashinfer()
        if fi is None:
            print(f"FlashInfer unavailable: {info.get('error')}", flush=True)
    known = {c["name"]: c for c in fd.matrix(quick=False, smoke=False)}
    configs = [known[name] for name in args.configs]
    builds = (fd.start_prebuilds({c["kv_dtype"] for c in configs}, args.build_logs)
              if fi is not None else {})  # FlashInfer's JIT, in parallel children
    op = torch_op(paged_attention)
    for name, b in fd.wait_prebuilds(builds, 600.0).items():
        print(f"FlashInfer build {name}: {b}", flush=True)
    cudart = torch.cuda.cudart()
    for cfg in configs:
        name = cfg["name"]
        calls = variants(fd, fi, cfg, op)
        for call in calls.values():  # warm-up (and FlashInfer's JIT)
            call()
            call()
        torch.cuda.synchronize()
        for variant, call in calls.items():
            cudart.cudaProfilerStart()
            torch.cuda.nvtx.range_push(f"{variant} {name}")
            for _ in range(args.calls):
                call()
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()
        print(f"profiled {name}: {', '.join(calls)}", flush=True)
        del calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
