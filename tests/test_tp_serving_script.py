"""benchmarks/tp_serving.py (the tp 2 vs tp 1 serving comparison of ``scripts/gpu/tp.sh``)
on small hand-written serve-bench JSONs: its counts, ratios, exit codes and doctests."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from xla_kernels.bench import load_script

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "tp_serving.py"


tp_serving = load_script(SCRIPT)

WORKLOAD = {"requests": 3, "prompt_len": 20, "new_tokens": 4}


def _run(path: Path, tp: int, frontend: str, outputs: dict[str, list[int]],
         rates: tuple[float, float], step_ms: float, device_ms: float | None) -> None:
    path.write_text(json.dumps({
        "tokens_per_s": rates[0], "decode_tokens_per_s": rates[1], "decode_step_ms": step_ms,
        "outputs": outputs,
        "breakdown": None if device_ms is None else {"decode_step_device_ms": device_ms},
        "config": {"preset": "1b", "frontend": frontend, "tp": tp, "platform": "gpu",
                   "device": "NVIDIA H200", "dtype": "bfloat16", "seed": 0,
                   "attention": "xla-kernels", "workload": WORKLOAD, "jax": "0.11.2"}}))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    tp1 = {"0": [1, 2, 3], "1": [4, 5, 6, 7], "2": [8, 9]}
    _run(tmp_path / "serve_1b_tp1_jax.json", 1, "jax", tp1, (100.0, 200.0), 4.0, 2.0)
    _run(tmp_path / "serve_1b_tp2_jax.json", 2, "jax",
         {"0": [1, 2, 3], "1": [4, 5, 0, 7], "2": [8, 9]}, (150.0, 300.0), 2.5, None)
    _run(tmp_path / "serve_1b_tp1_torchax.json", 1, "torchax", {**tp1, "2": [8]},
         (90.0, 180.0), 5.0, 2.5)
    (tmp_path / "env.txt").write_text("2026-11-24T10:00:00Z\njax 0.11.2\ntorch 2.11.0\n"
                                      "torchax 0.0.13\n")
    return tmp_path


def test_reports_counts_ratios_and_first_divergence(runs: Path):
    out = runs / "report"
    assert tp_serving.main(["--dir", str(runs), "--out", str(out)]) == 0
    result = json.loads((out / "tp_serving.json").read_text())
    jax_entry = result["frontends"]["jax"]
    assert jax_entry["speedup"] == {"tokens_per_s": 1.5, "decode_tokens_per_s": 1.5,
                                    "decode_step_ms": 1.6, "decode_step_device_ms": None}
    assert jax_entry["tokens"] == {
        "requests": 3, "identical_requests": 2, "diverged_requests": 1, "tokens": 9,
        "first_divergence": {"request": "1", "index": 2, "base": 6, "other": 0},
        "config_differs": []}
    cross = result["torchax_vs_jax"]
    assert list(cross) == ["tp1"]
    assert cross["tp1"]["identical_requests"] == 2
    assert cross["tp1"]["first_divergence"] == {"request": "2", "index": 1, "base": 9,
                                                "other": None}
    assert result["missing"] == ["serve_1b_tp2_torchax.json"]
    assert result["unreadable"] == [] and result["notes"] == []
    assert (result["date"], result["torchax"], result["device"]) == (
        "2026-11-24", "0.0.13", "NVIDIA H200")
    text = (out / "tp_serving.md").read_text()
    assert text.startswith("# serve-bench --preset 1b, tp 2 vs tp 1 — NVIDIA H200 (gpu), "
                           "jax 0.11.2, torch 2.11.0, torchax 0.0.13, 2026-11-24\n")
    assert "| jax | speedup | 1.500x | 1.500x | 1.600x | — |" in text
    assert "| jax tp2 | jax tp1 | 2/3 | 9 | request 1, token 2 (6 vs 0) |" in text
    assert "| torchax tp1 | jax tp1 | 2/3 | 9 | request 2, token 1 (9 vs None) |" in text
    assert "| torchax | 2 | not run |" in text
    assert "- Not run: serve_1b_tp2_torchax.json" in text


def test_flags_differing_workloads(runs: Path):
    data = json.loads((runs / "serve_1b_tp2_jax.json").read_text())
    data["config"]["workload"] = {**WORKLOAD, "requests": 4}
    (runs / "serve_1b_tp2_jax.json").write_text(json.dumps(data))
    result = tp_serving.compare(runs)
    assert result["frontends"]["jax"]["tokens"]["config_differs"] == ["workload"]
    assert result["notes"] == ["jax tp2 vs tp1: the runs differ in workload"]


def test_unreadable_json_gives_exit_code_1_and_still_writes_the_report(runs: Path):
    (runs / "serve_1b_tp2_torchax.json").write_text("{ cut off")
    assert tp_serving.main(["--out", str(runs)]) == 1
    result = json.loads((runs / "tp_serving.json").read_text())
    assert [u.split(":")[0] for u in result["unreadable"]] == ["serve_1b_tp2_torchax.json"]
    assert "jax" in result["frontends"] and (runs / "tp_serving.md").exists()


def test_no_runs_is_reported_not_an_error(tmp_path: Path):
    assert tp_serving.main(["--out", str(tmp_path)]) == 0
    assert "no pair of runs" in (tmp_path / "tp_serving.md").read_text()


def test_doctests():
    failures, tried = doctest.testmod(tp_serving)
    assert tried > 0 and failures == 0
