"""serve-bench --temperature/--top-k/--top-p/--min-p/--sampling-seed (tiny preset, CPU):
tokens drawn through the sample op, reproducible, the same with async scheduling and in
both frontends, each request's tokens independent of the batch; bad values refused in one
line naming the option and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xla_kernels import cli

SAMPLED = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01",
           "--sampling-seed", "5"]


def run(tmp_path: Path, name: str, *argv: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--requests", "6",
                     "--no-reference", "--no-breakdown", "--no-progress", "--json", str(out),
                     *argv]) == 0
    return json.loads(out.read_text())


def test_sampled_tokens_are_reproducible_and_the_same_async_and_in_torchax(tmp_path):
    first = run(tmp_path, "a", *SAMPLED)
    assert first["config"]["sampling"] == {"temperature": 0.8, "top_k": 20, "top_p": 0.9,
                                           "min_p": 0.01, "seed": 5}
    assert run(tmp_path, "b", *SAMPLED)["outputs"] == first["outputs"]
    assert run(tmp_path, "c", *SAMPLED, "--async-scheduling")["outputs"] == first["outputs"]
    assert run(tmp_path, "d", *SAMPLED, "--frontend", "torchax")["outputs"] == first["outputs"]
    greedy = run(tmp_path, "e")
    assert greedy["outputs"] != first["outputs"]
    other_seed = run(tmp_path, "f", *SAMPLED[:-1], "6")
    assert other_seed["outputs"] != first["outputs"]


def test_a_requests_tokens_do_not_depend_on_the_batch(tmp_path):
    """One sequence at a time or six at once: each request draws the same tokens."""
    together = run(tmp_path, "together", *SAMPLED)
    alone = run(tmp_path, "alone", *SAMPLED, "--max-num-seqs", "1")
    assert alone["outputs"] == together["outputs"]


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "-1"], "--temperature -1: must be 0 or more. Fix: pass --temperature 0 "
                              "or more."),
    (["--temperature", "hot"], "--temperature 'hot': not a finite number. Fix: pass "
                               "--temperature as a decimal, e.g. --temperature 0.5."),
    (["--temperature", "1", "--top-p", "1.5", "--no-reference"],
     "--top-p 1.5: must be 0 to 1. Fix: pass --top-p 0 to 1."),
    (["--temperature", "1", "--min-p", "-0.1", "--no-reference"],
     "--min-p -0.1: must be 0 to 1. Fix: pass --min-p 0 to 1."),
    (["--temperature", "1", "--top-k", "-2", "--no-reference"],
     "--top-k -2: must be 0 or more. Fix: pass --top-k 0 or more."),
    (["--temperature", "1", "--top-k", "2.5", "--no-reference"],
     "--top-k '2.5': not a whole number. Fix: pass --top-k as digits, e.g. --top-k 8."),
    (["--temperature", "1", "--sampling-seed", str(2**32), "--no-reference"],
     "--sampling-seed 4294967296: must be 4294967295 or less (a 32-bit seed). Fix: pass "
     "--sampling-seed 0 to 4294967295."),
    (["--top-k", "50"], "--top-k has no effect at --temperature 0 (greedy). Fix: pass "
                        "--temperature above 0 too, or drop --top-k."),
    (["--sampling-seed", "3"], "--sampling-seed has no effect at --temperature 0 (greedy). "
                               "Fix: pass --temperature above 0 too, or drop --sampling-seed."),
    (["--temperature", "0.7"], "--temperature 0.7 draws tokens, and the reference check "
                               "compares greedy tokens. Fix: pass --no-reference, or "
                               "--temperature 0."),
])
def test_bad_sampling_options_are_one_line_errors_with_the_fix(argv, message, capsys):
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--no-progress",
                     *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"xla-kernels serve-bench: error: {message}"]
