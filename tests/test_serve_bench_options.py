"""serve-bench's options (tiny preset, CPU): every bad value, of every option, is refused
before anything is built, in one line that names the option and the fix; the engine skips
idle steps, so arrivals far apart do not spin."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from xla_kernels import cli
from xla_kernels.serving.config import EngineConfig
from xla_kernels.serving.engine import Engine, Request

# (argv, the error line after "xla-kernels serve-bench: error: "); {tmp} is a fresh
# directory and {file} a file in it.
CASES = [
    (["--requests", "0"], "--requests 0: must be 1 or more. Fix: pass --requests 1 or more."),
    (["--requests", "1000000"], "--requests 1000000: more than 100000 would run for hours and "
                                "hold every prompt in memory. Fix: pass --requests 100000 or "
                                "less."),
    (["--requests", "x"], "--requests 'x': not a whole number. Fix: pass --requests as "
                          "digits, e.g. --requests 8."),
    (["--prompt-len", "0"], "--prompt-len 0: must be 1 or more. Fix: pass --prompt-len 1 or "
                            "more."),
    (["--prompt-len", "20000"], "--prompt-len 20000: prompts of up to 35000 tokens + 12 new "
                                "tokens exceed the model's context of 32768 tokens. Fix: pass "
                                "--prompt-len 18718 or less, or fewer --new-tokens."),
    (["--new-tokens", "0"], "--new-tokens 0: must be 1 or more. Fix: pass --new-tokens 1 or "
                            "more."),
    (["--new-tokens", "-3"], "--new-tokens -3: must be 1 or more. Fix: pass --new-tokens 1 or "
                             "more."),
    (["--new-tokens", "1000000"], "--new-tokens 1000000: the model's context is 32768 tokens "
                                  "(prompt + output). Fix: pass --new-tokens 32767 or less."),
    (["--new-tokens", "2.5"], "--new-tokens '2.5': not a whole number. Fix: pass --new-tokens "
                              "as digits, e.g. --new-tokens 8."),
    (["--arrival-every", "-1"], "--arrival-every -1: must be 0 or more. Fix: pass "
                                "--arrival-every 0 or more."),
    (["--seed", "-1"], "--seed -1: must be 0 or more. Fix: pass --seed 0 or more."),
    (["--seed", str(2**32)], "--seed 4294967296: must be 4294967295 or less (a 32-bit seed). "
                             "Fix: pass --seed 0 to 4294967295."),
    (["--seed", "one"], "--seed 'one': not a whole number. Fix: pass --seed as digits, e.g. "
                        "--seed 8."),
    (["--max-num-seqs", "0"], "--max-num-seqs 0: must be 1 or more. Fix: pass --max-num-seqs "
                              "1 or more."),
    (["--max-num-seqs", "9"], "--max-num-seqs 9: more than the 8 requests, so never filled. "
                              "Fix: pass --max-num-seqs 8 or less."),
    (["--max-num-seqs", "8", "--token-budget", "4"],
     "token_budget 4 is below max_num_seqs 8: a step could not hold one decode token per "
     "sequence. Fix: raise --token-budget or lower --max-num-seqs."),
    (["--token-budget", "0"], "--token-budget 0: must be 1 or more. Fix: pass --token-budget "
                              "1 or more."),
    (["--token-budget", "100000"], "--token-budget 100000: a step never has more than 216 rows "
                                   "here (4 sequences of up to 54 tokens). Fix: pass "
                                   "--token-budget 216 or less."),
    (["--block-size", "0"], "--block-size 0: the kernels take 16, 32, 64, 128 or 256 tokens "
                            "per block. Fix: pass --block-size 16, 32, 64, 128 or 256."),
    (["--block-size", "8"], "--block-size 8: the kernels take 16, 32, 64, 128 or 256 tokens "
                            "per block. Fix: pass --block-size 16, 32, 64, 128 or 256."),
    (["--num-blocks", "0"], "--num-blocks 0: must be 1 or more. Fix: pass --num-blocks 1 or "
                            "more."),
    (["--num-blocks", "2"], "--num-blocks 2: the longest request (54 tokens) needs 4 blocks of "
                            "16. Fix: pass --num-blocks 4 or more, or leave it unset (every "
                            "admitted request fits)."),
    (["--tp", "0"], "--tp 0: must be >= 1. Fix: pass --tp 1 or more."),
    (["--tp", "two"], "--tp 'two': not a whole number. Fix: pass --tp as digits, e.g. --tp 8."),
    (["--dtype", "float8"], "unknown --dtype 'float8'. Fix: pass --dtype float32, bfloat16 or "
                            "float16."),
    (["--check-dtype", "int8"], "unknown --check-dtype 'int8'. Fix: pass --check-dtype "
                                "float32, bfloat16 or float16."),
    (["--check-dtype", "float16", "--no-reference"],
     "--check-dtype sets the reference check's dtype, which --no-reference skips. Fix: drop "
     "one of them."),
    (["--profile", "{tmp}", "--no-breakdown"],
     "--profile traces the breakdown's replay, which --no-breakdown skips. Fix: drop one of "
     "them."),
    (["--profile", "{file}"], "--profile {file}: is a file. Fix: pass a directory (it is "
                              "created if missing)."),
    (["--json", "{tmp}"], "--json {tmp}: is a directory. Fix: pass a file path, e.g. --json "
                          "out.json."),
    (["--plot", "{tmp}/steps.pdf"], "--plot {tmp}/steps.pdf: unknown format '.pdf'. Fix: end "
                                    "the path in .svg (no dependency) or .png (needs "
                                    "matplotlib)."),
    (["--plot", "{tmp}/plots.svg"], "--plot {tmp}/plots.svg: is a directory. Fix: pass a file "
                                    "path ending in .svg or .png."),
]


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_each_bad_option_is_one_line_naming_it_and_the_fix(argv, message, tmp_path: Path,
                                                            capsys):
    (tmp_path / "plots.svg").mkdir()
    (tmp_path / "trace").write_text("")
    fill = {"tmp": str(tmp_path), "file": str(tmp_path / "trace")}
    argv = [a.format(**fill) for a in argv]
    start = time.perf_counter()
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu", "--no-progress",
                     *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["xla-kernels serve-bench: error: " + message.format(**fill)]
    assert time.perf_counter() - start < 10, "refused only after building the model"


def test_caches_larger_than_the_device_memory_are_refused(capsys):
    assert cli.main(["serve-bench", "--preset", "tiny", "--platform", "cpu",
                     "--num-blocks", str(10**12)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("xla-kernels serve-bench: error: --num-blocks 1000000000000: the "
                             "caches take 30517578.1 GiB, more than the ")
    assert " GiB of the cpu device. Fix: pass --num-blocks " in err[0]
    assert err[0].endswith(" or less, or leave it unset.")


class CountingRunner:
    """Samples 1000 + the step number."""

    def __init__(self):
        self.steps = 0

    def step(self, batch):
        self.steps += 1
        return np.full(batch.kv_lens.shape, 1000 + self.steps, np.int32)


def test_the_engine_skips_idle_steps_up_to_the_next_arrival():
    config = EngineConfig(block_size=16, num_blocks=8, max_num_seqs=2, max_model_len=64,
                          token_budget=16)
    late = 10**7                 # step by step, the idle steps would take many seconds
    engine = Engine(CountingRunner(), config)
    start = time.perf_counter()
    outputs = engine.run([Request(0, [1] * 5, 2), Request(1, [2] * 5, 2, arrival=late)])
    assert time.perf_counter() - start < 2
    assert outputs == {0: [1001, 1002], 1: [1003, 1004]}
    assert [r.index for r in engine.records] == [0, 1, late, late + 1]
