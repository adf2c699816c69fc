"""First call of every shipped op from the wheel, with no compiler: process start to result.

On the GPU machine (no network): installs the wheel into a fresh venv (``--no-index
--no-deps``; the machine's own site-packages, which hold jax and torch, are appended through a
``.pth`` file), then runs one fresh process per op and frontend (JAX, torch eager) with PATH
holding only ``python`` and ``nvidia-smi``, ``CXX``/``XLA_KERNELS_NVCC`` pointing nowhere,
``XLA_KERNELS_BUILD=never`` and an empty build cache that must still be absent afterwards.
Beside each, the same first call built just in time (``XLA_KERNELS_BUILD=always``, the
machine's compilers, an empty cache per process).

Times, per process: ``framework_s`` (import jax/torch and initialise the GPU: a device array
made and synchronised), ``first_call_s`` (the rest: import xla_kernels and the op's module,
random inputs made and copied to the GPU, the call, synchronised), ``wall_s`` (the parent's
clock around the whole process). Writes ``benchmarks/results/latest/<card>/first_call.{json,md}``.

    python3 benchmarks/first_call.py --frontends jax --out /tmp/fc     # < 10 min each
    python3 benchmarks/first_call.py --frontends torch --out /tmp/fc   # (rows are merged)
    python3 benchmarks/first_call.py --merge a/first_call.json b/first_call.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The op each case calls: every shipped op.
OPS = ("simple_add", "rms_norm", "rms_norm_bwd", "reshape_and_cache", "reshape_and_cache_fused",
       "paged_attention", "ragged_paged_attention", "ragged_paged_attention_fused", "sample",
       "fused_moe", "fused_moe_fp8", "fp8_linear")

# Runs in the fresh venv: one op, one frontend, timed from interpreter start.
CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
op_name, frontend, device = sys.argv[1], sys.argv[2], sys.argv[3]
import numpy as np
import jax, jax.numpy as jnp
if frontend == "torch":
    import torch
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.zeros(1, device=device); sync()
else:
    jnp.zeros(1).block_until_ready()
t1 = time.perf_counter()

import xla_kernels
from xla_kernels.kernels import kv_cache, paged_attention as pa, ragged_paged_attention as rpa
from xla_kernels.kernels import moe, rms_norm as rn, sampling, simple_add as sa
from xla_kernels.kernels import fp8_linear as fl
from xla_kernels import dtypes as xk_dtypes
from xla_kernels.kernels.paged_attention import testing as pa_testing
from xla_kernels.kernels.ragged_paged_attention import testing as rpa_testing
from xla_kernels.kernels.paged_cache import join_fused

rng = np.random.default_rng(0)
p = pa_testing.make_inputs(rng, num_seqs=2, num_q_heads=8, num_kv_heads=2, head_dim=128,
                           block_size=16, dtype="bf16", seq_lens=[17, 40], poison=False)
r = rpa_testing.make_inputs(rng, q_lens=[1, 5], kv_lens=[9, 40], num_q_heads=8,
                            num_kv_heads=2, head_dim=128, block_size=16, dtype="bf16",
                            poison=False)
new = rng.standard_normal((3, 2, 128)).astype(p["query"].dtype)
slots = np.array([0, 17, 33], np.int32)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
x, w = f32(8, 256), f32(256)
rows = 4
bf16, fp8 = xk_dtypes.to_numpy("bf16"), xk_dtypes.to_numpy(moe.FP8)
hidden, logits = f32(rows, 256).astype(bf16), f32(rows, 8)
w13, w2 = f32(8, 2 * 128, 256) / 16, f32(8, 256, 128) / 16
cases = {
    "fused_moe": (moe.fused_moe, [hidden, logits, w13.astype(bf16), w2.astype(bf16)],
                  {"top_k": 2}),
    "fused_moe_fp8": (moe.fused_moe_fp8, [hidden, logits, w13.astype(fp8), w2.astype(fp8),
                                          np.ones((8, 256, 1), np.float32),
                                          np.ones((8, 256, 1), np.float32)], {"top_k": 2}),
    "fp8_linear": (fl.fp8_linear, [hidden, f32(128, 256).astype(fp8),
                                   np.ones((128, 1), np.float32)], {}),
    "sample": (sampling.sample, [f32(rows, 32000), np.ones(rows, np.float32),
                                 np.full(rows, 50, np.int32), np.full(rows, 0.9, np.float32),
                                 np.zeros(rows, np.float32), np.arange(rows, dtype=np.uint32),
                                 np.zeros(rows, np.int32)], {}),
    "simple_add": (sa.simple_add, [f32(1024), f32(1024)], {}),
    "rms_norm": (rn.rms_norm, [x, w], {}),
    "rms_norm_bwd": (rn.rms_norm_bwd, [x, w, f32(8, 256)], {}),
    "reshape_and_cache": (kv_cache.reshape_and_cache,
                          [new, new, p["key_cache"], p["value_cache"], slots], {}),
    "reshape_and_cache_fused": (kv_cache.reshape_and_cache_fused,
                                [new, new, join_fused(p["key_cache"], p["value_cache"]),
                                 slots], {}),
    "paged_attention": (pa.paged_attention,
                        [p[k] for k in ("query", "key_cache", "value_cache", "block_tables",
                                        "seq_lens")], {"scale": 128 ** -0.5}),
    "ragged_paged_attention": (rpa.ragged_paged_attention, [r[k] for k in rpa_testing.ARGS],
                               {"scale": 128 ** -0.5}),
    "ragged_paged_attention_fused": (
        rpa.ragged_paged_attention_fused,
        [r["queries"], join_fused(r["key_cache"], r["value_cache"])]
        + [r[k] for k in rpa_testing.ARGS[3:]], {"scale": 128 ** -0.5}),
}
op, arrays, attrs = cases[op_name]
if frontend == "torch":
    from xla_kernels.frontends.torch import torch_op
    from xla_kernels.frontends.torch.native import native_status
    def to_torch(a):
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        if a.dtype.name == "float8_e4m3fn":
            return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
        return torch.from_numpy(a)
    out = torch_op(op)(*[to_torch(a).to(device) for a in arrays], **attrs)
    sync()
    native = native_status()
else:
    out = op(*[jax.device_put(a) for a in arrays], **attrs)
    jax.block_until_ready(out)
    native = None
t2 = time.perf_counter()
from xla_kernels.builder import used_libraries
print("RESULT " + json.dumps({
    "module": xla_kernels.__file__, "framework_s": t1 - t0, "first_call_s": t2 - t1,
    "torch_dispatcher": native,
    "libraries": {f"{n} [{pl}]": r.kind for (n, pl), r in used_libraries().items()}}))
'''


def card_name() -> str:
    """``h100``/``h200`` from nvidia-smi (``gpu`` if it says neither)."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.lower()
    except (OSError, subprocess.CalledProcessError):
        return "gpu"
    return next((c for c in ("h100", "h200", "b200", "a100") if c in name), "gpu")


def make_venv(work: Path, wheel: Path) -> Path:
    """A fresh venv with the wheel installed offline; this Python's site-packages appended."""
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig."
                                   "get_paths()['purelib'])"], capture_output=True, text=True,
                                  check=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--target", str(purelib), str(wheel)], check=True)
    # addsitedir also runs the .pth files there (namespace and plugin set-ups).
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "zz_machine_site.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in parents))
    return py


def bare_path(work: Path, python: Path) -> str:
    """A folder holding only ``python`` and ``nvidia-smi``: no g++, c++, nvcc on PATH."""
    bin_dir = work / "bare-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").symlink_to(python)
    smi = shutil.which("nvidia-smi")
    if smi:
        (bin_dir / "nvidia-smi").symlink_to(smi)
    return str(bin_dir)


def run_case(python: Path, op: str, frontend: str, device: str, env: dict[str, str],
             timeout: float) -> dict:
    start = time.perf_counter()
    try:
        proc = subprocess.run([str(python), "-c", CHILD, op, frontend, device], env=env,
                              capture_output=True, text=True, timeout=timeout, cwd="/")
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), "wall_s": wall}
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:400],
            "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path,
                        default=next(iter(sorted((ROOT / "dist").glob("xla_kernels-*.whl"))),
                                     None))
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/latest/<card>")
    parser.add_argument("--ops", nargs="*", default=list(OPS))
    parser.add_argument("--frontends", nargs="*", default=["jax", "torch"],
                        choices=["jax", "torch"],
                        help="run these (rows of other frontends already in first_call.json "
                             "are kept: run jax and torch as two calls within a time limit)")
    parser.add_argument("--skip-jit", action="store_true", help="prebuilt runs only")
    parser.add_argument("--merge", nargs="*", type=Path, default=[], metavar="JSON",
                        help="only merge these first_call.json files (of one wheel) into --out")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a smoke test of this script on a machine without a GPU")
    args = parser.parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / "latest" / card_name()
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        result = {**parts[0], "rows": sorted(
            {(r["op"], r["frontend"]): r for part in parts for r in part["rows"]}.values(),
            key=lambda r: (OPS.index(r["op"]) if r["op"] in OPS else 99, r["frontend"]))}
        (out / "first_call.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "first_call.md").write_text(markdown(result))
        print(markdown(result))
        return 0
    if args.wheel is None or not args.wheel.is_file():
        parser.error("no wheel: build it with `make wheel` and carry dist/")
    work = Path(tempfile.mkdtemp(prefix="xk-first-call-"))
    python = make_venv(work, args.wheel.resolve())
    base = {k: v for k, v in os.environ.items() if not k.startswith("XLA_KERNELS_")}
    base.pop("PYTHONPATH", None)
    base["XLA_KERNELS_QUIET"] = "1"
    doctor = subprocess.run([str(python), "-m", "xla_kernels.cli", "doctor"], env=base,
                            capture_output=True, text=True, cwd="/")
    (out / "first_call_doctor.txt").write_text(doctor.stdout + doctor.stderr)
    bare = bare_path(work, python)
    rows = []
    for op in args.ops:
        for frontend in args.frontends:
            cache = work / f"cache-{op}-{frontend}"
            env = {**base, "PATH": bare, "XLA_KERNELS_CACHE_DIR": str(cache),
                   "XLA_KERNELS_BUILD": "never", "CXX": "/nonexistent/g++",
                   "XLA_KERNELS_NVCC": "/nonexistent/nvcc"}
            pre = run_case(python, op, frontend, args.device, env, args.timeout)
            pre["cache_written"] = cache.exists()
            jit: dict = {}
            if not args.skip_jit:
                jit_env = {**base, "XLA_KERNELS_CACHE_DIR": str(work / f"jit-{op}-{frontend}"),
                           "XLA_KERNELS_BUILD": "always"}
                jit = run_case(python, op, frontend, args.device, jit_env, args.timeout)
            rows.append({"op": op, "frontend": frontend, "prebuilt": pre, "jit": jit})
            print(json.dumps(rows[-1]), flush=True)
    try:
        earlier = json.loads((out / "first_call.json").read_text())
    except (OSError, ValueError):
        earlier = {}
    if earlier.get("wheel") == args.wheel.name:
        ran = {(r["op"], r["frontend"]) for r in rows}
        rows = [r for r in earlier["rows"] if (r["op"], r["frontend"]) not in ran] + rows
        rows.sort(key=lambda r: (OPS.index(r["op"]) if r["op"] in OPS else 99, r["frontend"]))
    result = {"wheel": args.wheel.name, "wheel_mib": args.wheel.stat().st_size / 2**20,
              "card": card_name(), "python": sys.version.split()[0], "rows": rows}
    (out / "first_call.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "first_call.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(r["prebuilt"].get("first_call_s") is not None
                    and not r["prebuilt"].get("cache_written") for r in rows) else 1


def _seconds(entry: dict, key: str) -> str:
    value = entry.get(key)
    return f"{value:.2f}" if isinstance(value, float) else entry.get("error", "-")


def markdown(result: dict) -> str:
    """The table of ``first_call.md``."""
    lines = [f"# First call from the wheel ({result['card']}, Python {result['python']})", "",
             f"Wheel `{result['wheel']}`: {result['wheel_mib']:.1f} MiB. No compiler on PATH, "
             "`XLA_KERNELS_BUILD=never`, empty cache (never written). `first call` = process "
             "start to result minus framework import and GPU init (`framework`); `JIT` = the "
             "same with `XLA_KERNELS_BUILD=always` and an empty cache (compiles). Seconds. "
             "`benchmarks/first_call.py` wrote this.", "",
             "| op | frontend | first call (prebuilt) | framework | libraries | JIT first call |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        pre, jit = r["prebuilt"], r["jit"]
        libs = ", ".join(f"{k}: {v}" for k, v in pre.get("libraries", {}).items())
        if pre.get("torch_dispatcher"):
            libs += f"; torch dispatcher {pre['torch_dispatcher'].split(':')[0]}"
        lines.append(f"| {r['op']} | {r['frontend']} | {_seconds(pre, 'first_call_s')} | "
                     f"{_seconds(pre, 'framework_s')} | {libs} | "
                     f"{_seconds(jit, 'first_call_s') if jit else '-'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
