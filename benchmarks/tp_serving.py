"""The serving loop with tensor parallelism over N devices vs one: speed and greedy tokens.

Reads the serve-bench JSONs that ``scripts/gpu/tp.sh`` writes to one directory,
``serve_<preset>_tp<t>_<frontend>.json`` for ``t`` in 1 and N and ``frontend`` in jax and
torchax (``serve-bench --preset 1b --tp t --frontend F --no-reference --json ...``, all on
the same machine), and compares them. Runs that are missing are reported as such.

Per frontend, at tp 1 and tp N: ``tokens_per_s`` (every generated token over the whole
run's wall time), ``decode_tokens_per_s`` (decode tokens over the decode steps' time),
``decode_step_ms`` (median decode step, host included) and, where serve-bench's breakdown
ran, ``breakdown.decode_step_device_ms`` (the widest decode step replayed back to back on
the device). The speedup is tp N / tp 1 for the rates and tp 1 / tp N for the step times,
so above 1 means tp N is faster either way.

Greedy tokens (each JSON's ``outputs``: request id -> generated tokens): tp N against tp 1
of the same frontend, and torchax against jax at the same tp. Per pair: requests with
identical tokens, the tokens compared (those of the first run named), and for the first
request (by id) that differs, the first differing token index. In bf16 the tokens can
legitimately differ on near-ties (tp N's all-reduce after o_proj and down_proj sums in
another order than one device), so the table reports and does not assert; serve-bench's
f32 reference check (``1b_tp2_jax_checked`` in ``scripts/gpu/tp.sh``) is the correctness test. A
pair whose runs had different workloads, models, engines, seeds or attention is flagged.

The header names the device, the JAX version, and the date and torch/torchax versions of
``env.txt`` in ``--dir`` (``scripts/gpu/common.sh`` writes it) where there is one, else
today's date. Writes ``tp_serving.json`` and ``tp_serving.md`` to ``--out`` and prints the
markdown. Exit code 0, unless a JSON is there but unreadable (then 1, after writing the
rest).

Example:
    $ python benchmarks/tp_serving.py --out benchmarks/results/latest/h200x2
    $ python benchmarks/tp_serving.py --dir /tmp/tp-runs --out /tmp/tp-report --n 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

FRONTENDS = ("jax", "torchax")
# (key, column title, True for a rate: speedup tpN/tp1; False for a time: tp1/tpN)
METRICS = (("tokens_per_s", "tokens/s", True),
           ("decode_tokens_per_s", "decode tokens/s", True),
           ("decode_step_ms", "decode step ms", False),
           ("decode_step_device_ms", "device step ms", False))
SAME_CONFIG = ("preset", "attention", "dtype", "seed", "model", "workload", "engine")


def run_path(directory: Path, preset: str, tp: int, frontend: str) -> Path:
    """The serve-bench JSON of one run, as ``scripts/gpu/tp.sh`` names it.

    Example:
        >>> run_path(Path("out"), "1b", 2, "jax").as_posix()
        'out/serve_1b_tp2_jax.json'
    """
    return directory / f"serve_{preset}_tp{tp}_{frontend}.json"


def load_run(path: Path) -> dict[str, Any]:
    """One serve-bench JSON; raises ``ValueError`` for one that is not a serve-bench result
    (no ``outputs`` dictionary) and ``OSError`` / ``json.JSONDecodeError`` as ``open`` and
    ``json`` do."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("outputs"), dict):
        raise ValueError("not a serve-bench result (no 'outputs' dictionary)")
    return data


def metrics(run: dict[str, Any]) -> dict[str, float | None]:
    """The run's rates and step times (``None`` where the JSON has none).

    Example:
        >>> metrics({"tokens_per_s": 10.0, "breakdown": {"decode_step_device_ms": 2.0}})
        {'tokens_per_s': 10.0, 'decode_tokens_per_s': None, 'decode_step_ms': None, \
'decode_step_device_ms': 2.0}
    """
    breakdown = run.get("breakdown") or {}
    return {key: (breakdown.get(key) if key == "decode_step_device_ms" else run.get(key))
            for key, _, _ in METRICS}


def speedups(base: dict[str, float | None], other: dict[str, float | None]
             ) -> dict[str, float | None]:
    """``other`` vs ``base`` per metric: other / base for rates, base / other for times.

    Example:
        >>> speedups({"tokens_per_s": 100.0, "decode_step_ms": 4.0},
        ...          {"tokens_per_s": 150.0, "decode_step_ms": 5.0})
        {'tokens_per_s': 1.5, 'decode_tokens_per_s': None, 'decode_step_ms': 0.8, \
'decode_step_device_ms': None}
    """
    out: dict[str, float | None] = {}
    for key, _, rate in METRICS:
        a, b = base.get(key), other.get(key)
        if not a or not b:
            out[key] = None
        else:
            out[key] = round(b / a if rate else a / b, 4)
    return out


def compare_tokens(base: dict[str, list[int]], other: dict[str, list[int]]
                   ) -> dict[str, Any]:
    """Greedy tokens of ``other`` against ``base``, request by request.

    ``requests``: ids in either; ``identical_requests``: ids with equal token lists;
    ``tokens``: the tokens of ``base``; ``first_divergence``: the first differing request
    (by id), the first index where the lists differ and both tokens there (``None`` past
    the end of a list or for a request missing from one side), else ``None``.

    Example:
        >>> compare_tokens({"0": [1, 2], "1": [3, 4, 5]}, {"0": [1, 2], "1": [3, 9, 5]})
        {'requests': 2, 'identical_requests': 1, 'diverged_requests': 1, 'tokens': 5, \
'first_divergence': {'request': '1', 'index': 1, 'base': 4, 'other': 9}}
    """
    ids = sorted(set(base) | set(other), key=lambda k: (int(k) if k.isdigit() else 1 << 62, k))
    identical = [k for k in ids if k in base and k in other and base[k] == other[k]]
    first = None
    for k in ids:
        if k in identical:
            continue
        a, b = base.get(k, []), other.get(k, [])
        index = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                     min(len(a), len(b)))
        first = {"request": k, "index": index,
                 "base": a[index] if index < len(a) else None,
                 "other": b[index] if index < len(b) else None}
        break
    return {"requests": len(ids), "identical_requests": len(identical),
            "diverged_requests": len(ids) - len(identical),
            "tokens": sum(len(v) for v in base.values()), "first_divergence": first}


def config_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The config keys (of :data:`SAME_CONFIG`) on which two runs differ.

    Example:
        >>> config_differences({"config": {"seed": 0, "preset": "1b"}},
        ...                    {"config": {"seed": 1, "preset": "1b"}})
        ['seed']
    """
    ca, cb = a.get("config") or {}, b.get("config") or {}
    return [k for k in SAME_CONFIG if ca.get(k) != cb.get(k)]


def environment(directory: Path) -> dict[str, str]:
    """The date and torch/torchax versions from ``scripts/gpu/common.sh``'s ``env.txt``, if any."""
    path = directory / "env.txt"
    found: dict[str, str] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        if "date" not in found and re.match(r"\d{4}-\d\d-\d\dT", line):
            found["date"] = line[:10]
        match = re.match(r"(torch|torchax) (\S+)$", line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def compare(directory: Path, preset: str = "1b", n: int = 2) -> dict[str, Any]:
    """Read the runs in ``directory`` and compare them (see the module doc)."""
    runs: dict[str, dict[int, dict[str, Any]]] = {f: {} for f in FRONTENDS}
    result: dict[str, Any] = {"dir": str(directory), "preset": preset, "n": n,
                              "missing": [], "unreadable": [], "notes": []}
    for frontend in FRONTENDS:
        for tp in (1, n):
            path = run_path(directory, preset, tp, frontend)
            if not path.exists():
                result["missing"].append(path.name)
                continue
            try:
                runs[frontend][tp] = load_run(path)
            except (OSError, ValueError) as e:
                result["unreadable"].append(f"{path.name}: {e}")
                continue
            config = runs[frontend][tp].get("config") or {}
            for key, want in (("tp", tp), ("frontend", frontend), ("preset", preset)):
                if key in config and config[key] != want:
                    result["notes"].append(f"{path.name}: config {key} is {config[key]!r}")

    configs = [run.get("config") or {} for per in runs.values() for run in per.values()]
    env = environment(directory)
    first = configs[0] if configs else {}
    result.update(
        device=first.get("device"), platform=first.get("platform"), jax=first.get("jax"),
        torch=env.get("torch"), torchax=env.get("torchax"),
        date=env.get("date", datetime.date.today().isoformat()),
        run_preset=first.get("preset"), dtype=first.get("dtype"),
        attention=first.get("attention"),
        workload=first.get("workload"))
    devices = sorted({c.get("device") for c in configs if c.get("device")})
    if len(devices) > 1:
        result["notes"].append(f"runs on different devices: {devices}")

    def pair(name: str, base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
        differ = config_differences(base, other)
        if differ:
            result["notes"].append(f"{name}: the runs differ in {', '.join(differ)}")
        return {**compare_tokens(base["outputs"], other["outputs"]), "config_differs": differ}

    result["frontends"] = {}
    for frontend, per in runs.items():
        if not per:
            continue
        entry: dict[str, Any] = {f"tp{tp}": metrics(run) for tp, run in sorted(per.items())}
        if 1 in per and n in per and n != 1:
            entry["speedup"] = speedups(entry["tp1"], entry[f"tp{n}"])
            entry["tokens"] = pair(f"{frontend} tp{n} vs tp1", per[1], per[n])
        result["frontends"][frontend] = entry
    result["torchax_vs_jax"] = {
        f"tp{tp}": pair(f"torchax vs jax at tp{tp}", runs["jax"][tp], runs["torchax"][tp])
        for tp in sorted({1, n}) if tp in runs["jax"] and tp in runs["torchax"]}
    return result


def _number(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _divergence(tokens: dict[str, Any]) -> str:
    first = tokens["first_divergence"]
    if first is None:
        return "none"
    return (f"request {first['request']}, token {first['index']} "
            f"({first['base']} vs {first['other']})")


def markdown(result: dict[str, Any]) -> str:
    """The comparison as a short markdown report."""
    n = result["n"]
    versions = ", ".join(f"{k} {result[k]}" for k in ("jax", "torch", "torchax") if result[k])
    device = f"{result['device']} ({result['platform']})" if result["device"] else "no runs"
    workload = result["workload"] or {}
    preset = result["run_preset"] or result["preset"]
    lines = [f"# serve-bench --preset {preset}, tp {n} vs tp 1 — {device}, "
             f"{versions or 'versions unknown'}, {result['date']}", "",
             f"Method: one serve-bench run per row (`scripts/gpu/tp.sh`, "
             f"`--no-reference`), {result['dtype']}, attention {result['attention']}, "
             f"{workload.get('requests')} requests of ~{workload.get('prompt_len')} prompt "
             f"+ {workload.get('new_tokens')} new tokens. Speedup: tp {n} / tp 1 for the "
             f"rates, tp 1 / tp {n} for the step times (above 1: tp {n} faster). Device "
             "step: the widest decode step replayed back to back. Greedy tokens are "
             "compared request by request; in bf16 they may differ on near-ties (the "
             "all-reduce sums in another order), which this table reports, not asserts.", "",
             "| frontend | tp | " + " | ".join(title for _, title, _ in METRICS) + " |",
             "|---|---|" + "---|" * len(METRICS)]
    for frontend, entry in result["frontends"].items():
        for tp in sorted({1, n}):
            row = entry.get(f"tp{tp}")
            cells = (["not run"] + [""] * (len(METRICS) - 1) if row is None else
                     [_number(row[k], 2 if rate else 4) for k, _, rate in METRICS])
            lines.append(f"| {frontend} | {tp} | " + " | ".join(cells) + " |")
        if "speedup" in entry:
            cells = [f"{v:.3f}x" if v is not None else "—" for v in entry["speedup"].values()]
            lines.append(f"| {frontend} | speedup | " + " | ".join(cells) + " |")
    lines += ["", "| tokens of | against | identical requests | tokens | first divergence |",
              "|---|---|---|---|---|"]
    pairs = [(f"{f} tp{n}", f"{f} tp1", e["tokens"]) for f, e in result["frontends"].items()
             if "tokens" in e]
    pairs += [(f"torchax {k}", f"jax {k}", t) for k, t in result["torchax_vs_jax"].items()]
    for other, base, tokens in pairs:
        lines.append(f"| {other} | {base} | {tokens['identical_requests']}/"
                     f"{tokens['requests']} | {tokens['tokens']} | {_divergence(tokens)} |")
    if not pairs:
        lines.append("| — | — | no pair of runs | | |")
    notes = [f"- {label}: {item}" for label, key in (("Not run", "missing"),
                                                     ("Unreadable", "unreadable"),
                                                     ("Note", "notes"))
             for item in result[key]]
    lines += ["", *notes] if notes else []
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    parser.add_argument("--dir", type=Path, default=None,
                        help="directory of the serve-bench JSONs (default: --out)")
    parser.add_argument("--preset", default="1b",
                        help="the preset in the JSONs' names (default 1b)")
    parser.add_argument("--n", type=int, default=2, help="the tp degree compared with 1")
    args = parser.parse_args(argv)
    result = compare(args.dir or args.out, args.preset, args.n)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tp_serving.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / "tp_serving.md").write_text(text)
    print(text, end="")
    for item in result["unreadable"]:
        print(f"tp_serving.py: unreadable: {item}", file=sys.stderr)
    return 1 if result["unreadable"] else 0


if __name__ == "__main__":
    sys.exit(main())
