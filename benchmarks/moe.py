"""fused_moe against the plain-JAX MoE layers, at Mixtral-8x7B's and Qwen3-30B-A3B's expert
sizes, one layer, in one process on one GPU.

For each model (Mixtral: 8 experts, top 2, hidden 4096, intermediate 14336; Qwen3: 128
experts, top 8, hidden 2048, intermediate 768), weights (bf16, or fp8 e4m3 with 128x128 block
scales, DeepSeek-style) and token count (1, 16, 64, 256 decode; 4096, 16384 prefill), with
random normal router logits:

* ``ours``: :func:`~xla_kernels.kernels.moe.fused_moe` / ``fused_moe_fp8``;
* ``ragged_dot``: :func:`~xla_kernels.kernels.moe.fused_moe_ragged_dot` (sort, gather, two
  ``jax.lax.ragged_dot`` grouped GEMMs, scatter-add; fp8 dequantized first) on vLLM's
  [experts, out, in] weights, which XLA transposes on every call (Nsight Compute:
  docs/kernels/moe.md);
* ``ragged_dot_in_out``: the same MoE on weights transposed once beforehand to [experts, in,
  out] (``weights_in_out=True``), the layout ``ragged_dot`` takes without a transpose;
* ``loop``: :func:`~xla_kernels.kernels.moe.fused_moe_xla`, the plain-XLA loop over experts
  (every expert over every token, masked by the routing);
* ``tokamax`` (opt-in): the ragged_dot MoE with ``tokamax.ragged_dot_general`` for the two
  grouped GEMMs, on weights transposed once beforehand to [experts, in, out] (tokamax's
  kernels transpose [experts, out, in] weights on every call). Its Mosaic GPU kernel
  (``implementation="mosaic"``, the sm_90 one on H100/H200) is tried first, then its Triton
  one; the row records which ran (``tokamax_impl``). tokamax imports qwix, which imports
  flax, and no flax release (0.12.8 and earlier) imports under jax 0.11: where ``import
  qwix`` fails, a stand-in module (a ``QArray`` class nothing is an instance of) takes its
  place, which the unquantized kernels never touch (the row's ``tokamax_qwix`` says so).
  fp8 weights are dequantized first, as for ``ragged_dot``;
* ``flashinfer`` (opt-in): ``flashinfer.fused_moe.cutlass_fused_moe`` (0.7.2, TensorRT-LLM's
  CUTLASS MoE) on torch views of the same weights, gate and up halves of w13 swapped (its
  SwiGLU takes up first); fp8 with ``use_deepseek_fp8_block_scale`` (128x128 weight block
  scales, activations quantized per 1x128 inside). Timed with CUDA events like
  ``benchmarks/flashinfer_decode.py`` (its helpers); its JIT build (220 generated CUTLASS
  kernel files for sm_90) can take many minutes: ``flashinfer_first_s`` is the first call's
  seconds, build included on the first row.

The peers that take a routing (tokamax's and the ragged_dot MoE route themselves the same
way; FlashInfer takes topk ids and weights) all get
:func:`~xla_kernels.kernels.moe.route_xla`'s: softmax over the experts, top k, renormalized.

Each time is the median of windows of back-to-back jitted calls
(:func:`xla_kernels.bench.budgeted_seconds`). A call that fails (out of memory, say) is
recorded with its error and the run goes on. The roofline columns: ``routed GB`` is the bytes
of the weights of the experts the routing actually hit (each read once), ``bw %`` that over
the time as a share of the card's HBM bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s), ``tc %``
the routed FLOPs (2 * tokens * top_k * 3 * hidden * intermediate) per second as a share of
989 TF/s dense bf16. ``err`` is ours against ragged_dot (relative norm); ``err <peer>`` the
same for tokamax and flashinfer.

Writes ``moe.json`` and ``moe.md`` to ``--out``, again after every row.

Example:
    $ python benchmarks/moe.py --out benchmarks/results/latest/h100
    $ python benchmarks/moe.py --out /tmp/r --models qwen3 --tokens 1 16 --weights bf16
    $ python benchmarks/moe.py --out /tmp/r --prebuild-flashinfer   # its JIT build, once
    $ python benchmarks/moe.py --out /tmp/r --peers ours ragged_dot tokamax flashinfer
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels.bench import budgeted_seconds, device_description
from xla_kernels.kernels.moe import (
    fused_moe,
    fused_moe_fp8,
    fused_moe_ragged_dot,
    fused_moe_xla,
    route_xla,
)

MODELS = {  # experts, top_k, hidden, intermediate
    "mixtral": (8, 2, 4096, 14336),
    "qwen3": (128, 8, 2048, 768),
    "tiny": (8, 2, 256, 128),  # a smoke test of the script (runs on the CPU)
}
TOKENS = (1, 16, 64, 256, 4096, 16384)
BLOCK = (128, 128)
PEAK_TFLOPS = 989.0
PEERS = ("ours", "ragged_dot", "ragged_dot_in_out", "loop", "tokamax", "flashinfer")
DEFAULT_PEERS = ("ours", "ragged_dot", "ragged_dot_in_out", "loop")
TOKAMAX_IMPLEMENTATIONS = ("mosaic", "triton")  # tried in this order
CHECKED = ("ragged_dot_in_out", "tokamax", "flashinfer")  # outputs also checked vs ragged_dot


def error_text(e: BaseException) -> str:
    """``Type: first line`` of an exception, for the result files."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def hbm_tbs(device_kind: str) -> float | None:
    """The card's HBM bandwidth (TB/s) from its name, None if unknown."""
    kind = device_kind.upper()
    if "H200" in kind:
        return 4.8
    if "H100" in kind:
        return 2.0 if "PCIE" in kind else 3.35
    return None


def quantize_blocks(w: Any, block: tuple[int, int]) -> tuple[Any, Any]:
    """(e4m3 weights, f32 scales [experts, rows / bn, cols / bk]) on the device: each block's
    largest magnitude maps to 448. Dimensions must be multiples of the block."""
    e, rows, cols = w.shape
    bn, bk = block
    blocks = w.astype(jnp.float32).reshape(e, rows // bn, bn, cols // bk, bk)
    scale = jnp.maximum(jnp.abs(blocks).max(axis=(2, 4)), 1e-12) / 448.0
    q = (blocks / scale[:, :, None, :, None]).astype(jnp.float8_e4m3fn)
    return q.reshape(e, rows, cols), scale


def weights(model: str, fp8: bool) -> dict[str, Any]:
    experts, _, hidden, inter = MODELS[model]
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    w13 = jax.random.normal(k1, (experts, 2 * inter, hidden), jnp.bfloat16) / hidden ** 0.5
    w2 = jax.random.normal(k2, (experts, hidden, inter), jnp.bfloat16) * (2 / inter ** 0.5)
    if not fp8:
        return {"w13": w13, "w2": w2}
    q13, s13 = quantize_blocks(w13, BLOCK)
    q2, s2 = quantize_blocks(w2, BLOCK)
    return {"w13": q13, "w2": q2, "w13_scale": s13, "w2_scale": s2}


def layer(peer: str, fp8: bool, top_k: int,
          ragged_dot_general: Callable[..., Any] | None = None) -> Any:
    """The jitted layer of one implementation: (hidden, router_logits, *weights) -> out. The
    weights are arguments, not closed-over constants (they must not be baked into the
    program). ``ragged_dot_general`` (tokamax's): the ragged_dot MoE with that grouped GEMM,
    on weights in the [experts, in, out] layout of :func:`transposed`."""
    if peer == "ours":
        if fp8:
            return jax.jit(lambda x, r, a, b, sa, sb: fused_moe_fp8(
                x, r, a, b, sa, sb, top_k=top_k, block_shape=BLOCK))
        return jax.jit(lambda x, r, a, b: fused_moe(x, r, a, b, top_k=top_k))
    fn, block = fused_moe_ragged_dot if peer == "ragged_dot" else fused_moe_xla, BLOCK
    if peer == "ragged_dot_in_out":
        fn, block = partial(fused_moe_ragged_dot, weights_in_out=True), BLOCK[::-1]
    if ragged_dot_general is not None:
        fn = partial(fused_moe_ragged_dot, ragged_dot_general=ragged_dot_general,
                     weights_in_out=True)
        block = BLOCK[::-1]
    if fp8:
        return jax.jit(lambda x, r, a, b, sa, sb: fn(x, r, a, b, top_k=top_k, w13_scale=sa,
                                                     w2_scale=sb, block_shape=block))
    return jax.jit(lambda x, r, a, b: fn(x, r, a, b, top_k=top_k))


def transposed(w: dict[str, Any]) -> dict[str, Any]:
    """The weights (and block scales) as [experts, in, out]."""
    return {k: jnp.swapaxes(v, 1, 2) for k, v in w.items()}


# ------------------------------------------------------------------------ tokamax

def qwix_stand_in() -> types.ModuleType:
    """A module in qwix's place with what tokamax's unquantized paths touch: ``QArray`` (for
    ``isinstance`` checks and annotations; nothing is one) and ``quantize``/``dequantize``
    (which refuse)."""
    qwix = types.ModuleType("qwix")

    class QArray:
        """Stand-in: no array is a qwix QArray here."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("qwix stand-in: quantized tokamax paths are not available")

    qwix.QArray, qwix.quantize, qwix.dequantize = QArray, refuse, refuse
    return qwix


def import_tokamax() -> tuple[Any, dict[str, Any]]:
    """``(tokamax, info)``, or ``(None, info)`` with the import error in ``info``; where qwix
    does not import, :func:`qwix_stand_in` takes its place (``info["qwix"]`` says why)."""
    info: dict[str, Any] = {}
    try:
        import qwix  # noqa: F401
        info["qwix"] = "qwix"
    except Exception as e:
        for name in [m for m in sys.modules if m.split(".")[0] in ("qwix", "flax")]:
            del sys.modules[name]
        sys.modules["qwix"] = qwix_stand_in()
        info["qwix"] = f"stand-in ({error_text(e)})"
    try:
        import tokamax
        from absl import flags

        # tokamax's options are absl flags, parsed from sys.argv on first use: give them
        # only the program name (this script's arguments are argparse's).
        if not flags.FLAGS.is_parsed():
            flags.FLAGS(sys.argv[:1])
    except Exception as e:
        info["error"] = error_text(e)
        return None, info
    info["version"] = getattr(tokamax, "__version__", "?")
    return tokamax, info


def run_tokamax(tokamax: Any, fp8: bool, top_k: int, args: tuple, budget: float,
                row: dict[str, Any]) -> Any:
    """Time the tokamax layer with the first of :data:`TOKAMAX_IMPLEMENTATIONS` that runs;
    returns its output. Raises the errors of all if none does."""
    errors = []
    for impl in TOKAMAX_IMPLEMENTATIONS:
        fn = layer("tokamax", fp8, top_k,
                   partial(tokamax.ragged_dot_general, implementation=impl))
        try:
            out = np.asarray(fn(*args), np.float32)
        except Exception as e:
            errors.append(f"{impl}: {error_text(e)}")
            continue
        row["tokamax_ms"] = 1e3 * budgeted_seconds(fn, args, budget)
        row["tokamax_impl"] = impl
        if errors:
            row["tokamax_impl_errors"] = "; ".join(errors)
        return out
    raise RuntimeError("; ".join(errors))


# ------------------------------------------------------------------------ FlashInfer

def flashinfer_setup() -> dict[str, Any]:
    """FlashInfer's ``cutlass_fused_moe`` (``info["fn"]``) and torch, or ``info["error"]``."""
    info: dict[str, Any] = {}
    try:
        import torch
        from flashinfer_decode import fi_toolchain, import_flashinfer

        info["toolchain"] = fi_toolchain()
        if not torch.cuda.is_available():
            info["error"] = "needs a CUDA device"
            return info
        fi, fi_info = import_flashinfer()
        info.update(fi_info)
        if fi is not None:
            from flashinfer.fused_moe import cutlass_fused_moe

            info["fn"], info["torch"] = cutlass_fused_moe, torch
    except Exception as e:
        info["error"] = error_text(e)
    return info


def prebuild_flashinfer(out: Path) -> int:
    """Build (or load from FlashInfer's cache) the ``cutlass_fused_moe`` module of this GPU
    and write its seconds or error to ``out/flashinfer_build.json``; for a build longer
    than one device call, started in the background (``nohup``) ahead of the benchmark."""
    info = flashinfer_setup()
    start = time.perf_counter()
    if "error" not in info:
        try:
            from flashinfer.fused_moe.core import get_cutlass_fused_moe_module

            major, minor = info["torch"].cuda.get_device_capability()
            get_cutlass_fused_moe_module(f"{major * 10 + minor}")
        except Exception as e:
            info["error"] = error_text(e)
    info["seconds"] = time.perf_counter() - start
    info = {k: v for k, v in info.items() if k not in ("fn", "torch")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "flashinfer_build.json").write_text(json.dumps(info, indent=1, default=str))
    print(json.dumps(info, default=str))
    return 1 if "error" in info else 0


def to_torch(a: Any, torch: Any) -> Any:
    """A torch view of a jax array on the GPU (fp8 through its bytes)."""
    if a.dtype == jnp.float8_e4m3fn:
        return torch.from_dlpack(jax.lax.bitcast_convert_type(a, jnp.uint8)).view(
            torch.float8_e4m3fn)
    return torch.from_dlpack(a)


def flashinfer_weights(w: dict[str, Any], inter: int, torch: Any) -> dict[str, Any]:
    """The weights as torch tensors for ``cutlass_fused_moe``: w13's gate and up halves (and
    their block scales') swapped, as its SwiGLU takes ``[up, gate]``."""
    def up_gate(a: Any, half: int) -> Any:
        return jnp.concatenate([a[:, half:], a[:, :half]], axis=1)

    out = {"w13": to_torch(up_gate(w["w13"], inter), torch), "w2": to_torch(w["w2"], torch)}
    if "w13_scale" in w:
        out["scales"] = [to_torch(up_gate(w["w13_scale"], inter // BLOCK[0]), torch),
                         to_torch(w["w2_scale"], torch)]
    return out


def run_flashinfer(fi: dict[str, Any], fw: dict[str, Any], x: Any, logits: Any, top_k: int,
                   row: dict[str, Any]) -> Any:
    """Time ``cutlass_fused_moe`` on ``fw`` (:func:`flashinfer_weights`) with route_xla's
    topk ids and weights; returns its output."""
    if "error" in fi:
        raise RuntimeError(fi["error"])
    from flashinfer_decode import time_calls

    torch, fn = fi["torch"], fi["fn"]
    ids, weights = route_xla(logits, top_k)
    xt, idt, wt = (to_torch(a, torch) for a in (x, ids.astype(jnp.int32),
                                                 weights.astype(jnp.float32)))
    extra = ({"use_deepseek_fp8_block_scale": True} if "scales" in fw else {})

    out = torch.empty_like(xt)

    def call(i: int) -> Any:
        return fn(xt, idt, wt, fw["w13"], fw["w2"], torch.bfloat16,
                  quant_scales=fw.get("scales", []), output=out, **extra)

    start = time.perf_counter()
    call(0)  # returns [output, ...] (0.7.2), output being ``out``
    if xt.is_cuda:
        torch.cuda.synchronize()
    row["flashinfer_first_s"] = time.perf_counter() - start
    row["flashinfer_ms"] = time_calls(call, xt.device)["ms"]
    return out.float().cpu().numpy()


def measure(model: str, tokens: int, w: dict[str, Any], peers: tuple[str, ...],
            budget: float, bw_tbs: float | None, extras: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """One row. ``extras``: what :func:`prepare` made for the opt-in peers."""
    experts, top_k, hidden, inter = MODELS[model]
    extras = extras or {}
    fp8 = "w13_scale" in w
    kx, kr = jax.random.split(jax.random.PRNGKey(tokens))
    x = jax.random.normal(kx, (tokens, hidden), jnp.bfloat16)
    logits = jax.random.normal(kr, (tokens, experts), jnp.float32)
    hit = int(np.unique(np.asarray(route_xla(logits, top_k)[0])).size)
    per_weight = 1 + 4 / (BLOCK[0] * BLOCK[1]) if fp8 else 2
    routed_bytes = hit * 3 * hidden * inter * per_weight
    flops = 2 * tokens * top_k * 3 * hidden * inter
    row: dict[str, Any] = {"model": model, "weights": "fp8 128x128" if fp8 else "bf16",
                           "tokens": tokens, "experts_hit": hit,
                           "routed_gb": routed_bytes / 1e9, "tflop": flops / 1e12}
    outs = {}
    names = ("w13", "w2", "w13_scale", "w2_scale")
    args = (x, logits, *(w[k] for k in names if k in w))
    for peer in peers:
        try:
            if peer == "tokamax":
                tk = extras["tokamax"]
                if tk.get("module") is None:
                    raise RuntimeError(tk.get("error", "not imported"))
                wt = tk["weights"]
                outs[peer] = run_tokamax(tk["module"], fp8, top_k,
                                         (x, logits, *(wt[k] for k in names if k in wt)),
                                         budget, row)
            elif peer == "flashinfer":
                fi = extras["flashinfer"]
                outs[peer] = run_flashinfer(fi, fi.get("weights", {}), x, logits, top_k, row)
            else:
                fn = layer(peer, fp8, top_k)
                call_args = args
                if peer == "ragged_dot_in_out":
                    wt = extras["in_out_weights"]
                    call_args = (x, logits, *(wt[k] for k in names if k in wt))
                outs[peer] = np.asarray(fn(*call_args), np.float32)
                row[f"{peer}_ms"] = 1e3 * budgeted_seconds(fn, call_args, budget)
        except Exception as e:  # recorded (out of memory, an unsupported lowering)
            row[f"{peer}_ms"] = None
            row[f"{peer}_error"] = error_text(e)
    ours = row.get("ours_ms")
    if ours:
        seconds = ours / 1e3
        row["ours_bw_pct"] = (100 * routed_bytes / seconds / (bw_tbs * 1e12)
                              if bw_tbs else None)
        row["ours_tc_pct"] = 100 * flops / seconds / (PEAK_TFLOPS * 1e12)
        for peer in peers[1:]:
            if row.get(f"{peer}_ms"):
                row[f"speedup_vs_{peer}"] = row[f"{peer}_ms"] / ours
    if "ragged_dot" in outs:
        ref = outs["ragged_dot"]
        for peer in ("ours", *CHECKED):
            if peer in outs:
                key = "err_vs_ragged_dot" if peer == "ours" else f"{peer}_err_vs_ragged_dot"
                row[key] = float(np.linalg.norm(outs[peer] - ref)
                                 / max(np.linalg.norm(ref), 1e-30))
    print(json.dumps(row), flush=True)
    return row


def prepare(peers: tuple[str, ...], model: str, w: dict[str, Any],
            setups: dict[str, Any]) -> dict[str, Any]:
    """Per weight set, what the peers beyond ours, ragged_dot and loop need: the weights
    transposed once (ragged_dot_in_out, tokamax), FlashInfer's torch tensors (``setups``:
    the modules, imported once per run)."""
    extras: dict[str, Any] = {}
    if "ragged_dot_in_out" in peers or "tokamax" in peers:
        extras["in_out_weights"] = transposed(w)  # one copy for both peers
    if "tokamax" in peers:
        extras["tokamax"] = dict(setups["tokamax"])
        if extras["tokamax"].get("module") is not None:
            extras["tokamax"]["weights"] = extras["in_out_weights"]
    if "flashinfer" in peers:
        fi = dict(setups["flashinfer"])
        if "error" not in fi:
            try:
                fi["weights"] = flashinfer_weights(w, MODELS[model][3], fi["torch"])
            except Exception as e:
                fi["error"] = error_text(e)
        extras["flashinfer"] = fi
    return extras


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(rows: list[dict[str, Any]], device: dict[str, str], peers: tuple[str, ...],
             notes: tuple[str, ...] = ()) -> str:
    head = " | ".join(f"{p} ms" for p in peers)
    speed = " | ".join(f"x vs {p}" for p in peers[1:])
    checked = [p for p in CHECKED if p in peers]
    errs = "".join(f" | err {p}" for p in checked)
    lines = [f"# fused_moe vs plain-JAX MoE layers ({device.get('device', '?')})", "",
             "One layer's experts; times in ms (median of windows of back-to-back jitted "
             "calls). bw % = routed weight bytes / time / HBM bandwidth; tc % = routed FLOPs "
             f"/ time / {PEAK_TFLOPS:.0f} TF/s; x = peer time / ours; err = ours vs "
             "ragged_dot (err <peer>: that peer vs ragged_dot).", "",
             f"| model | weights | tokens | experts hit | routed GB | {head} | {speed} | "
             f"bw % | tc % | err{errs} |",
             "|" + "---|" * (7 + 2 * len(peers) + len(checked))]
    for r in rows:
        times = " | ".join(fmt(r.get(f"{p}_ms"), ".4f") for p in peers)
        ratios = " | ".join(fmt(r.get(f"speedup_vs_{p}"), ".1f") for p in peers[1:])
        peer_errs = "".join(f" | {fmt(r.get(f'{p}_err_vs_ragged_dot'), '.1e')}"
                            for p in checked)
        lines.append(f"| {r['model']} | {r['weights']} | {r['tokens']} | {r['experts_hit']} | "
                     f"{r['routed_gb']:.3f} | {times} | {ratios} | "
                     f"{fmt(r.get('ours_bw_pct'), '.1f')} | {fmt(r.get('ours_tc_pct'), '.1f')} | "
                     f"{fmt(r.get('err_vs_ragged_dot'), '.1e')}{peer_errs} |")
    if notes:
        lines += ["", *notes]
    errors = [(r, p) for r in rows for p in peers if r.get(f"{p}_error")]
    if errors:
        lines += ["", "Calls that failed:", ""]
        lines += [f"- {r['model']} {r['weights']} {r['tokens']} tokens, {p}: "
                  f"{r[f'{p}_error']}" for r, p in errors]
    return "\n".join(lines) + "\n"


def peer_notes(rows: list[dict[str, Any]], setups: dict[str, Any]) -> tuple[str, ...]:
    """Lines on the opt-in peers: versions, tokamax's implementation, FlashInfer's build."""
    notes = []
    if "tokamax" in setups:
        tk = setups["tokamax"]
        impls = sorted({r["tokamax_impl"] for r in rows if r.get("tokamax_impl")})
        notes.append(f"tokamax {tk.get('version', '-')}, implementation "
                     f"{'/'.join(impls) or '-'}, qwix: {tk.get('qwix', '-')}")
    if "flashinfer" in setups:
        fi = setups["flashinfer"]
        first = [r["flashinfer_first_s"] for r in rows if r.get("flashinfer_first_s")]
        notes.append(f"flashinfer {fi.get('version', '-')} cutlass_fused_moe; first call "
                     f"(JIT build included) {fmt(first[0] if first else None, '.1f')} s")
    return tuple(notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["mixtral", "qwen3"],
                        choices=list(MODELS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--weights", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    parser.add_argument("--peers", nargs="+", default=list(DEFAULT_PEERS), choices=list(PEERS),
                        help="tokamax and flashinfer are opt-in (ours always runs)")
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per timing")
    parser.add_argument("--prebuild-flashinfer", action="store_true",
                        help="only build FlashInfer's fused MoE module (JIT) and exit")
    args = parser.parse_args()
    if args.prebuild_flashinfer:
        sys.exit(prebuild_flashinfer(args.out))
    peers = tuple(["ours"] + [p for p in args.peers if p != "ours"])
    device = device_description()
    bw = hbm_tbs(device["device"])
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    setups: dict[str, Any] = {}
    if "tokamax" in peers:
        module, info = import_tokamax()
        setups["tokamax"] = {**info, "module": module}
    if "flashinfer" in peers:
        setups["flashinfer"] = flashinfer_setup()

    def write() -> None:  # after every row: a run cut short keeps what it measured
        peer_info = {name: {k: v for k, v in info.items()
                            if k not in ("module", "fn", "torch")}
                     for name, info in setups.items()}
        result = {"device": device, "hbm_tbs": bw, "peak_tflops": PEAK_TFLOPS, "rows": rows,
                  "peers": peer_info, "seconds": time.perf_counter() - start}
        (args.out / "moe.json").write_text(json.dumps(result, indent=1, default=str))
        (args.out / "moe.md").write_text(markdown(rows, device, peers,
                                                  peer_notes(rows, setups)))

    for model in args.models:
        for kind in args.weights:
            w = weights(model, kind == "fp8")
            extras = prepare(peers, model, w, setups)
            for t in args.tokens:
                rows.append(measure(model, t, w, peers, args.budget, bw, extras))
                write()
            del w, extras
    print(markdown(rows, device, peers, peer_notes(rows, setups)))

if __name__ == "__main__":
    main()
