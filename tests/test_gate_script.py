"""benchmarks/gate.py (the benchmark gate): its comparison rules, its doctests, and whole
runs of its smoke sizes on this machine's backend against a baseline it wrote, a doctored
baseline and none."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest

from xla_kernels.bench import load_script

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gate.py"

gate = load_script(SCRIPT)


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--card", "cpu", "--smoke",
                           "--results", str(tmp_path), "--only", "simple_add",
                           "--rounds", "2", "--budget", "0.02", *args],
                          capture_output=True, text=True, timeout=600)


def test_doctests_pass():
    assert doctest.testmod(gate).failed == 0


def test_a_slowdown_fails_only_beyond_the_larger_of_the_floor_and_the_noise():
    base = {"quiet": {"ms": 1.0, "noise": 0.001}, "noisy": {"ms": 1.0, "noise": 0.04}}
    cur = {"quiet": {"ms": 1.021, "noise": 0.001}, "noisy": {"ms": 1.039, "noise": 0.001}}
    rows = {r["name"]: r for r in gate.compare(base, cur)}
    assert rows["quiet"]["verdict"] == "SLOWER" and rows["quiet"]["tolerance"] == 0.02
    assert rows["noisy"]["verdict"] == "ok" and rows["noisy"]["tolerance"] == 0.04
    assert gate.exit_code(list(rows.values())) == 1
    assert gate.compare(base, cur, min_tolerance=0.05)[0]["verdict"] == "ok"


def test_the_current_runs_noise_widens_the_tolerance_too():
    rows = gate.compare({"a": {"ms": 1.0, "noise": 0.0}}, {"a": {"ms": 1.03, "noise": 0.035}})
    assert rows[0]["verdict"] == "ok" and rows[0]["tolerance"] == 0.035


def test_a_speedup_beyond_the_tolerance_is_reported_and_passes():
    rows = gate.compare({"a": {"ms": 1.0, "noise": 0.01}}, {"a": {"ms": 0.9, "noise": 0.01}})
    assert rows[0]["verdict"] == "faster" and gate.exit_code(rows) == 0


def test_the_table_shows_every_configuration_with_its_verdict():
    rows = gate.compare({"a": {"ms": 2.0, "noise": 0.0}},
                        {"a": {"ms": 2.5, "noise": 0.0}, "b": {"ms": 1.0, "noise": 0.0}})
    text = gate.table(rows).splitlines()
    assert text[1].split() == ["a", "2.0000", "2.5000", "1.250", "2.0%", "SLOWER"]
    assert text[2].split() == ["b", "-", "1.0000", "-", "-", "new"]


def test_the_card_is_the_model_number_of_the_gpu_name():
    assert gate.card_from_name("NVIDIA H100 80GB HBM3") == "h100"
    assert gate.card_from_name("NVIDIA H200\n") == "h200"
    assert gate.card_from_name("NVIDIA H100 NVL") == "h100"


def test_every_configuration_has_a_unique_name_and_builds_at_smoke_size():
    names = [c.name for c in gate.CONFIGS]
    assert len(names) == len(set(names))
    for kernel in ("simple_add", "rms_norm", "reshape_and_cache ", "reshape_and_cache_fused",
                   "paged bf16", "paged fp8", "ragged decode", "ragged prefill",
                   "ragged fused", "ragged mma"):
        assert any(n.startswith(kernel) for n in names), kernel


def test_an_unknown_selection_is_refused_with_the_option_named():
    with pytest.raises(SystemExit, match="no configuration matches --only"):
        gate.select(gate.CONFIGS, ["nonexistent"], None)
    with pytest.raises(SystemExit, match="unknown configuration"):
        gate.select(gate.CONFIGS, None, ["nonexistent"])


def test_bad_rounds_or_budget_are_refused(capsys):
    with pytest.raises(SystemExit):
        gate.parse_args(["--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err


def test_without_a_baseline_the_gate_exits_2_and_says_how_to_record_one(tmp_path):
    proc = run(tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no baseline" in proc.stderr and "--write" in proc.stderr


def test_write_then_compare_passes_and_a_doctored_baseline_fails(tmp_path):
    wrote = run(tmp_path, "--write")
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    baseline = tmp_path / "cpu" / "gate.json"
    record = json.loads(baseline.read_text())
    assert set(record["configs"]) == {"simple_add f32 2^24", "simple_add bf16 2^24"}
    assert all(len(c["rounds_ms"]) == 2 for c in record["configs"].values())

    # A baseline 100x faster than anything this run can do, with no noise: SLOWER, exit 1.
    for c in record["configs"].values():
        c["ms"], c["noise"] = c["ms"] / 100, 0.0
    baseline.write_text(json.dumps(record))
    out = tmp_path / "run.json"
    slow = run(tmp_path, "--out", str(out))
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "gate: FAILED, slower beyond noise: simple_add f32 2^24, simple_add bf16 2^24" \
        in slow.stdout
    verdicts = {r["name"]: r["verdict"] for r in json.loads(out.read_text())["comparison"]}
    assert verdicts == {"simple_add f32 2^24": "SLOWER", "simple_add bf16 2^24": "SLOWER"}

    # A baseline 100x slower: every configuration faster, exit 0.
    for c in record["configs"].values():
        c["ms"] *= 10_000
    baseline.write_text(json.dumps(record))
    fast = run(tmp_path)
    assert fast.returncode == 0 and "gate: passed" in fast.stdout, fast.stdout + fast.stderr


def test_src_times_the_package_under_that_folder(tmp_path):
    """``--src`` (a base commit's src/, for a before/after run on one machine) is the package
    that is timed, and the run records it."""
    src = Path(__file__).parents[1] / "src"
    wrote = run(tmp_path, "--write", "--src", str(src), "--rounds", "1")
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    record = json.loads((tmp_path / "cpu" / "gate.json").read_text())
    assert record["package"] == str(src.resolve() / "xla_kernels")
