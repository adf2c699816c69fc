"""Nsight Compute's raw metrics of a profile as one short row per kernel (markdown).

The numbers the kernels' design notes (``docs/design/``) check their predictions against, read from
``ncu``'s raw page (one row per profiled kernel, one column per metric): duration,
registers, DRAM bytes and GB/s, how busy the issue slots and the tensor pipe were, warps
resident per SM, warp instructions executed, and the largest stall reasons (warps stalled
per issued instruction, ``selected`` left out: it is 1 by definition).

A report is an ``.ncu-rep`` (exported with ``ncu --import REPORT --page raw --csv``, so
``ncu`` must be on the PATH) or that export saved as ``.csv`` / ``.csv.gz``.

Example:
    $ python benchmarks/ncu_summary.py /tmp/decode.ncu-rep --kernels paged_attention_main
    | report | kernel | grid | µs | regs | DRAM GB/s | issue % | tensor % | warps/SM | ...
    $ python benchmarks/ncu_summary.py \\
        tests/fixtures/ncu/ragged_chunked_ours_vs_fa3_raw.csv.gz --stalls 3
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
import subprocess
from pathlib import Path
from typing import Any

TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
              "msecond": 1e3, "s": 1e6, "second": 1e6}
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
# label -> metric whose value is shown as is (the percentages and counts of the table)
PLAIN = {
    "regs": "launch__registers_per_thread",
    "issue %": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "tensor %": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "warps/SM": "sm__warps_active.avg.per_cycle_active",
}
COLUMNS = ("grid", "block", "µs", "regs", "DRAM GB/s", "issue %", "tensor %", "warps/SM",
           "inst M", "stalls")


class NcuReportError(ValueError):
    """A report that is not ncu's raw page (or cannot be exported)."""


def number(text: str) -> float | None:
    """ncu's printed number (thousands separators allowed) as a float; None when empty.

    Example:
        >>> number("2,711,412"), number("0.38"), number("")
        (2711412.0, 0.38, None)
    """
    text = text.strip().replace(",", "")
    if not text or text == "n/a":
        return None
    try:
        return float(text)
    except ValueError:
        return None


def raw_table(report: Path) -> list[list[str]]:
    """The raw page's CSV rows of ``report`` (header, units, then one row per kernel)."""
    if report.suffix == ".ncu-rep":
        done = subprocess.run(["ncu", "--import", str(report), "--page", "raw", "--csv"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NcuReportError(f"ncu --import {report} failed: {done.stderr.strip()[-300:]}")
        text = done.stdout
    elif report.name.endswith(".gz"):
        text = gzip.decompress(report.read_bytes()).decode()
    else:
        text = report.read_text()
    rows = list(csv.reader(io.StringIO(text)))
    # ncu may print "==PROF==" lines before the table: start at the header.
    start = next((i for i, r in enumerate(rows) if r[:1] == ["ID"]), None)
    if start is None or "Kernel Name" not in rows[start]:
        raise NcuReportError(f"{report}: no ncu table (a header row starting with \"ID\")")
    if "Metric Name" in rows[start]:
        raise NcuReportError(f"{report}: this is ncu's details page; export the raw page "
                             "(ncu --import REPORT --page raw --csv)")
    return rows[start:]


def kernel_rows(rows: list[list[str]]) -> list[dict[str, Any]]:
    """One dict per profiled kernel: the table's fields (see ``COLUMNS``) plus ``kernel``.

    Example:
        >>> rows = [["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum"],
        ...         ["", "", "", "", "ms"], ["0", "k<int>(Args)", "(8, 1, 1)", "(128, 1, 1)",
        ...         "1.5"]]
        >>> kernel_rows(rows)[0]["µs"]
        1500.0
    """
    header, units = rows[0], rows[1]
    col = {name: i for i, name in enumerate(header)}
    stall_metrics = [(m.group(1), name) for name in header
                     if (m := STALL.match(name)) and m.group(1) != "selected"]

    def value(row: list[str], metric: str, unit_scale: dict[str, float] | None = None
              ) -> float | None:
        """``metric``'s number in ``row``; with ``unit_scale``, times its unit's factor
        (None for a unit the table does not know)."""
        if metric not in col:
            return None
        v = number(row[col[metric]])
        if v is None or unit_scale is None:
            return v
        unit = units[col[metric]]
        return v * unit_scale[unit] if unit in unit_scale else None

    out = []
    for row in rows[2:]:
        if len(row) != len(header):
            continue
        us = value(row, "gpu__time_duration.sum", TIME_UNITS)
        moved = [value(row, m, BYTE_UNITS)
                 for m in ("dram__bytes_read.sum", "dram__bytes_write.sum")]
        inst = value(row, "smsp__inst_executed.sum")
        stalls = sorted(((reason, v) for reason, name in stall_metrics
                         if (v := value(row, name)) is not None), key=lambda kv: -kv[1])
        entry: dict[str, Any] = {
            "kernel": row[col["Kernel Name"]], "grid": row[col.get("Grid Size", 0)],
            "block": row[col.get("Block Size", 0)], "µs": us,
            "DRAM GB/s": (sum(moved) / us / 1e3 if us and None not in moved else None),
            "inst M": None if inst is None else inst / 1e6, "stall_ratios": dict(stalls)}
        entry.update({label: value(row, metric) for label, metric in PLAIN.items()})
        out.append(entry)
    return out


def short_name(kernel: str, width: int = 80) -> str:
    """A kernel's demangled name without ``void``, namespaces and its argument list.

    Example:
        >>> short_name("void xla_kernels::paged_attention_main<__nv_bfloat16, 128, "
        ...            "xla_kernels::MmaCore<__nv_bfloat16, 128>>(xla_kernels::KernelArgs)")
        'paged_attention_main<__nv_bfloat16, 128, MmaCore<__nv_bfloat16, 128>>'
    """
    name = re.sub(r"^void ", "", kernel)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the argument list: the first "(" outside template brackets
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            cut = i
            break
    name = re.sub(r"\b[A-Za-z_]\w*::", "", name[:cut])
    return name if len(name) <= width else name[: width - 1] + "…"


def cell(v: Any) -> str:
    """A table cell: whole numbers as integers, other floats to three significant figures
    (one decimal from 10 up, none from 1000 up), ``-`` for a missing value.

    Example:
        >>> [cell(168.0), cell(51.339), cell(1.4163), cell(1343.36), cell(None)]
        ['168', '51.3', '1.42', '1343', '-']
    """
    if v is None:
        return "-"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table(reports: list[Path], kernels: str | None = None, stalls: int = 4) -> str:
    """The markdown table of every kernel (matching the ``kernels`` regex) of ``reports``."""
    lines = ["| report | kernel | " + " | ".join(COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for report in reports:
        for k in kernel_rows(raw_table(report)):
            if kernels and not re.search(kernels, k["kernel"]):
                continue
            top = ", ".join(f"{n} {v:.2f}" for n, v in list(k["stall_ratios"].items())[:stalls])
            cells = [cell(k[c]) for c in COLUMNS[:-1]] + [top or "-"]
            lines.append(f"| {report.name} | {short_name(k['kernel'])} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path,
                        help=".ncu-rep, or its raw page exported as .csv / .csv.gz")
    parser.add_argument("--kernels", help="only kernels whose name matches this regex")
    parser.add_argument("--stalls", type=int, default=4, help="stall reasons shown per kernel")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    try:
        text = table(args.reports, args.kernels, args.stalls)
    except (NcuReportError, OSError) as e:
        raise SystemExit(f"ncu_summary: {e}") from None
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
