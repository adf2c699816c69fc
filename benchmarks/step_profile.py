"""Per-kernel profile of serve-bench's decode step: where the step's device time goes, how
close each GEMM comes to the copy bandwidth, the launch gaps, and what XLA fuses.

For issue "decode step at the HBM roofline", item 1.

Method: the model (seeded random weights), the runner and the decode batch are made the
way ``xla-kernels serve-bench`` makes them (``serving.bench.make_runner`` and
``decode_batch``: ``--batch`` sequences of ``--context`` tokens on disjoint blocks, the
step compiled for the bucket holding them). The prepared batch is replayed back to back
(``serving.bench.replay_ms``, untraced: ``step_ms``), then once more under
``torch.profiler`` with the CUDA activity (CUPTI records XLA's kernels in this process too;
``decode_trace.record``). From the trace, per step:

- every kernel: calls, total µs, share of the step's busy time, and its category
  (attention, kv_cache_write, rms_norm, sampling, fp8_linear: our custom calls; gemm:
  cuBLAS / cuBLASLt / CUTLASS / XLA's Triton GEMM fusions; xla_fusion; memcpy/memset;
  other);
- busy time (the union of kernel, memset and copy intervals: ``vllm_throughput.busy_us``)
  against the wall span; gaps = span - busy, split into the gaps inside one graph launch
  (kernels sharing a CUPTI correlation id: one command buffer) and those between launches;
- the projections: the GEMMs (and fp8_linear calls) of the step in order, each labelled
  with the projection whose weight it reads, from XLA's optimized HLO of the step (its
  dots and fp8_linear calls in schedule order, the weight operand's shape, and whether
  it comes before or after the layer's attention); per projection: weight bytes, median
  µs over layers and steps, achieved GB/s and its share of a measured device copy
  bandwidth (``xla_kernels.bench.copy_bandwidth_gbs``, read + write, measured in the same
  run). If the HLO's count does not match the trace's, the GEMMs are reported per kernel
  name and one layer's kernel sequence is printed instead.

The optimized HLO (``runner.lower(batch).compile().as_text()``) goes to
``OUT/step_hlo_<preset>_<batch>x<context>.txt.gz``, with counts of its fusions by kind and
by the set of ops they fuse (e.g. whether SiLU * up lands in a GEMM fusion or a loop
fusion), and of its custom calls.

Writes ``OUT/step_profile_<preset>_<batch>x<context>.json`` and ``.md`` (printed). On a
machine without a GPU, no kernels are recorded: the script says so and still writes the
JSON with the HLO's counts.

Example (on the GPU machine):
    $ python benchmarks/step_profile.py --out OUT --preset 1b
    $ python benchmarks/step_profile.py --out OUT --preset 8b --batch 256 --context 512
    $ python benchmarks/step_profile.py --out OUT --preset 8b --weights fp8
    $ python benchmarks/step_profile.py --out /tmp/sp --preset tiny     # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from decode_trace import record  # benchmarks/ is the script's folder, first on sys.path
from vllm_throughput import busy_us

from xla_kernels.serving.backend import resolve_backend, resolve_frontend
from xla_kernels.serving.bench import decode_batch, make_runner, replay_ms
from xla_kernels.serving.config import (
    ATTENTIONS,
    FRONTENDS,
    WEIGHT_FORMATS,
    EngineConfig,
    ModelConfig,
    preset_entry,
)

CATEGORIES = (  # (category, substrings of the kernel name), first match wins
    ("attention", ("ragged_paged_attention", "paged_attention", "ragged_", "decode_prep_kernel",
                   "decode_tables_kernel")),
    ("kv_cache_write", ("kv_cache", "CopyRowsKernel", "QuantizeRowsKernel")),
    ("rms_norm", ("rms_norm",)),
    ("fp8_linear", ("fp8_linear", "Fp8LinearKernel")),
    ("sampling", ("xla_kernels::sampling", "SampleKernel")),
    ("gemm", ("nvjet", "xmma", "cutlass", "gemm", "gemv", "splitKreduce", "cublas")),
    ("memcpy/memset", ("Memcpy", "Memset", "memcpy", "memset")),
    ("xla_fusion", ("fusion", "wrapped_", "loop_", "input_")),
)
GEMM_AUX = ("splitKreduce", "reduce_kernel")
"""GEMM kernels that finish the GEMM launched just before them (cuBLAS's split-K reduce):
their time is added to that GEMM's."""
PROJECTION_CATEGORIES = ("gemm", "fp8_linear")


def category(name: str, cat: str = "kernel") -> str:
    """The category of a kernel (``cat``: the trace event's category).

    Example:
        >>> category("nvjet_tst_64x8_64x16_4x1_v_bz_TNT"), category("loop_add_fusion_3")
        ('gemm', 'xla_fusion')
        >>> category("void xla_kernels::kv_cache::(anonymous namespace)::CopyRowsKernel<4>()")
        'kv_cache_write'
        >>> category("Memset (Device)", "gpu_memset"), category("cub::DeviceScan")
        ('memcpy/memset', 'other')
    """
    if cat in ("gpu_memset", "gpu_memcpy"):
        return "memcpy/memset"
    for label, keys in CATEGORIES:
        if any(k in name for k in keys):
            return label
    return "other"


# --- the model, the runner and the batch, as serve-bench makes them -------------------------

def engine_config(entry: Any, batch: int, context: int) -> EngineConfig:
    """The preset's engine limits widened to ``batch`` sequences of ``context`` tokens, every
    sequence on its own blocks (the decode batch of ``decode_batch``)."""
    blocks = math.ceil(context / entry.block_size)
    budget = max(entry.token_budget, batch)
    return EngineConfig(block_size=entry.block_size, num_blocks=batch * blocks,
                        max_num_seqs=batch, max_model_len=context, token_budget=budget,
                        min_bucket=min(16, budget))


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Model, weights, runner and the prepared decode batch (on JAX's first device)."""
    import jax

    from xla_kernels.serving.options import check_memory
    from xla_kernels.serving.weights import init_weights

    entry = preset_entry(args.preset)
    model = entry.model.with_weights(args.weights)
    engine = engine_config(entry, args.batch, args.context)
    device = jax.devices()[0]
    check_memory(model, engine, 1, device)
    with jax.default_device(device):
        weights = init_weights(model, args.seed)
        runner = make_runner(resolve_frontend(args.frontend), model, weights, engine,
                             resolve_backend(model, args.attention))
    batch = decode_batch(engine, args.batch, args.context)
    return {"model": model, "engine": engine, "weights": weights, "runner": runner,
            "batch": batch, "prepared": runner.prepare(batch), "device": device}


# --- the trace ------------------------------------------------------------------------------

def traced_steps(runner: Any, prepared: Any, calls: int) -> tuple[list[dict], int]:
    """Device events of the prepared step replayed back to back, and the number of steps
    they hold (``replay_ms`` makes one call before its ``calls``); no events without a
    CUDA device (torch.profiler then has no activity to record)."""
    import torch

    if not torch.cuda.is_available():
        return [], calls + 1
    events = record(lambda: replay_ms(lambda: runner.launch(prepared), calls, repeats=1,
                                      sync=runner.fetch))
    return events, calls + 1


def split_steps(events: list[dict], steps: int) -> list[list[dict]] | None:
    """``events`` (kernels, by start) cut into ``steps`` equal runs, or None when they do
    not divide evenly or the steps' kernel sequences differ.

    Example:
        >>> ev = [{"name": n, "ts": i} for i, n in enumerate("abab")]
        >>> [[e["name"] for e in s] for s in split_steps(ev, 2)], split_steps(ev[:3], 2)
        ([['a', 'b'], ['a', 'b']], None)
    """
    if not events or len(events) % steps:
        return None
    per = len(events) // steps
    runs = [events[i * per:(i + 1) * per] for i in range(steps)]
    names = [e["name"] for e in runs[0]]
    return runs if all([e["name"] for e in r] == names for r in runs) else None


def kernel_table(events: list[dict], steps: int) -> list[dict[str, Any]]:
    """Per kernel name: category, calls and µs per step, share of the step's busy time;
    largest first."""
    busy = sum(busy_us(events).values()) / steps
    totals: dict[str, list[float]] = {}
    for e in events:
        totals.setdefault(e["name"], []).append(float(e["dur"]))
    rows = [{"name": name, "category": category(name, _cat(events, name)),
             "calls_per_step": round(len(durs) / steps, 3),
             "us_per_step": round(sum(durs) / steps, 3),
             "share_of_busy": round(sum(durs) / steps / busy, 4) if busy else None}
            for name, durs in totals.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def _cat(events: list[dict], name: str) -> str:
    return next(e.get("cat", "kernel") for e in events if e["name"] == name)


def category_table(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kernel table summed by category, largest first.

    Example:
        >>> category_table([{"category": "gemm", "calls_per_step": 2, "us_per_step": 5.0,
        ...                  "share_of_busy": 0.5}])[0]["us_per_step"]
        5.0
    """
    by: dict[str, dict[str, Any]] = {}
    for k in kernels:
        row = by.setdefault(k["category"], {"category": k["category"], "kernels": 0,
                                            "calls_per_step": 0.0, "us_per_step": 0.0,
                                            "share_of_busy": 0.0})
        row["kernels"] += 1
        for key in ("calls_per_step", "us_per_step", "share_of_busy"):
            row[key] = round(row[key] + (k[key] or 0), 4)
    return sorted(by.values(), key=lambda r: -r["us_per_step"])


def timeline(events: list[dict], steps: int) -> dict[str, Any]:
    """Busy time, wall span and gaps per step (µs); the gaps inside one graph launch
    (consecutive events of one CUPTI correlation id) apart from those between launches.

    Example:
        >>> ev = [{"ts": 0, "dur": 2, "args": {"correlation": 1}},
        ...       {"ts": 3, "dur": 2, "args": {"correlation": 1}},
        ...       {"ts": 9, "dur": 1, "args": {"correlation": 2}}]
        >>> t = timeline(ev, 1)
        >>> t["busy_us"], t["span_us"], t["gaps_inside_launches_us"], t["launches"]
        (5.0, 10.0, 1.0, 2.0)
    """
    busy = sum(busy_us(events).values())
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    inside = between = 0.0
    reach = float("-inf")
    last_corr = None
    for e in events:
        corr = e.get("args", {}).get("correlation")
        gap = max(0.0, e["ts"] - reach) if reach > float("-inf") else 0.0
        if corr is not None and corr == last_corr:
            inside += gap
        else:
            between += gap
        reach, last_corr = max(reach, e["ts"] + e["dur"]), corr
    launches = len({e.get("args", {}).get("correlation") for e in events})
    per = {"busy_us": busy, "span_us": span, "gaps_us": span - busy,
           "gaps_inside_launches_us": inside, "gaps_between_launches_us": between,
           "launches": launches, "events": len(events)}
    out = {k: round(v / steps, 3) for k, v in per.items()}
    out["busy_share_of_span"] = round(busy / span, 4) if span else None
    return out


def projection_calls(step: list[dict]) -> list[dict[str, Any]]:
    """The GEMM and fp8_linear kernels of one step in order, a split-K reduce folded into
    the GEMM before it: [{"name", "us"}].

    Example:
        >>> projection_calls([{"name": "nvjet_a", "dur": 3}, {"name": "splitKreduce_k",
        ...                    "dur": 1}, {"name": "loop_add_fusion", "dur": 9}])
        [{'name': 'nvjet_a', 'us': 4.0}]
    """
    calls: list[dict[str, Any]] = []
    for e in step:
        if category(e["name"], e.get("cat", "kernel")) not in PROJECTION_CATEGORIES:
            continue
        if calls and any(a in e["name"] for a in GEMM_AUX):
            calls[-1]["us"] += float(e["dur"])
        else:
            calls.append({"name": e["name"], "us": float(e["dur"])})
    return calls


# --- the optimized HLO ----------------------------------------------------------------------

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
_COMP = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+) .*\{\s*$")


def parse_hlo(text: str) -> dict[str, Any]:
    """The module's computations: {name: [instruction]}, each instruction a dict of name,
    shape, opcode, operands, called computations and target (custom calls); ``entry``."""
    comps: dict[str, list[dict[str, Any]]] = {}
    entry, current = None, None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith(" "):
            current = comps.setdefault(m.group(1), [])
            entry = m.group(1) if line.startswith("ENTRY") else entry
            continue
        m = _INSTR.match(line)
        if m is None or current is None:
            continue
        name, shape, opcode, rest = m.groups()
        current.append({
            "name": name, "shape": shape, "opcode": opcode,
            "operands": re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0]),
            "calls": re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", rest),
            "index": int(rest.split(")", 1)[0]) if opcode == "parameter" else None,
            "target": (re.findall(r'custom_call_target="([^"]+)"', rest) or [""])[0],
            "kind": (re.findall(r"kind=(k\w+)", rest) or [""])[0],
            "backend_kind": (re.findall(r'"kind":"([^"]+)"', rest) or [""])[0]})
    return {"computations": comps, "entry": entry}


def schedule(hlo: dict[str, Any], comp: str | None = None) -> list[dict[str, Any]]:
    """The entry computation's instructions in order, calls (command buffers, async
    wrappers) replaced by their computations' instructions; fusions stay whole."""
    comps = hlo["computations"]
    out = []
    for ins in comps.get(comp or hlo["entry"], []):
        if ins["opcode"] in ("fusion", "reduce", "sort", "scatter", "map", "select-and-scatter",
                             "all-reduce", "reduce-window", "reduce-scatter"):
            out.append(ins)
        elif ins["calls"]:
            for called in ins["calls"]:
                out.extend(schedule(hlo, called))
        else:
            out.append(ins)
    return out


def is_matmul(hlo: dict[str, Any], ins: dict[str, Any]) -> bool:
    """A dot, a cuBLAS / cuDNN GEMM or fp8_linear custom call, or a fusion holding one."""
    if ins["opcode"] == "dot":
        return True
    if ins["opcode"] == "custom-call":
        return any(k in ins["target"] for k in ("cublas", "cudnn", "fp8_linear", "gemm"))
    if ins["opcode"] == "fusion":
        return any(is_matmul(hlo, i) for c in ins["calls"]
                   for i in hlo["computations"].get(c, []))
    return False


def is_attention(ins: dict[str, Any]) -> bool:
    return ins["opcode"] == "custom-call" and "attention" in ins["target"]


def dims(shape: str) -> tuple[int, ...]:
    """The dimensions of an HLO array shape ("bf16[64,2048]{1,0}" -> (64, 2048))."""
    m = re.match(r"\w+\[([\d,]*)\]", shape)
    return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


PROJECTION_KEYS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                   "down_proj", "lm_head")
FOLLOWED = ("bitcast", "copy", "transpose", "convert", "concatenate", "fusion",
            "get-tuple-element", "reshape")
"""Producers a matmul's weight operand is followed through to the parameter it reads."""


def projection_shapes(config: ModelConfig) -> list[tuple[str, tuple[int, int], str]]:
    """(label, weight shape [out, in], phase) of every projection a step may run: phase
    "pre" before the layer's attention, "post" after; fused forms included (XLA may merge
    dots that share their input). The fallback when a weight's parameter is not found."""
    h, q = config.hidden_size, config.num_q_heads * config.head_dim
    kv, inter = config.num_kv_heads * config.head_dim, config.intermediate_size
    return [("q_proj", (q, h), "pre"), ("k/v_proj", (kv, h), "pre"),
            ("q_proj+k_proj+v_proj", (q + 2 * kv, h), "pre"),
            ("k_proj+v_proj", (2 * kv, h), "pre"), ("o_proj", (h, q), "post"),
            ("gate/up_proj", (inter, h), "post"), ("gate_proj+up_proj", (2 * inter, h), "post"),
            ("down_proj", (h, inter), "post"), ("lm_head", (config.vocab_size, h), "post")]


def call_arguments(hlo: dict[str, Any]) -> dict[str, str]:
    """{parameter of a called computation: the caller's operand it stands for}, for the
    calls :func:`schedule` opens (e.g. an HLO-level command buffer's)."""
    comps, out = hlo["computations"], {}
    for comp in comps.values():
        for ins in comp:
            if ins["opcode"] == "fusion":
                continue
            for called in ins["calls"]:
                for param in comps.get(called, []):
                    if param["opcode"] == "parameter" and param["index"] < len(ins["operands"]):
                        out[param["name"]] = ins["operands"][param["index"]]
    return out


def weight_params(hlo: dict[str, Any], by_name: dict[str, dict[str, Any]],
                  ins: dict[str, Any], depth: int = 3) -> set[str]:
    """The projections (``PROJECTION_KEYS``) whose weight parameters feed ``ins`` through
    bitcasts, copies, concatenations and fusions that are not matmuls themselves (at most
    ``depth`` producers deep), and from a called computation's parameter to its caller's
    operand (``hlo["arguments"]``, from :func:`call_arguments`)."""
    found: set[str] = set()
    for name in ins["operands"]:
        while name in hlo.get("arguments", {}) and not any(k in name for k in PROJECTION_KEYS):
            name = hlo["arguments"][name]
        producer = by_name.get(name)
        if producer is None:
            continue
        if producer["opcode"] == "parameter":
            found |= {k for k in PROJECTION_KEYS if k in name}
        elif (producer["opcode"] in FOLLOWED and depth > 1
              and not is_matmul(hlo, producer)):
            found |= weight_params(hlo, by_name, producer, depth - 1)
    return found


def label_matmuls(hlo: dict[str, Any], config: ModelConfig) -> list[dict[str, Any]]:
    """The step's matmuls in schedule order, each labelled with the projection(s) whose
    weight parameter it reads ("q_proj", "gate_proj+up_proj" for a merged dot), else with
    the projection of its weight operand's shape; same-shaped projections (q and o when q
    heads * head_dim = hidden) are then told apart by the phase: "post" after an attention
    call, "pre" again after down_proj.

    Example:
        >>> from xla_kernels.serving.config import preset
        >>> hlo = parse_hlo('''ENTRY %main (p: f32[8]) -> f32[8] {
        ...   %w = f32[256,128]{1,0} parameter(0)
        ...   %x = f32[4,128]{1,0} parameter(1)
        ...   %q = f32[4,256]{1,0} dot(%x, %w), lhs_contracting_dims={1}
        ...   %a = f32[4,256]{1,0} custom-call(%q), custom_call_target="ragged_paged_attention"
        ...   %weights_layers_0_self_attn_o_proj_weight = f32[128,256]{1,0} parameter(2)
        ...   %b = f32[128,256]{1,0} bitcast(%weights_layers_0_self_attn_o_proj_weight)
        ...   ROOT %o = f32[4,128]{1,0} dot(%a, %b), lhs_contracting_dims={1}
        ... }''')
        >>> [(m["label"], m["by"]) for m in label_matmuls(hlo, preset("tiny"))]
        [('q_proj', 'shape'), ('o_proj', 'parameter')]
    """
    by_name = {i["name"]: i for c in hlo["computations"].values() for i in c}
    hlo = {**hlo, "arguments": call_arguments(hlo)}
    known = projection_shapes(config)
    phase, out = "pre", []
    for ins in schedule(hlo):
        if is_attention(ins):
            phase = "post"
            continue
        if not is_matmul(hlo, ins):
            continue
        params = weight_params(hlo, by_name, ins)
        if params:
            label, by = "+".join(k for k in PROJECTION_KEYS if k in params), "parameter"
        else:
            label, by = _label_by_shape(by_name, ins, known, phase), "shape"
        out.append({"hlo": ins["name"], "label": label, "by": by})
        if label == "down_proj":
            phase = "pre"
    return out


def _label_by_shape(by_name: dict[str, dict[str, Any]], ins: dict[str, Any],
                    known: list[tuple[str, tuple[int, int], str]], phase: str) -> str:
    shapes = [dims(by_name[o]["shape"]) if o in by_name else () for o in ins["operands"]]
    candidates = [(label, p) for label, shape, p in known if shape in shapes]
    if candidates:
        return next((lab for lab, p in candidates if p == phase), candidates[0][0])
    big = max(shapes, key=lambda s: math.prod(s) if s else 0, default=())
    return "gemm " + "x".join(map(str, big))


def fusion_summary(hlo: dict[str, Any]) -> dict[str, Any]:
    """Counts of the module's fusions by kind (kCustom by its backend kind, e.g.
    __triton_gemm) and by the set of ops each fuses (parameters, constants and bitcasts
    left out), of its custom calls by target, and of the fusions holding SiLU's sigmoid
    (``logistic``, or 1 / (1 + exp(-x)) once XLA expands it): in a GEMM fusion (with the
    dot) or apart from it."""
    comps = hlo["computations"]
    kinds: Counter = Counter()
    signatures: Counter = Counter()
    targets: Counter = Counter()
    silu: Counter = Counter()
    for comp in comps.values():
        for ins in comp:
            if ins["opcode"] == "custom-call":
                targets[ins["target"]] += 1
            if ins["opcode"] != "fusion":
                continue
            kind = ins["backend_kind"] or ins["kind"] or "fusion"
            kinds[kind] += 1
            ops = sorted({i["opcode"] for c in ins["calls"] for i in comps.get(c, [])
                          if i["opcode"] not in ("parameter", "constant", "bitcast")})
            signatures[f"{kind}: {' '.join(ops)}"] += 1
            if "logistic" in ops or {"exponential", "divide", "negate"} <= set(ops):
                silu[kind + (" with the dot" if "dot" in ops else " (no dot)")] += 1
    return {"fusions": sum(kinds.values()), "by_kind": dict(kinds.most_common()),
            "by_ops": dict(signatures.most_common()), "custom_calls": dict(targets.most_common()),
            "silu_fused_in": dict(silu)}


def hlo_text(runner: Any, prepared: Any) -> str | None:
    """The step's optimized HLO, or None when the runner cannot be lowered."""
    lower = getattr(runner, "lower", None)
    if lower is None:
        return None
    return lower(prepared).compile().as_text()


# --- the projections' bandwidth --------------------------------------------------------------

WEIGHT_OF = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
             "k/v_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj",
             "gate/up_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj"}


def weight_bytes_of(weights: dict[str, Any], label: str) -> int | None:
    """Bytes of the weights (and fp8 scales) behind a projection label: layer 0's, a
    merged label's parts summed; the LM head's. None for a label of no known weight.

    Example:
        >>> import numpy as np
        >>> w = {"layers.0.self_attn.k_proj.weight": np.zeros((4, 8), np.float32),
        ...      "layers.0.self_attn.v_proj.weight": np.zeros((4, 8), np.float32)}
        >>> weight_bytes_of(w, "k_proj+v_proj"), weight_bytes_of(w, "gemm 3x3")
        (256, None)
    """
    names = []
    for part in label.split("+"):
        if part == "lm_head":
            names.append("lm_head.weight")
        elif part in WEIGHT_OF:
            names += [f"layers.0.{WEIGHT_OF[part]}.weight{s}" for s in ("", "_scale")]
        else:
            return None
    sizes = [int(weights[n].size) * weights[n].dtype.itemsize for n in names if n in weights]
    return sum(sizes) if sizes else None


def projection_table(steps: list[list[dict]], labels: list[dict[str, Any]] | None,
                     weights: dict[str, Any], copy_gbs: float) -> dict[str, Any]:
    """Per projection label: kernel names, calls per step, median µs, weight bytes, GB/s and
    share of ``copy_gbs``. Without labels matching the trace's GEMM count: per kernel name,
    and one layer's kernel sequence."""
    per_step = [projection_calls(s) for s in steps]
    count = len(per_step[0])
    matched = labels is not None and len(labels) == count
    times: dict[str, list[float]] = {}
    names: dict[str, set[str]] = {}
    for calls in per_step:
        for i, call in enumerate(calls):
            key = labels[i]["label"] if matched else call["name"]
            times.setdefault(key, []).append(call["us"])
            names.setdefault(key, set()).add(call["name"][:120])
    rows = []
    for key, us in times.items():
        nbytes = weight_bytes_of(weights, key) if matched else None
        median = statistics.median(us)
        gbs = nbytes / median / 1e3 if nbytes and median else None
        rows.append({"projection": key, "kernels": sorted(names[key]),
                     "calls_per_step": len(us) // len(per_step), "median_us": round(median, 3),
                     "weight_bytes": nbytes, "gb_per_s": round(gbs, 1) if gbs else None,
                     "share_of_copy": round(gbs / copy_gbs, 4) if gbs else None})
    result = {"labelled": matched, "calls_per_step": count,
              "hlo_matmuls": len(labels) if labels is not None else None, "rows": rows}
    if not matched:
        result["note"] = (f"{count} GEMM/fp8_linear kernels per step in the trace, "
                          f"{result['hlo_matmuls']} matmuls in the HLO: reported per kernel "
                          "name instead of per projection")
        result["one_layer"] = one_layer(steps[0])
    return result


def one_layer(step: list[dict]) -> list[str]:
    """The kernel names from the first attention kernel to the second one's layer (where
    the next attention's first kernel appears again), for reading when labels fail."""
    att = [i for i, e in enumerate(step) if category(e["name"]) == "attention"]
    if not att:
        return [e["name"][:100] for e in step[:60]]
    first = step[att[0]]["name"]
    again = next((i for i in att[1:] if step[i]["name"] == first), len(step))
    return [f"{category(e['name'], e.get('cat', 'kernel'))}: {e['name'][:100]}"
            for e in step[att[0]:again]]


def short(name: str, width: int = 90) -> str:
    """A kernel name for a table: no return type, namespaces or argument list.

    Example:
        >>> short("void xla_kernels::kv_cache::(anonymous namespace)::CopyRowsKernel<4>(int)")
        'CopyRowsKernel<4>'
    """
    if not (name.startswith("void ") or "::" in name):     # not a demangled C++ name
        return name[:width]
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", name)
    name = re.sub(r"(?:[\w]+::|\(anonymous namespace\)::)+(?=\w+(?:<|$))", "", name, count=1)
    return name[:width]


# --- the report ---------------------------------------------------------------------------

def kv_bytes(model: ModelConfig, batch: int, context: int) -> int:
    """K and V bytes the step's attention reads (every layer, every sequence's context)."""
    item = {"float32": 4, "bfloat16": 2, "float16": 2}[model.dtype]
    return 2 * model.num_layers * batch * context * model.num_kv_heads * model.head_dim * item


def roofline(result: dict[str, Any]) -> dict[str, Any] | None:
    """The step's bytes (weights read + KV read) over the copy bandwidth, against its busy
    time: the floor the issue measures the step against."""
    tl = result.get("timeline")
    if not tl:
        return None
    moved = result["weight_bytes_per_step"] + result["kv_bytes_per_step"]
    floor_us = moved / (result["copy_gbs"] * 1e3)
    return {"bytes": moved, "floor_us": round(floor_us, 1),
            "busy_over_floor": round(tl["busy_us"] / floor_us, 3),
            "step_ms_over_floor": round(result["step_ms"] * 1e3 / floor_us, 3)}


def markdown(result: dict[str, Any]) -> str:
    """The report: the step, categories, projections, top 25 kernels, the HLO's fusions."""
    c = result["config"]
    lines = [f"# Decode step profile: {c['preset']} {c['frontend']} {c['attention']} "
             f"weights={c['weights']}, {c['batch']} x {c['context']} on {c['device']}", "",
             f"Untraced replay: {result['step_ms']:.3f} ms per step (the traced span below "
             "against it: the profiler's own cost). Copy bandwidth "
             f"(read + write): {result['copy_gbs']:.0f} GB/s."]
    tl = result.get("timeline")
    if not tl:
        lines += ["", f"**{result['note']}**"]
    else:
        rf = result["roofline"]
        lines += ["", f"Traced: {result['steps_traced']} steps. Per step: busy "
                  f"{tl['busy_us']:.1f} µs, span {tl['span_us']:.1f} µs (busy "
                  f"{tl['busy_share_of_span']:.1%}), gaps {tl['gaps_us']:.1f} µs = "
                  f"{tl['gaps_inside_launches_us']:.1f} inside launches + "
                  f"{tl['gaps_between_launches_us']:.1f} between; {tl['events']:.0f} kernels "
                  f"in {tl['launches']:.0f} launches.",
                  f"Roofline: weights {result['weight_bytes_per_step'] / 1e9:.3f} GB + KV "
                  f"{result['kv_bytes_per_step'] / 1e9:.3f} GB at copy bandwidth = "
                  f"{rf['floor_us']:.1f} µs; busy / floor {rf['busy_over_floor']:.2f}, "
                  f"untraced step / floor {rf['step_ms_over_floor']:.2f}.",
                  "", "| category | kernels | calls/step | µs/step | share of busy |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['category']} | {r['kernels']} | {r['calls_per_step']:g} | "
                  f"{r['us_per_step']:.1f} | {r['share_of_busy']:.1%} |"
                  for r in result["categories"]]
        lines += _projection_lines(result["projections"])
        lines += ["", "Top 25 kernels:", "", "| kernel | category | calls/step | µs/step | "
                  "share |", "|---|---|---:|---:|---:|"]
        lines += [f"| `{short(k['name'])}` | {k['category']} | {k['calls_per_step']:g} | "
                  f"{k['us_per_step']:.1f} | {k['share_of_busy']:.1%} |"
                  for k in result["kernels"][:25]]
    lines += _hlo_lines(result.get("hlo"))
    return "\n".join(lines) + "\n"


def _projection_lines(proj: dict[str, Any] | None) -> list[str]:
    if not proj:
        return []
    lines = ["", "Projections (GEMM and fp8_linear kernels; median over layers and steps):",
             ""]
    if proj.get("note"):
        lines += [f"*{proj['note']}*", ""]
    lines += ["| projection | calls/step | median µs | weight MB | GB/s | % of copy | kernels |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for r in proj["rows"]:
        mb = f"{r['weight_bytes'] / 1e6:.1f}" if r["weight_bytes"] else "-"
        gbs = f"{r['gb_per_s']:.0f}" if r["gb_per_s"] else "-"
        share = f"{r['share_of_copy']:.1%}" if r["share_of_copy"] else "-"
        kernels = ", ".join(f"`{short(k, 50)}`" for k in r["kernels"][:3])
        lines.append(f"| {r['projection'][:60]} | {r['calls_per_step']} | "
                     f"{r['median_us']:.1f} | {mb} | {gbs} | {share} | {kernels} |")
    if proj.get("one_layer"):
        lines += ["", "One layer's kernels:", ""] + [f"    {k}" for k in proj["one_layer"]]
    return lines


def _hlo_lines(hlo: dict[str, Any] | None) -> list[str]:
    if not hlo:
        return ["", "Optimized HLO: not available (the runner has no lower())."]
    lines = ["", f"Optimized HLO ({hlo['file']}): {hlo['fusions']} fusions "
             f"{json.dumps(hlo['by_kind'])}; custom calls {json.dumps(hlo['custom_calls'])}; "
             f"matmuls in schedule order: {len(hlo['matmuls'])}; SiLU's sigmoid fused "
             f"in: {json.dumps(hlo['silu_fused_in'])}.", "",
             "| fusions | kind: fused ops |", "|---:|---|"]
    lines += [f"| {n} | {sig[:150]} |" for sig, n in list(hlo["by_ops"].items())[:30]]
    return lines


# --- main -----------------------------------------------------------------------------------

def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Build, time, trace and dump the step (see the module docstring); the result."""
    import jax
    import torch

    from xla_kernels.bench import copy_bandwidth_gbs

    on_gpu = torch.cuda.is_available()
    copy_gbs = copy_bandwidth_gbs(1 << 30 if on_gpu else 1 << 24)
    if on_gpu:
        torch.cuda.empty_cache()
    built = build(args)
    runner, prepared, model = built["runner"], built["prepared"], built["model"]
    step_ms = replay_ms(lambda: runner.launch(prepared), args.calls, sync=runner.fetch)
    tag = f"{args.preset}_{args.batch}x{args.context}"
    from xla_kernels.serving.quantize import weight_bytes

    result: dict[str, Any] = {
        "config": {"preset": args.preset, "frontend": args.frontend,
                   "attention": args.attention, "weights": args.weights,
                   "batch": args.batch, "context": args.context, "calls": args.calls,
                   "device": built["device"].device_kind, "jax": jax.__version__,
                   "torch": torch.__version__, "model": dataclasses.asdict(model)},
        "step_ms": round(step_ms, 4), "copy_gbs": round(copy_gbs, 1),
        "weight_bytes_per_step": weight_bytes(built["weights"], model)["bytes_read_per_step"],
        "kv_bytes_per_step": kv_bytes(model, args.batch, args.context)}
    labels = None
    text = hlo_text(runner, prepared)
    if text is not None:
        hlo = parse_hlo(text)
        path = args.out / f"step_hlo_{tag}.txt.gz"
        path.write_bytes(gzip.compress(text.encode()))
        labels = label_matmuls(hlo, model)
        result["hlo"] = {"file": path.name, **fusion_summary(hlo), "matmuls": labels}
    events, steps = traced_steps(runner, prepared, args.calls)
    if not events:
        result["note"] = "no CUDA kernels recorded (CPU run)" if not on_gpu else \
            "no CUDA kernels recorded (is CUPTI available to torch.profiler?)"
        return result
    result.update(analyze(events, steps, labels, built["weights"], copy_gbs))
    result["roofline"] = roofline(result)
    return result


def analyze(events: list[dict], steps: int, labels: list[dict[str, Any]] | None,
            weights: dict[str, Any], copy_gbs: float) -> dict[str, Any]:
    """The trace's part of the result: the timeline, kernels, categories, projections."""
    kernels = kernel_table(events, steps)
    # Kernels only: the host's read of the tokens (a copy at each sync) is not per step.
    runs = split_steps([e for e in events if e.get("cat", "kernel") == "kernel"], steps)
    return {"steps_traced": steps, "timeline": timeline(events, steps), "kernels": kernels,
            "categories": category_table(kernels),
            "projections": (projection_table(runs, labels, weights, copy_gbs) if runs else
                            {"note": "the steps' kernel sequences differ", "rows": []})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="1b", choices=("tiny", "1b", "8b"))
    parser.add_argument("--frontend", default="jax", choices=FRONTENDS)
    parser.add_argument("--attention", default="xla-kernels", choices=ATTENTIONS)
    parser.add_argument("--weights", default="model", choices=WEIGHT_FORMATS)
    parser.add_argument("--batch", type=int, default=64, help="sequences in the decode step")
    parser.add_argument("--context", type=int, default=2000, help="tokens per sequence")
    parser.add_argument("--calls", type=int, default=20, help="steps replayed per timing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = profile(args)
    tag = f"{args.preset}_{args.batch}x{args.context}"
    report = markdown(result)
    (args.out / f"step_profile_{tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"step_profile_{tag}.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
