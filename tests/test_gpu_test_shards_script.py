"""scripts/gpu_test_shards.py: a pytest selection dealt over the visible GPUs, one pytest
process per card (CUDA_VISIBLE_DEVICES), every test run once, the counts summed, the
worst exit code returned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "gpu_test_shards.py"

SUITE = textwrap.dedent("""
    import os, pathlib, pytest

    def record(name):
        seen = pathlib.Path(os.environ["XK_SHARD_LOG"]) / name
        seen.write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))

    @pytest.mark.parametrize("i", range(5))
    def test_passes(i):
        record(f"pass{i}")

    def test_fails():
        record("fail")
        assert False, "planted failure"

    def test_skips():
        pytest.skip("planted skip")
""")


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    (suite / "test_planted.py").write_text(SUITE)
    seen = tmp_path / "seen"
    seen.mkdir(exist_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "XK_SHARD_LOG": str(seen)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), *args, "--", "-q",
         "-p", "no:cacheprovider", str(suite / "test_planted.py")],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def test_each_test_runs_once_on_its_shards_card_and_counts_add_up(tmp_path):
    proc = run(tmp_path)                      # two cards visible: two shards
    assert proc.returncode == 1, proc.stdout[-3000:]          # the planted failure
    combined = (tmp_path / "out" / "gpu_tests.txt").read_text()
    assert combined.rstrip().splitlines()[-1] == \
        "all 2 shards: 5 passed, 1 failed, 1 skipped"
    assert "planted failure" in combined
    seen = {p.name: p.read_text() for p in (tmp_path / "seen").iterdir()}
    assert sorted(seen) == ["fail"] + [f"pass{i}" for i in range(5)]
    assert set(seen.values()) == {"0", "1"}   # each shard saw one card only
    for i in (0, 1):
        assert (tmp_path / "out" / f"gpu_tests_shard{i}.txt").exists()


def test_one_shard_is_a_plain_pytest_run(tmp_path):
    proc = run(tmp_path, "--shards", "1")
    assert proc.returncode == 1
    log = (tmp_path / "out" / "gpu_tests.txt").read_text()
    assert "1 failed, 5 passed, 1 skipped" in log
    assert {p.read_text() for p in (tmp_path / "seen").iterdir()} == {"0,1"}


def test_list_gpus_gives_the_cards_this_call_may_use(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "3, 1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--list-gpus"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout == "3 1\n", proc
