"""benchmarks/ncu_summary.py on real Nsight Compute exports kept under tests/fixtures/ncu/
(an H100 profile of the ragged kernel against FA3 on chunked 8 x 512 of 8192): the numbers
docs/design/ragged_paged_attention.md quotes come back out, the details page is refused with
its fix, and the command line works."""

from __future__ import annotations

import doctest
import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from xla_kernels.bench import load_script

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "benchmarks" / "ncu_summary.py"
FIXTURES = ROOT / "tests" / "fixtures" / "ncu"
RAGGED = FIXTURES / "ragged_chunked_ours_vs_fa3_raw.csv.gz"
DETAILS = FIXTURES / "decode_details_page.csv.gz"

ncu_summary = load_script(SCRIPT)


def test_doctests_pass():
    assert doctest.testmod(ncu_summary).failed == 0


def test_ragged_profile_gives_the_numbers_performance_md_quotes():
    # docs/design/ragged_paged_attention.md, the profile: ours 1.34 ms, FA3 1.06 ms; tensor
    # pipe 51.3 % vs 65.2 %; 371 M vs 308 M warp instructions; short scoreboard 1.42 vs 0.61,
    # long scoreboard 1.13 vs 0.98, mio throttle 0.53 vs 0.28 stalls per issue.
    rows = ncu_summary.kernel_rows(ncu_summary.raw_table(RAGGED))
    by_name = {ncu_summary.short_name(r["kernel"]).split("<")[0]: r for r in rows}
    ours, fa3 = by_name["ragged_wgmma_kernel"], by_name["device_kernel"]
    assert ours["µs"] == pytest.approx(1343.36) and fa3["µs"] == pytest.approx(1055.552)
    assert (round(ours["tensor %"], 1), round(fa3["tensor %"], 1)) == (51.3, 65.2)
    assert (round(ours["inst M"]), round(fa3["inst M"])) == (371, 308)
    for reason, (a, b) in {"short_scoreboard": (1.42, 0.61), "long_scoreboard": (1.13, 0.98),
                           "mio_throttle": (0.53, 0.28)}.items():
        assert round(ours["stall_ratios"][reason], 2) == a
        assert round(fa3["stall_ratios"][reason], 2) == b
    assert "selected" not in ours["stall_ratios"]
    assert ours["regs"] == 168 and ours["grid"] == "(138, 8, 1)"
    # DRAM: 321.93 MB read + 32.37 MB written in 1343.36 µs.
    assert ours["DRAM GB/s"] == pytest.approx((321.928448 + 32.368384) / 1.34336, rel=1e-9)
    # Five kernels, in the report's order (the zero fill, ours, XLA's gather, FA3's two).
    assert len(rows) == 5


def test_table_filters_kernels_and_orders_stalls(tmp_path):
    text = ncu_summary.table([RAGGED], kernels="wgmma", stalls=2)
    lines = text.splitlines()
    assert len(lines) == 3 and "ragged_wgmma_kernel<__nv_bfloat16, 128, 64>" in lines[2]
    assert lines[2].endswith("| wait 1.87, short_scoreboard 1.42 |")
    plain = tmp_path / "raw.csv"
    plain.write_bytes(gzip.decompress(RAGGED.read_bytes()))
    assert ncu_summary.table([plain], kernels="wgmma", stalls=2).replace(
        "raw.csv", RAGGED.name) == text


def test_details_page_and_non_reports_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ncu_summary.NcuReportError, match=r"details page; export the raw page "
                       r"\(ncu --import REPORT --page raw --csv\)"):
        ncu_summary.raw_table(DETAILS)
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    with pytest.raises(ncu_summary.NcuReportError, match="no ncu table"):
        ncu_summary.raw_table(junk)


def test_command_line_writes_the_table_and_exits_1_on_a_bad_report(tmp_path):
    out = tmp_path / "summary.md"
    done = subprocess.run([sys.executable, str(SCRIPT), str(RAGGED), "--kernels", "Flash",
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == done.stdout and "| 65.2 |" in done.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), str(DETAILS)], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("ncu_summary: ")
