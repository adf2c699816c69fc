"""paged_attention (ours) vs FlashInfer's BatchDecodeWithPagedKVCacheWrapper, eager torch on CUDA.

Both are called eagerly from PyTorch on CUDA tensors, on torch's current stream: ours as
the torch operator of :data:`~xla_kernels.kernels.paged_attention.paged_attention`
(``torch.ops.xla_kernels.paged_attention``, vLLM cache layout), FlashInfer's wrapper with
the same caches in its ``"NHD"`` layout (the same memory layout), planned once per config,
with ``use_tensor_cores`` False and True. Every sequence is at full context; the page table
is one random permutation of the cache's blocks, the same for both (a CSR ``indptr`` /
``indices`` / ``last_page_len`` for FlashInfer). Configs whose KV is smaller than 3x the
50 MB L2 get several caches (and queries) that successive calls rotate over.

Timing: CUDA events around ``CALLS`` back-to-back calls after a warm-up, the median of
``REPEATS`` windows. Before each window a ``torch.cuda._sleep`` keeps the GPU busy for
longer than the host takes to queue the calls, so the events time the device work and not
the host's dispatch (``*_host_us`` is that dispatch, per call, for reference).

Before timing, each config checks that both agree: the max abs difference of their outputs
(and of each against a float32 reference over the first few sequences). fp8 caches are
checked with ``k_scale``/``v_scale`` 0.5/0.25 and timed with 1.0 (vLLM's default for an
uncalibrated cache; FlashInfer applies a ``v_scale`` other than 1.0 as an extra multiply).
For fp8 configs our bf16 kernel is timed on the same (unquantized) data as well: the issue's
goal is fp8 >= 1.8x our bf16 where the bf16 KV read is >= 256 MiB.

FlashInfer (0.7.2) compiles its kernels on first use (JIT, nvcc + ninja): the script builds
the variants it needs in parallel child processes while it builds ours, and records the
build times; a variant whose build fails or times out is reported and skipped. On the
GPU machine it runs from two wheels installed with ``pip install --no-deps``
(``flashinfer-python==0.7.2.post1``, ``apache-tvm-ffi==0.1.15.post2``); to fit the device
tool's 64 MiB carry, the FlashInfer wheel is repacked without the ``flashinfer/data``
sources that neither decode, sampling nor the fused MoE builds
(``scripts/repack_flashinfer_wheel.py``: 62 → 32 MB), into the git-ignored ``.whl-fi/``
that ``scripts/gpu/common.sh`` installs from.

Writes ``flashinfer_decode.json`` and ``flashinfer_decode.md`` to ``--out`` after every
config. Without a GPU (or with ``--smoke``) it runs two tiny configs (on the CPU: ours only,
timed with ``time.perf_counter``), which checks the script itself.

Example:
    $ python benchmarks/flashinfer_decode.py --out benchmarks/results/latest/h100
    $ python benchmarks/flashinfer_decode.py --out /tmp/fi --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.machinery
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from xla_kernels.bench import copy_bandwidth_gbs, device_description
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.paged_attention import paged_attention

BLOCK = 16
HEAD_DIM = 128
CALLS = 50                 # back-to-back calls inside one pair of CUDA events
REPEATS = 7                # timed windows; the median is kept
WARMUP = 5
L2_BYTES = 50e6            # H100 L2: inputs rotate over at least 3x this
MAX_SETS = 16
CHECK_SEQS = 4             # sequences checked against the float32 reference
FP8_CHECK_SCALES = (0.5, 0.25)
FP8_GOAL = 1.8             # fp8 / bf16 speedup of ours wanted ...
FP8_GOAL_BYTES = 256 << 20  # ... where the bf16 KV read is at least this
AGREE_REL = 2e-2           # max abs diff / max |reference| below this counts as agreeing
WORKSPACE_BYTES = 128 << 20
OPTIONAL_FI_MODULES = ("requests", "tqdm", "pynvml")
"""Imported by ``import flashinfer`` but unused on the decode path: stubbed when missing
(the GPU machine installs FlashInfer with ``--no-deps``)."""

FP8 = torch.float8_e4m3fn
KV_DTYPES = {"bf16": torch.bfloat16, "fp8": FP8}


def matrix(quick: bool, smoke: bool) -> list[dict[str, Any]]:
    """The configurations: (num_seqs, context, q heads, kv heads, KV cache dtype)."""
    if smoke:
        rows = [(2, 256, 8, 2, "bf16"), (2, 256, 8, 2, "fp8")]
    elif quick:
        rows = [(32, 2048, 32, 8, "bf16"), (1, 32768, 32, 8, "bf16"), (4, 2048, 32, 8, "bf16"),
                (32, 2048, 32, 8, "fp8"), (128, 2048, 32, 8, "fp8")]
    else:
        rows = [(32, 2048, 32, 8, "bf16"), (8, 8192, 32, 8, "bf16"), (1, 32768, 32, 8, "bf16"),
                (128, 1024, 32, 8, "bf16"), (16, 2048, 32, 32, "bf16"), (4, 2048, 32, 8, "bf16"),
                (32, 2048, 32, 8, "fp8"), (4, 8192, 32, 8, "fp8"), (128, 2048, 32, 8, "fp8"),
                (32, 8192, 32, 8, "fp8")]
    return [dict(name=f"{s}x{c} {hq}/{hkv} {kv}", num_seqs=s, context=c, num_q_heads=hq,
                 num_kv_heads=hkv, head_dim=HEAD_DIM, kv_dtype=kv)
            for s, c, hq, hkv, kv in rows]


def kv_bytes(cfg: dict[str, Any], kv_dtype: str) -> int:
    """Bytes of K and V one call reads."""
    itemsize = 1 if kv_dtype == "fp8" else 2
    return 2 * itemsize * cfg["num_seqs"] * cfg["context"] * cfg["num_kv_heads"] * cfg["head_dim"]


def error_text(e: BaseException) -> str:
    """``Type: first line`` of an exception, for the result files."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


# ------------------------------------------------------------------------ FlashInfer setup

def import_flashinfer() -> tuple[Any, dict[str, Any]]:
    """``(flashinfer, info)``, or ``(None, info)`` with the import error in ``info``."""
    info: dict[str, Any] = {"stubbed_modules": []}
    for name in OPTIONAL_FI_MODULES:
        if importlib.util.find_spec(name) is None:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = stub
            info["stubbed_modules"].append(name)
    try:
        import flashinfer
    except Exception as e:
        info["error"] = error_text(e)
        return None, info
    info["version"] = getattr(flashinfer, "__version__", "?")
    return flashinfer, info


def fi_toolchain() -> dict[str, Any]:
    """Make ``ninja`` and ``nvcc`` findable for FlashInfer's JIT (a ``--target`` pip
    install leaves ninja's binary in ``<target>/bin``); returns what was found."""
    if shutil.which("ninja") is None:
        candidates = [Path(p) / "bin" for p in sys.path if p]
        try:
            import ninja

            candidates.insert(0, Path(ninja.BIN_DIR))
        except (ImportError, AttributeError):
            pass
        for folder in candidates:
            if (folder / "ninja").is_file():
                os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
                break
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        try:
            from xla_kernels.builder import find_nvcc

            os.environ["CUDA_HOME"] = str(find_nvcc().resolve().parent.parent)
        except Exception:
            pass
    return {"ninja": shutil.which("ninja"), "nvcc": shutil.which("nvcc"),
            "CUDA_HOME": os.environ.get("CUDA_HOME")}


def fi_wrapper(fi: Any, workspace: torch.Tensor, tensor_cores: bool, tables: dict[str, Any],
               cfg: dict[str, Any], kv_dtype: torch.dtype, scale: float) -> Any:
    """A planned ``BatchDecodeWithPagedKVCacheWrapper`` for one config."""
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                    use_tensor_cores=tensor_cores)
    wrapper.plan(tables["indptr"], tables["indices"], tables["last_page_len"],
                 cfg["num_q_heads"], cfg["num_kv_heads"], cfg["head_dim"], BLOCK,
                 q_data_type=torch.bfloat16, kv_data_type=kv_dtype, sm_scale=scale)
    return wrapper


def prebuild_child(kv: str, tensor_cores: bool) -> int:
    """Child process: compile (or load) one FlashInfer variant with a tiny call. Its last
    output line is JSON: the seconds it took, or the error; returns the exit code."""
    start = time.perf_counter()
    try:
        fi, info = import_flashinfer()
        if fi is None:
            raise RuntimeError(info["error"])
        cfg = dict(num_seqs=2, context=4 * BLOCK, num_q_heads=32, num_kv_heads=8,
                   head_dim=HEAD_DIM)
        data = make_data(cfg, torch.device("cuda"), sets=1)
        if kv == "fp8":
            data.update(quantized(data))
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        wrapper = fi_wrapper(fi, workspace, tensor_cores, data, cfg, KV_DTYPES[kv], 0.1)
        wrapper.run(data["q"][0], (data["k"][0], data["v"][0]))
        torch.cuda.synchronize()
    except Exception as e:
        traceback.print_exc()
        detail = [ln.strip()[:200] for ln in str(e).splitlines() if "error" in ln.lower()]
        print(json.dumps({"error": error_text(e), "detail": detail[:5]}), flush=True)
        return 1
    print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
    return 0


def start_prebuilds(kinds: set[str], out: Path) -> dict[str, Any]:
    """Start one child per FlashInfer variant (kv dtype x tensor cores); each writes its
    log to ``out``. Their ninja jobs share the cores."""
    jobs = max(2, (os.cpu_count() or 8) // (2 * len(kinds)))
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", str(jobs)))
    procs: dict[str, Any] = {}
    for kv in sorted(kinds):
        for tc in (False, True):
            name = f"{kv}_tc{int(tc)}"
            log = out / f"flashinfer_build_{name}.log"
            with log.open("w") as f:
                procs[name] = (subprocess.Popen(
                    [sys.executable, __file__, "--fi-prebuild", kv, str(int(tc))],
                    stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True), log,
                    time.perf_counter())
    return procs


def wait_prebuilds(procs: dict[str, Any], timeout: float) -> dict[str, dict[str, Any]]:
    """Wait for the build children (killing those past ``timeout`` s from their start)."""
    results: dict[str, dict[str, Any]] = {}
    for name, (proc, log, started) in procs.items():
        try:
            proc.wait(timeout=max(1.0, started + timeout - time.perf_counter()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            results[name] = {"ok": False, "error": f"build timed out after {timeout:.0f} s",
                             "log": log.name}
            continue
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        try:
            report = json.loads(lines[-1])
        except (IndexError, ValueError):
            report = {"error": f"exit {proc.returncode}: {lines[-1][:300] if lines else ''}"}
        results[name] = {"ok": proc.returncode == 0 and "error" not in report, **report,
                         "log": log.name}
    return results


# ------------------------------------------------------------------------ data and oracle

def make_data(cfg: dict[str, Any], device: torch.device, sets: int) -> dict[str, Any]:
    """bf16 caches and queries (``sets`` of each) and the shared page table, on ``device``."""
    s, ctx, hq, hkv, d = (cfg[k] for k in ("num_seqs", "context", "num_q_heads",
                                            "num_kv_heads", "head_dim"))
    pages = ctx // BLOCK
    nblocks = s * pages
    gen = torch.Generator().manual_seed(ctx + 7 * s + hkv)
    perm = torch.randperm(nblocks, generator=gen, dtype=torch.int64).to(torch.int32)
    torch.manual_seed(s * 1000 + ctx)

    def cache() -> torch.Tensor:
        return torch.randn((nblocks, BLOCK, hkv, d), dtype=torch.bfloat16, device=device)

    return {
        "k": [cache() for _ in range(sets)], "v": [cache() for _ in range(sets)],
        "q": [torch.randn((s, hq, d), dtype=torch.bfloat16, device=device) for _ in range(sets)],
        "block_tables": perm.view(s, pages).to(device),
        "seq_lens": torch.full((s,), ctx, dtype=torch.int32, device=device),
        "indptr": (torch.arange(s + 1, dtype=torch.int32) * pages).to(device),
        "indices": perm.to(device),
        "last_page_len": torch.full((s,), BLOCK, dtype=torch.int32, device=device),
    }


def quantized(data: dict[str, Any]) -> dict[str, Any]:
    """The caches of ``data`` cast to fp8 e4m3fn (the stored values; scales are attrs)."""
    return {"k": [c.to(FP8) for c in data["k"]], "v": [c.to(FP8) for c in data["v"]]}


def gather_blocks(cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``cache[ids]`` as float32 (through a byte view: fp8 indexing is not everywhere)."""
    return cache.view(torch.uint8)[ids.long()].view(cache.dtype).float()


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
              ctx: int, scale: float, k_scale: float, v_scale: float) -> torch.Tensor:
    """float32 decode attention of the first ``CHECK_SEQS`` sequences: [seqs, q_heads, d]."""
    _, hq, d = q.shape
    hkv = k.shape[2]
    outs = []
    for j in range(min(CHECK_SEQS, q.shape[0])):
        kj = gather_blocks(k, table[j]).reshape(-1, hkv, d)[:ctx] * k_scale
        vj = gather_blocks(v, table[j]).reshape(-1, hkv, d)[:ctx] * v_scale
        qj = q[j].float().view(hkv, hq // hkv, d)
        p = (torch.einsum("hgd,thd->hgt", qj, kj) * scale).softmax(-1)
        outs.append(torch.einsum("hgt,thd->hgd", p, vj).reshape(hq, d))
    return torch.stack(outs)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    n = min(a.shape[0], b.shape[0])
    return float((a[:n].float() - b[:n].float()).abs().max())


# ------------------------------------------------------------------------ timing

def _sleep_for(seconds: float) -> None:
    """Keep the GPU busy for at least ``seconds`` (SM clock <= 2 GHz)."""
    torch.cuda._sleep(int(seconds * 2e9))


def time_calls(call: Callable[[int], Any], device: torch.device) -> dict[str, float]:
    """Median ms per call of ``CALLS`` back-to-back ``call(i)`` (CUDA events on the GPU,
    ``perf_counter`` on the CPU), and the host's µs per call to issue them."""
    for i in range(WARMUP):
        call(i)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(CALLS):
        call(i)
    host = (time.perf_counter() - start) / CALLS
    if not cuda:
        samples = [host]
        for _ in range(REPEATS - 1):
            start = time.perf_counter()
            for i in range(CALLS):
                call(i)
            samples.append((time.perf_counter() - start) / CALLS)
        return {"ms": statistics.median(samples) * 1e3, "host_us": host * 1e6}
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(REPEATS):
        _sleep_for(1.5 * host * CALLS + 1e-3)
        begin.record()
        for i in range(CALLS):
            call(i)
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / CALLS)
    return {"ms": statistics.median(samples), "host_us": host * 1e6}


# ------------------------------------------------------------------------ one config

def measure(cfg: dict[str, Any], device: torch.device, op: Any, fi: Any,
            workspaces: dict[bool, torch.Tensor], fi_ok: dict[str, bool],
            copy_gbs: float) -> dict[str, Any]:
    """Check, then time, ours and FlashInfer (each tensor-core setting) on one config."""
    kv = cfg["kv_dtype"]
    nbytes = kv_bytes(cfg, kv)
    sets = max(1, min(MAX_SETS, math.ceil(3 * L2_BYTES / nbytes)))
    row: dict[str, Any] = {**cfg, "kv_bytes": nbytes, "sets": sets}
    scale = cfg["head_dim"] ** -0.5
    ctx = cfg["context"]
    data = make_data(cfg, device, sets)
    bt, lens = data["block_tables"], data["seq_lens"]

    def run(name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:
            row[f"{name}_error"] = error_text(e)
            traceback.print_exc(limit=3)

    def ours_call(**attrs: float) -> Callable[[int], Any]:
        return lambda i: op(data["q"][i % sets], data["k"][i % sets], data["v"][i % sets],
                            bt, lens, scale=scale, **attrs)

    def timed(name: str, call: Callable[[int], Any], nbytes_read: int) -> None:
        t = time_calls(call, device)
        row[f"{name}_ms"], row[f"{name}_host_us"] = t["ms"], t["host_us"]
        row[f"{name}_gbs"] = nbytes_read / (t["ms"] * 1e-3) / 1e9
        row[f"{name}_fraction_of_copy"] = row[f"{name}_gbs"] / copy_gbs

    outs: dict[str, torch.Tensor] = {}
    check_attrs: dict[str, float] = {}
    if kv == "fp8":
        # Our bf16 kernel on the unquantized data first; then fp8 caches replace them.
        row["bf16_kv_bytes"] = kv_bytes(cfg, "bf16")
        run("ours_bf16", lambda: timed("ours_bf16", ours_call(), row["bf16_kv_bytes"]))
        data.update(quantized(data))
        check_attrs = dict(zip(("k_scale", "v_scale"), FP8_CHECK_SCALES, strict=True))

    def ref() -> None:
        outs["ref"] = reference(data["q"][0], data["k"][0], data["v"][0], bt, ctx, scale,
                                check_attrs.get("k_scale", 1.0), check_attrs.get("v_scale", 1.0))

    run("reference", ref)
    run("ours_check", lambda: outs.__setitem__("ours", ours_call(**check_attrs)(0)))
    run("ours", lambda: timed("ours", ours_call(), nbytes))

    if fi is not None:
        for tc in (False, True):
            name = f"fi_tc{int(tc)}"
            if not fi_ok.get(f"{kv}_tc{int(tc)}"):
                row[f"{name}_error"] = "skipped: its FlashInfer build failed (see builds)"
                continue

            def flashinfer(tc: bool = tc, name: str = name) -> None:
                wrapper = fi_wrapper(fi, workspaces[tc], tc, data, cfg, KV_DTYPES[kv], scale)
                pair = [(data["k"][j], data["v"][j]) for j in range(sets)]
                outs[name] = wrapper.run(data["q"][0], pair[0], **check_attrs)
                timed(name, lambda i: wrapper.run(data["q"][i % sets], pair[i % sets]), nbytes)

            run(name, flashinfer)
        best = [n for n in ("fi_tc0", "fi_tc1") if f"{n}_ms" in row]
        if best:
            pick = min(best, key=lambda n: row[f"{n}_ms"])
            row["fi_best"] = pick
            for key in ("ms", "gbs", "fraction_of_copy"):
                row[f"fi_best_{key}"] = row[f"{pick}_{key}"]
            if "ours_ms" in row:
                row["ratio_fi_over_ours"] = row["fi_best_ms"] / row["ours_ms"]
    if "ours_ms" in row and "ours_bf16_ms" in row:
        row["fp8_speedup"] = row["ours_bf16_ms"] / row["ours_ms"]
        row["fp8_goal_applies"] = row["bf16_kv_bytes"] >= FP8_GOAL_BYTES
        row["fp8_goal_met"] = row["fp8_speedup"] >= FP8_GOAL
    add_diffs(row, outs)
    return row


def add_diffs(row: dict[str, Any], outs: dict[str, torch.Tensor]) -> None:
    """Max abs differences between the outputs (against the reference: its first
    sequences), and whether each implementation agrees with the reference."""
    ref = outs.get("ref")
    if ref is not None:
        row["ref_max_abs"] = float(ref.abs().max())
    for name in ("ours", "fi_tc0", "fi_tc1"):
        if name not in outs:
            continue
        if ref is not None:
            diff = max_abs_diff(outs[name], ref)
            row[f"diff_{name}_vs_ref"] = diff
            row[f"{name}_agrees"] = diff <= AGREE_REL * max(row["ref_max_abs"], 1e-6)
        if name != "ours" and "ours" in outs:
            row[f"diff_ours_vs_{name}"] = max_abs_diff(outs["ours"], outs[name])


# ------------------------------------------------------------------------ reporting

def fmt(x: Any, spec: str = ".4f", suffix: str = "") -> str:
    return "—" if x is None else format(x, spec) + suffix


def markdown(result: dict[str, Any]) -> str:
    """The short report: header (device, versions, date, method), table, notes."""
    copy = result["copy_gbs"]
    cuda = result["torch_device"].startswith("cuda")
    fi = result["flashinfer"]
    fi_text = (f"FlashInfer {fi['version']}" if "version" in fi
               else f"FlashInfer not run: {fi.get('error', 'not attempted')}")
    lines = [
        f"# paged_attention vs FlashInfer decode — {result['device']}, {result['date']}",
        "",
        f"torch {result['torch']}, jax {result['jax']}, python {result['python']}, {fi_text}. "
        f"Copy bandwidth ({'torch memcpy' if cuda else 'jitted JAX negation'}, read + write): "
        f"{copy:.0f} GB/s.",
        "",
        ("Method: eager torch calls on CUDA tensors, one stream; CUDA events around "
         f"{CALLS} back-to-back calls after warm-up (GPU kept busy while the host queues "
         "them)" if cuda else f"Method: eager torch calls on CPU tensors, {CALLS} calls "
         "timed with time.perf_counter") + f", median of {REPEATS}. head_dim {HEAD_DIM}, "
        f"block {BLOCK}, bf16 queries, every "
        "sequence at full context, one random block permutation shared by both; caches "
        "rotate past the L2. 'FI/ours' is FlashInfer's best time over ours (below 1: "
        "FlashInfer is faster). 'diff' is the max abs difference of the two outputs (fp8: "
        f"both with k/v scales {FP8_CHECK_SCALES}; fp8 timed with scales 1.0).",
        "",
        *([] if "version" in fi else [f"**FlashInfer was not run** ({fi.get('error')}): its "
                                      "columns are empty.", ""]),
        "| config | KV MB | ours ms | FI tc=F ms | FI tc=T ms | FI/ours | ours GB/s | FI GB/s "
        "| ours % copy | FI % copy | diff | ours bf16 ms | fp8 speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        diffs = [r[k] for k in ("diff_ours_vs_fi_tc0", "diff_ours_vs_fi_tc1") if k in r]
        speed = r.get("fp8_speedup")
        goal = ""
        if speed is not None and r.get("fp8_goal_applies"):
            goal = " ✓" if r["fp8_goal_met"] else f" ✗ (< {FP8_GOAL}x)"
        lines.append(
            f"| {r['name']} | {r['kv_bytes'] / 1e6:.1f} | {fmt(r.get('ours_ms'))} | "
            f"{fmt(r.get('fi_tc0_ms'))} | {fmt(r.get('fi_tc1_ms'))} | "
            f"{fmt(r.get('ratio_fi_over_ours'), '.2f', 'x')} | {fmt(r.get('ours_gbs'), '.0f')} | "
            f"{fmt(r.get('fi_best_gbs'), '.0f')} | "
            f"{pct(r.get('ours_fraction_of_copy'))} | {pct(r.get('fi_best_fraction_of_copy'))} | "
            f"{fmt(max(diffs) if diffs else None, '.1e')} | {fmt(r.get('ours_bf16_ms'))} | "
            f"{fmt(speed, '.2f', 'x')}{goal} |")
    builds = result.get("flashinfer_builds") or {}
    if builds:
        lines += ["", "FlashInfer JIT builds (parallel, while ours built): " + "; ".join(
            f"{k} {'ok' if v['ok'] else 'FAILED'} {fmt(v.get('seconds'), '.0f', ' s')}"
            + ("" if v["ok"] else f" ({v['error']})") for k, v in builds.items())]
    if result.get("ours_build_s") is not None:
        lines += ["", f"Our first calls (build or load of the kernels): "
                      f"{result['ours_build_s']:.0f} s."]
    notes = []
    for r in result["rows"]:
        notes += [f"- {r['name']}: {k[:-6]}: {v}" for k, v in r.items() if k.endswith("_error")]
        notes += [f"- {r['name']}: {k[:-7]} differs from the float32 reference by "
                  f"{r[f'diff_{k[:-7]}_vs_ref']:.2e} (max |ref| {r['ref_max_abs']:.2e})"
                  for k, v in r.items() if k.endswith("_agrees") and not v]
    if notes:
        lines += ["", "Errors and disagreements:", *notes]
    return "\n".join(lines) + "\n"


def pct(fraction: float | None) -> str:
    return fmt(None if fraction is None else fraction * 100, ".0f")


def write(result: dict[str, Any], out: Path, began: float) -> None:
    """Both result files, as they stand (called after every config)."""
    result["seconds"] = time.perf_counter() - began
    (out / "flashinfer_decode.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "flashinfer_decode.md").write_text(markdown(result))


def summary(row: dict[str, Any]) -> str:
    """One line per finished config."""
    parts = [f"{row['name']:<22s} ours {fmt(row.get('ours_ms'))} ms"]
    for n in ("fi_tc0", "fi_tc1"):
        parts.append(f"{n} {fmt(row.get(f'{n}_ms'))} ms")
    parts.append(f"FI/ours {fmt(row.get('ratio_fi_over_ours'), '.2f', 'x')}")
    if "fp8_speedup" in row:
        parts.append(f"ours bf16 {fmt(row.get('ours_bf16_ms'))} ms, fp8 speedup "
                     f"{row['fp8_speedup']:.2f}x")
    diffs = [f"{k[5:]}={row[k]:.1e}" for k in row if k.startswith("diff_") and
             isinstance(row[k], float)]
    errors = [k[:-6] for k in row if k.endswith("_error")]
    return ", ".join(parts) + (f"; diffs {' '.join(diffs)}" if diffs else "") + (
        f"; ERRORS in {', '.join(errors)}" if errors else "")


# ------------------------------------------------------------------------ main

def header(device: torch.device) -> dict[str, Any]:
    """Device, versions, date and the method's constants, for the result files."""
    try:
        desc: dict[str, Any] = device_description()
    except Exception as e:
        desc = {"device_description_error": error_text(e)}
    if device.type == "cuda":
        desc["device"] = torch.cuda.get_device_name()
    return {"device": "cpu", "jax": "?", "python": sys.version.split()[0], **desc,
            "torch": torch.__version__, "torch_device": str(device),
            "date": datetime.date.today().isoformat(), "calls": CALLS, "repeats": REPEATS,
            "block_size": BLOCK, "head_dim": HEAD_DIM, "fp8_check_scales": list(FP8_CHECK_SCALES),
            "copy_gbs": None, "rows": []}


def first_calls(op: Any, configs: list[dict[str, Any]], device: torch.device,
                result: dict[str, Any]) -> None:
    """Our op once per KV dtype on a tiny input: builds (or loads) our kernels."""
    start = time.perf_counter()
    for kv in sorted({c["kv_dtype"] for c in configs}):
        cfg = next(c for c in configs if c["kv_dtype"] == kv)
        try:
            data = make_data({**cfg, "num_seqs": 2, "context": 4 * BLOCK}, device, sets=1)
            if kv == "fp8":
                data.update(quantized(data))
            op(data["q"][0], data["k"][0], data["v"][0], data["block_tables"],
               data["seq_lens"], scale=0.1)
        except Exception as e:
            result[f"ours_first_call_{kv}_error"] = error_text(e)
            traceback.print_exc(limit=3)
    if device.type == "cuda":
        torch.cuda.synchronize()
    result["ours_build_s"] = time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    parser.add_argument("--quick", action="store_true", help="5 of the 10 configs")
    parser.add_argument("--smoke", action="store_true",
                        help="two tiny configs (the default without a GPU): checks the script")
    parser.add_argument("--fi-build-timeout", type=float, default=360.0,
                        help="seconds allowed for FlashInfer's JIT builds")
    parser.add_argument("--fi-prebuild", nargs=2, metavar=("KV", "TC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    # JAX (device_description) must not take most of the GPU's memory from torch.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.fi_prebuild:
        sys.exit(prebuild_child(args.fi_prebuild[0], args.fi_prebuild[1] == "1"))

    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    configs = matrix(args.quick, args.smoke or device.type == "cpu")
    result = header(device)
    fi = None
    if device.type == "cuda":
        result["toolchain"] = fi_toolchain()
        fi, result["flashinfer"] = import_flashinfer()
    else:
        result["flashinfer"] = {"error": "no CUDA device: ours only, on the CPU"}
    procs = start_prebuilds({c["kv_dtype"] for c in configs}, args.out) if fi else {}

    op = torch_op(paged_attention)
    first_calls(op, configs, device, result)  # overlaps FlashInfer's builds
    result["copy_gbs"] = copy_bandwidth_gbs(1 << 30 if device.type == "cuda" else 1 << 24)
    print(f"copy bandwidth {result['copy_gbs']:.0f} GB/s; our first calls "
          f"{result['ours_build_s']:.0f} s", flush=True)
    write(result, args.out, began)
    result["flashinfer_builds"] = wait_prebuilds(procs, args.fi_build_timeout)
    for name, b in result["flashinfer_builds"].items():
        print(f"FlashInfer build {name}: {'ok' if b['ok'] else 'FAILED'} "
              f"{fmt(b.get('seconds'), '.0f', ' s')} {b.get('error', '')}", flush=True)
    fi_ok = {name: b["ok"] for name, b in result["flashinfer_builds"].items()}
    workspaces = ({tc: torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
                   for tc in (False, True)} if fi else {})

    for cfg in configs:
        try:
            row = measure(cfg, device, op, fi, workspaces, fi_ok, result["copy_gbs"])
        except Exception as e:
            row = {**cfg, "kv_bytes": kv_bytes(cfg, cfg["kv_dtype"]), "config_error": error_text(e)}
            traceback.print_exc(limit=3)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        write(result, args.out, began)
        print(summary(row), flush=True)
    print(markdown(result))
    print(f"wrote {args.out}/flashinfer_decode.{{json,md}} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
