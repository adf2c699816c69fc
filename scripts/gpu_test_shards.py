"""Run one pytest selection split over the visible GPUs: one pytest process per GPU, each
seeing only its own card (``CUDA_VISIBLE_DEVICES``), all at once.

The GPU suite outlasts one 10-minute device call on one card; no GPU test needs two cards,
so on a machine with N of them the suite runs in about 1/N of the time. The selection is
collected once (``pytest --collect-only``), its test ids dealt round-robin to the shards
(so each shard gets a like share of every file and parametrization), and each shard's
output is written to ``<prefix>_shard<i>.txt``; the combined log ``<prefix>.txt`` has every
shard's output one after the other and a last line with the summed counts. The exit code
is the worst shard's (0 only if every shard passed). With one GPU (or ``--shards 1``) it is
a plain pytest run.

Example (on the GPU machine; ``scripts/gpu/tests.sh OUT PART`` runs this):
    $ python3 scripts/gpu_test_shards.py --out /tmp/out -- -m gpu -p no:cacheprovider tests/
    $ python3 scripts/gpu_test_shards.py --out /tmp/out --shards 1 -- -m gpu tests/gpu/
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# "3 passed, 1 failed, 2 skipped, 5 deselected in 1.23s" (pytest's last line)
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed|"
                   r"warnings?)\b")
TEST_ID = re.compile(r"^[\w/.\-]+\.py::")      # a line of --collect-only -q
RAN = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
ORDER = ("passed", "failed", "error", "skipped", "deselected", "xfailed", "xpassed",
         "warning")


def deal(test_ids: Sequence[str], shards: int) -> list[list[str]]:
    """``test_ids`` dealt round-robin into ``shards`` lists (empty ones dropped).

    Example:
        >>> deal(["a", "b", "c", "d", "e"], 2)
        [['a', 'c', 'e'], ['b', 'd']]
        >>> deal(["a"], 3)
        [['a']]
    """
    return [s for s in (list(test_ids[i::shards]) for i in range(shards)) if s]


def summary_counts(log: str) -> Counter[str]:
    """The counts of pytest's final summary line in ``log`` (plural forms folded).

    Example:
        >>> dict(summary_counts("...\\n== 3 passed, 1 failed, 2 skipped in 4.5s =="))
        {'passed': 3, 'failed': 1, 'skipped': 2}
        >>> dict(summary_counts("no tests ran in 0.01s"))
        {}
    """
    lines = [line for line in log.splitlines() if re.search(r"\bin [\d.]+s\b", line)]
    if not lines:
        return Counter()
    counts: Counter[str] = Counter()
    for number, word in COUNT.findall(lines[-1]):
        counts[word.rstrip("s") if word in ("errors", "warnings") else word] += int(number)
    return counts


def summary_line(counts: Counter[str], shards: int) -> str:
    """One line with the summed counts, pytest's order.

    Example:
        >>> from collections import Counter
        >>> summary_line(Counter(passed=5, skipped=1), 2)
        'all 2 shards: 5 passed, 1 skipped'
    """
    parts = [f"{counts[k]} {k}" for k in ORDER if counts.get(k)]
    return f"all {shards} shards: " + (", ".join(parts) if parts else "no tests ran")


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPU indices this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else the
    cards ``nvidia-smi -L`` lists (none without a driver)."""
    environ = os.environ if environ is None else environ
    if environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def collect(pytest_args: Sequence[str]) -> list[str]:
    """The test ids ``pytest_args`` selects (``--collect-only -q``); raises
    ``RuntimeError`` with pytest's output if collection fails."""
    quiet = [a for a in pytest_args if not re.fullmatch(r"-[qv]+|--quiet|--verbose", a)]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *quiet],
                          capture_output=True, text=True)   # one -q: one test id a line
    ids = [line for line in proc.stdout.splitlines() if TEST_ID.match(line)]
    if proc.returncode not in (0, 5):           # 5: nothing selected
        raise RuntimeError(f"pytest --collect-only failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return ids


def run_shards(pytest_args: Sequence[str], out: Path, prefix: str, shards: int,
               gpus: Sequence[str]) -> int:
    """Run the selection in ``shards`` concurrent pytest processes (shard i on
    ``gpus[i]``); writes the logs, prints the combined one, returns the worst exit code."""
    out.mkdir(parents=True, exist_ok=True)
    ids = collect(pytest_args)
    options = _options(pytest_args)
    groups = deal(ids, shards)
    with contextlib.ExitStack() as logs:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "pytest", *options, *group],
            stdout=logs.enter_context(open(out / f"{prefix}_shard{i}.txt", "w")),
            stderr=subprocess.STDOUT, env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus[i]})
            for i, group in enumerate(groups)]
        codes = [proc.wait() for proc in procs]
    counts, combined = Counter(), []
    for i in range(len(groups)):
        text = (out / f"{prefix}_shard{i}.txt").read_text()
        counts += summary_counts(text)
        combined.append(f"=== shard {i} (GPU {gpus[i]}, {len(groups[i])} tests, exit "
                        f"{codes[i]})\n{text}")
    line = summary_line(counts, len(groups))
    ran = sum(counts[k] for k in RAN)
    if ran != len(ids):       # a shard crashed or lost tests: say so, fail the run
        line += f"; {len(ids)} collected but {ran} accounted for"
        codes.append(1)
    combined.append(line + "\n")
    (out / f"{prefix}.txt").write_text("\n".join(combined))
    print("\n".join(combined))
    return max(codes, default=5)


def _options(args: Sequence[str]) -> list[str]:
    """``args`` without the positional selection (paths): the options each shard keeps.

    Example:
        >>> _options(["-m", "gpu", "-p", "no:cacheprovider", "tests/", "--durations=15"])
        ['-m', 'gpu', '-p', 'no:cacheprovider', '--durations=15']
    """
    takes_value = {"-m", "-k", "-p", "-W", "-o", "-c", "--rootdir", "--durations"}
    kept = []
    for i, a in enumerate(args):
        if a.startswith("-") or (i and args[i - 1] in takes_value):
            kept.append(a)
    return kept


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the logs (needed to run tests)")
    parser.add_argument("--prefix", default="gpu_tests", help="log name (default gpu_tests)")
    parser.add_argument("--shards", type=int, default=0,
                        help="pytest processes (default: one per visible GPU)")
    parser.add_argument("--list-gpus", action="store_true",
                        help="print the visible GPU indices (one line) and exit")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="after --: pytest's arguments (selection and options)")
    args = parser.parse_args(argv)
    if args.list_gpus:
        print(" ".join(visible_gpus()))
        return 0
    if args.out is None:
        parser.error("--out is required to run tests")
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    gpus = visible_gpus()
    shards = args.shards or max(len(gpus), 1)
    if shards <= 1:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / f"{args.prefix}.txt", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
        return proc.wait()
    gpus = (gpus * shards)[:shards] if gpus else [""] * shards
    return run_shards(pytest_args, args.out, args.prefix, shards, gpus)


if __name__ == "__main__":
    sys.exit(main())
