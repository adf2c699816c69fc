"""sample (ours) vs FlashInfer's sampling kernels, eager torch on CUDA, vocabulary 128256.

Both run eagerly from PyTorch on CUDA tensors, on torch's current stream: ours as the torch
operator of :data:`~xla_kernels.kernels.sampling.sample` (``torch.ops.xla_kernels.sample``),
FlashInfer's ``flashinfer.sampling`` functions with per-request tensors. Settings:

* ``k50_p0.9``: top_k 50 then top_p 0.9 (ours also takes temperature 1.0 and min_p 0; its
  kernel scales by the temperature either way). FlashInfer:
  ``top_k_top_p_sampling_from_logits`` (its default ``filter_apply_order="top_k_first"``,
  the order ours applies) with per-request tensors ("FI logits"), the same with ``top_k`` a
  Python int ("FI logits, k int": FlashInfer 0.7.2 then takes its fast path, a radix top-k
  then top-p over the k survivors, for k <= 256 and vocabularies >= 65536; one k for the
  whole batch), and ``top_k_top_p_sampling_from_probs`` on probabilities computed beforehand
  ("FI probs"; the softmax is not timed: FlashInfer's sampling alone).
* ``plain``: temperature 1.0, no filter. FlashInfer: ``sampling_from_logits``.

Rows of logits are ``N(0, 2^2)`` draws, batch 1, 16, 64 and 256, f32 and bf16 (FlashInfer's
functions are called with the logits as they are; a dtype they refuse is reported). Each
variant's tokens are checked: under k50_p0.9 every token must be among its row's 50 largest
logits.

Timing: CUDA events around ``CALLS`` back-to-back calls after a warm-up, the median of
``REPEATS`` windows; before each window ``torch.cuda._sleep`` keeps the GPU busy while the
host queues the calls (as benchmarks/flashinfer_decode.py does). One set of inputs per
config: a batch-1 row (0.5 MB in f32) stays in the 50 MB L2 across calls, batch 256 (131 MB)
does not.

FlashInfer compiles its sampling kernels on first use (JIT); that build is timed and
reported. On the GPU machine it runs from the wheels in ``.whl-fi/`` (see
benchmarks/flashinfer_decode.py); its sampling sources must be in the repacked wheel.

Writes ``sampling.json`` and ``sampling.md`` to ``--out`` (default
``benchmarks/results/latest/<card>/``) after every config. Without a GPU (or with
``--smoke``) it runs ours on two tiny configs on the CPU, which checks the script.

Example:
    $ python benchmarks/sampling.py
    $ python benchmarks/sampling.py --out /tmp/sampling --smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from flashinfer_decode import error_text, fi_toolchain, import_flashinfer, time_calls

from xla_kernels.bench import copy_bandwidth_gbs, device_description
from xla_kernels.frontends.torch import torch_op
from xla_kernels.kernels.sampling import sample

VOCAB = 128256
BATCHES = (1, 16, 64, 256)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
SETTINGS = {"k50_p0.9": dict(top_k=50, top_p=0.9), "plain": dict(top_k=0, top_p=1.0)}
TOP_K_CHECK = 50
FI_VARIANTS = {"k50_p0.9": ("fi_logits", "fi_logits_k_int", "fi_probs"),
               "plain": ("fi_logits",)}
FI_NAMES = ("fi_logits", "fi_logits_k_int", "fi_probs")
REPO = Path(__file__).resolve().parent.parent


def card_name() -> str:
    """``h100``/``h200`` from torch's device name, else the name in lower case."""
    name = torch.cuda.get_device_name().lower() if torch.cuda.is_available() else "cpu"
    for card in ("h100", "h200", "b200", "a100"):
        if card in name:
            return card
    return name.replace(" ", "_")


def inputs(batch: int, vocab: int, dtype: torch.dtype, setting: dict[str, Any],
           device: torch.device) -> dict[str, torch.Tensor]:
    """Logits and the per-row tensors ours and FlashInfer take."""
    gen = torch.Generator(device=device).manual_seed(batch * 7 + vocab)
    logits = (torch.randn((batch, vocab), generator=gen, device=device) * 2).to(dtype)
    i32 = dict(dtype=torch.int32, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    return {
        "logits": logits,
        "temperature": torch.ones(batch, **f32),
        "top_k": torch.full((batch,), setting["top_k"], **i32),
        "top_p": torch.full((batch,), setting["top_p"], **f32),
        "min_p": torch.zeros(batch, **f32),
        "seeds": torch.arange(batch, **i32),
        "offsets": torch.zeros(batch, **i32),
    }


def ours_call(op: Any, x: dict[str, torch.Tensor]) -> Callable[[int], torch.Tensor]:
    return lambda i: op(x["logits"], x["temperature"], x["top_k"], x["top_p"], x["min_p"],
                        x["seeds"], x["offsets"])


def fi_call(fi: Any, variant: str, setting: str, x: dict[str, torch.Tensor]
            ) -> Callable[[int], torch.Tensor]:
    sampling = fi.sampling
    if setting == "plain":
        return lambda i: sampling.sampling_from_logits(x["logits"])
    top_k = x["top_k"].clone()
    top_k[top_k <= 0] = x["logits"].shape[-1]
    if variant == "fi_logits":
        return lambda i: sampling.top_k_top_p_sampling_from_logits(x["logits"], top_k,
                                                                   x["top_p"])
    if variant == "fi_logits_k_int":
        k = int(top_k[0])
        return lambda i: sampling.top_k_top_p_sampling_from_logits(x["logits"], k, x["top_p"])
    probs = torch.softmax(x["logits"].float(), dim=-1)
    return lambda i: sampling.top_k_top_p_sampling_from_probs(probs, top_k, x["top_p"])


def in_top_k(tokens: torch.Tensor, logits: torch.Tensor, k: int) -> bool:
    """Whether each row's token is among its row's k largest logits."""
    top = torch.topk(logits.float(), k, dim=-1).indices
    return bool((top == tokens.long().view(-1, 1)).any(dim=-1).all())


def measure(cfg: dict[str, Any], device: torch.device, op: Any, fi: Any,
            skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check, then time, ours and FlashInfer's variants on one config."""
    row: dict[str, Any] = dict(cfg)
    x = inputs(cfg["batch"], cfg["vocab"], DTYPES[cfg["dtype"]], SETTINGS[cfg["setting"]],
               device)
    row["logits_bytes"] = x["logits"].numel() * x["logits"].element_size()
    variants = {"ours": ours_call(op, x)}
    if fi is not None:
        for name in (n for n in FI_VARIANTS[cfg["setting"]] if n not in skip):
            try:
                variants[name] = fi_call(fi, name, cfg["setting"], x)
            except Exception as e:
                row[f"{name}_error"] = error_text(e)
    for name, call in variants.items():
        try:
            tokens = call(0)
            if cfg["setting"] == "k50_p0.9":
                row[f"{name}_tokens_in_top_k"] = in_top_k(tokens, x["logits"], TOP_K_CHECK)
            t = time_calls(call, device)
            row[f"{name}_us"], row[f"{name}_host_us"] = t["ms"] * 1e3, t["host_us"]
            row[f"{name}_gbs"] = row["logits_bytes"] / (t["ms"] * 1e-3) / 1e9
        except Exception as e:
            row[f"{name}_error"] = error_text(e)
            traceback.print_exc(limit=3)
    for name in ("fi_logits", "fi_logits_k_int"):
        if f"{name}_us" in row and "ours_us" in row:
            row[f"{name}_over_ours"] = row[f"{name}_us"] / row["ours_us"]
    return row


def fmt(x: Any, spec: str = ".1f", suffix: str = "") -> str:
    return "—" if x is None else format(x, spec) + suffix


def markdown(result: dict[str, Any]) -> str:
    fi = result["flashinfer"]
    fi_text = (f"FlashInfer {fi['version']}" if "version" in fi
               else f"FlashInfer not run: {fi.get('error', 'not attempted')}")
    lines = [
        f"# sample vs FlashInfer sampling — {result['device']}, {result['date']}",
        "",
        f"torch {result['torch']}, jax {result['jax']}, {fi_text}. Copy bandwidth (read + "
        f"write): {fmt(result['copy_gbs'], '.0f')} GB/s.",
        "",
        f"Method: eager torch calls on CUDA tensors, one stream; CUDA events around "
        f"{result['calls']} back-to-back calls after warm-up (GPU kept busy while the host "
        f"queues them), median of {result['repeats']}. Vocabulary {VOCAB}, logits N(0, 4), "
        "per-row tensors. k50_p0.9: top-k 50 then top-p 0.9 (FI logits: "
        "top_k_top_p_sampling_from_logits with per-request tensors; FI k int: the same with "
        "top_k a Python int, FlashInfer's fast path; FI probs: "
        "top_k_top_p_sampling_from_probs on probabilities computed before timing). plain: "
        "temperature 1, no filter (FI: sampling_from_logits). 'FI/ours': FlashInfer's time "
        "over ours (above 1: ours is faster). GB/s: logits bytes read once per call over the "
        "time.",
        "",
        "| setting | dtype | batch | ours µs | FI logits µs | FI k int µs | FI probs µs | "
        "FI/ours | FI k int/ours | ours GB/s | in top-50 (ours/FI/FI k int) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        check = "/".join(str(r.get(f"{n}_tokens_in_top_k", "—"))
                         for n in ("ours", "fi_logits", "fi_logits_k_int"))
        lines.append(
            f"| {r['setting']} | {r['dtype']} | {r['batch']} | {fmt(r.get('ours_us'))} | "
            f"{fmt(r.get('fi_logits_us'))} | {fmt(r.get('fi_logits_k_int_us'))} | "
            f"{fmt(r.get('fi_probs_us'))} | {fmt(r.get('fi_logits_over_ours'), '.2f', 'x')} | "
            f"{fmt(r.get('fi_logits_k_int_over_ours'), '.2f', 'x')} | "
            f"{fmt(r.get('ours_gbs'), '.0f')} | {check} |")
    if result.get("fi_build_s") is not None:
        lines += ["", f"FlashInfer's first calls (JIT build or load): {result['fi_build_s']:.0f} s."
                  f" Ours: {fmt(result.get('ours_build_s'), '.0f')} s."]
    if result.get("fi_skipped"):
        lines += ["", f"FlashInfer variants not run (--skip-fi): "
                      f"{', '.join(result['fi_skipped'])}."]
    notes = [f"- {r['setting']} {r['dtype']} batch {r['batch']}: {k[:-6]}: {v}"
             for r in result["rows"] for k, v in r.items() if k.endswith("_error")]
    if notes:
        lines += ["", "Errors:", *notes]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out: Path, began: float) -> None:
    result["seconds"] = time.perf_counter() - began
    (out / "sampling.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "sampling.md").write_text(markdown(result))


def first_calls(op: Any, fi: Any, device: torch.device, result: dict[str, Any],
                skip: tuple[str, ...] = ()) -> None:
    """Build or load ours, then FlashInfer's variants, on tiny inputs (timed apart)."""
    start = time.perf_counter()
    x = inputs(2, 1000, torch.float32, SETTINGS["k50_p0.9"], device)
    ours_call(op, x)(0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    result["ours_build_s"] = time.perf_counter() - start
    if fi is None:
        return
    start = time.perf_counter()
    for setting, names in FI_VARIANTS.items():
        for name in names:
            if name in skip:
                continue
            try:
                fi_call(fi, name, setting, inputs(2, 65536, torch.float32, SETTINGS[setting],
                                                  device))(0)
            except Exception as e:
                result.setdefault("fi_first_call_errors", {})[f"{setting} {name}"] = error_text(e)
                traceback.print_exc(limit=3)
    torch.cuda.synchronize()
    result["fi_build_s"] = time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default benchmarks/results/latest/<card>)")
    parser.add_argument("--smoke", action="store_true",
                        help="two tiny configs, ours only (the default without a GPU)")
    parser.add_argument("--skip-fi", nargs="*", default=[], choices=FI_NAMES,
                        help="FlashInfer variants not run (fi_logits_k_int's JIT module, "
                             "topk, did not finish building in 9 minutes on a 16-core H200 "
                             "host)")
    args = parser.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    began = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or device.type == "cpu"
    out = args.out or REPO / "benchmarks" / "results" / "latest" / card_name()
    out.mkdir(parents=True, exist_ok=True)
    try:
        desc: dict[str, Any] = device_description()
    except Exception as e:
        desc = {"device_description_error": error_text(e)}
    if device.type == "cuda":
        desc["device"] = torch.cuda.get_device_name()
    result: dict[str, Any] = {
        "device": "cpu", "jax": "?", **desc, "python": sys.version.split()[0],
        "torch": torch.__version__, "date": datetime.date.today().isoformat(),
        "calls": 50, "repeats": 7, "vocab": VOCAB, "copy_gbs": None, "rows": []}
    fi = None
    if device.type == "cuda" and not args.smoke:
        result["toolchain"] = fi_toolchain()
        fi, result["flashinfer"] = import_flashinfer()
    else:
        result["flashinfer"] = {"error": "smoke run: ours only"}
    op = torch_op(sample)
    skip = tuple(args.skip_fi)
    result["fi_skipped"] = list(skip)
    first_calls(op, fi, device, result, skip)
    result["copy_gbs"] = copy_bandwidth_gbs(1 << 30 if device.type == "cuda" else 1 << 24)
    configs = ([dict(setting="k50_p0.9", dtype="f32", batch=2, vocab=4096),
                dict(setting="plain", dtype="bf16", batch=2, vocab=4096)] if smoke else
               [dict(setting=s, dtype=d, batch=b, vocab=VOCAB)
                for s in SETTINGS for d in DTYPES for b in BATCHES])
    for cfg in configs:
        try:
            row = measure(cfg, device, op, fi, skip)
        except Exception as e:
            row = {**cfg, "config_error": error_text(e)}
            traceback.print_exc(limit=3)
        result["rows"].append(row)
        write(result, out, began)
        print(f"{cfg['setting']:>9s} {cfg['dtype']:>4s} batch {cfg['batch']:>3d}: ours "
              f"{fmt(row.get('ours_us'))} us, FI logits {fmt(row.get('fi_logits_us'))} us, "
              f"FI k int {fmt(row.get('fi_logits_k_int_us'))} us, "
              f"FI probs {fmt(row.get('fi_probs_us'))} us", flush=True)
    print(markdown(result))
    print(f"wrote {out}/sampling.{{json,md}} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
