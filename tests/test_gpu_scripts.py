"""scripts/gpu/*.sh, the GPU jobs: each parses, documents its usage in its header, and
refuses an unknown choice with exit 2 and a message naming it (nothing runs on a GPU here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
JOBS = sorted(p for p in (ROOT / "scripts" / "gpu").glob("*.sh") if p.name != "common.sh")


def run(script: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", f"scripts/gpu/{script}", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_jobs_are_there():
    assert {p.name for p in JOBS} == {"bench.sh", "gate.sh", "profile.sh", "sanitize.sh",
                                      "serve.sh", "tests.sh", "tp.sh"}


@pytest.mark.parametrize("script", JOBS, ids=lambda p: p.name)
def test_a_job_parses_and_its_header_shows_how_to_call_it(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    header = script.read_text().split("\nsource ")[0]
    assert f"bash scripts/gpu/{script.name} OUT_DIR" in header


@pytest.mark.parametrize("script,choice,message", [
    ("tests.sh", "everything", "unknown part 'everything'"),
    ("bench.sh", "fastest", "unknown benchmark 'fastest'"),
    ("profile.sh", "all", "unknown profile 'all'"),
])
def test_an_unknown_choice_exits_2_naming_it(tmp_path, script, choice, message):
    proc = run(script, choice, out=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stdout + proc.stderr
    assert (tmp_path / "env.txt").exists()  # the machine is recorded before anything runs


@pytest.mark.parametrize("script", ["serve.sh", "tp.sh"])
def test_a_run_list_job_without_runs_says_how_to_call_it(tmp_path, script):
    proc = run(script, out=tmp_path)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_a_job_without_an_output_folder_says_how_to_call_it():
    proc = subprocess.run(["bash", "scripts/gpu/bench.sh"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "usage:" in proc.stderr
