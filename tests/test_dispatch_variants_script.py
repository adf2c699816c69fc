"""benchmarks/dispatch_variants.py --run on fake CPU devices: one serve-bench process per
variant, each with its environment (recorded in the JSON's config.runtime_env), and the
table of the engine's and the replays' times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "dispatch_variants.py"


def test_runs_each_variant_in_its_environment_and_tabulates(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--run", "--out", str(tmp_path), "--tp", "2",
         "--variants", "base", "no_graphs", "--serve-args",
         "--preset tiny --platform cpu --frontend jax --async-scheduling --no-progress"],
        capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    base = json.loads((tmp_path / "serve_dispatch_tp2_base.json").read_text())
    flags = json.loads((tmp_path / "serve_dispatch_tp2_no_graphs.json").read_text())
    for variant in ("base", "no_graphs"):  # each serve-bench process ran to its end
        log = (tmp_path / f"serve_dispatch_tp2_{variant}.txt").read_text().splitlines()
        assert log[-1] == "exit 0", log[-5:]
    assert base["matches_reference"] and flags["matches_reference"]
    assert base["config"]["tp"] == 2
    assert base["config"]["runtime_env"]["XLA_FLAGS"] == \
        "--xla_force_host_platform_device_count=2"
    assert flags["config"]["runtime_env"]["XLA_FLAGS"] == \
        "--xla_force_host_platform_device_count=2 --xla_gpu_enable_command_buffer="
    rows = json.loads((tmp_path / "dispatch_variants.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["base", "no_graphs"]
    for r in rows:
        assert r["dispatch ms"] > 0 and r["fresh batch ms"] > 0 and r["device step ms"] > 0
    table = (tmp_path / "dispatch_variants.md").read_text()
    assert "| 2 | no_graphs | XLA_FLAGS=--xla_force_host_platform_device_count=2 " \
           "--xla_gpu_enable_command_buffer= |" in table


def test_a_failed_variant_is_listed_with_the_cause(tmp_path):
    (tmp_path / "serve_dispatch_tp2_nccl.txt").write_text(
        "F1125 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --x=\nexit 1\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| 2 | nccl | failed: F1125 parse_flags_from_env.cc:234] Unknown flag in " \
           "XLA_FLAGS: --x= (exit 1) |" in proc.stdout
