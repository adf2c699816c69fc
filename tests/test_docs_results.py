"""benchmarks/results/ holds the tables the docs cite, and the docs quote them right.

- Only ``benchmarks/results/latest/<card>/`` is kept, at most 2 MB in all.
- Every file there is cited: named as ``latest/<card>/NAME`` by a doc page, a test, a
  script or a benchmark, or by its bare name from a cited results page beside it (a table
  naming its raw data). Git history keeps what nothing cites.
- Every ``latest/<card>/...`` path a doc page names exists.
- The README's headline numbers are the ones the tables it quotes give.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_docs_code_blocks import ROOT, _id, doc_files

RESULTS = ROOT / "benchmarks" / "results"
LATEST = RESULTS / "latest"
MAX_BYTES = 2_000_000
CARD = r"[a-z][a-z0-9]*"  # a card's folder: h100, h200x2, ...; `<card>` names none


def _expand(pattern: str) -> list[str]:
    """``a_{x,y}.md`` -> ``a_x.md``, ``a_y.md`` (one brace group at a time)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [p for alt in m.group(1).split(",")
            for p in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def result_paths(text: str) -> list[str]:
    """The files under benchmarks/results/ a page names (``latest/<card>/...`` included).

    >>> result_paths("see `latest/h200/a_{b,c}.md` and benchmarks/results/latest/h100/x.json.")
    ['benchmarks/results/latest/h200/a_b.md', 'benchmarks/results/latest/h200/a_c.md', \
'benchmarks/results/latest/h100/x.json']
    >>> result_paths("written to latest/<card>/first_call.md")
    []
    """
    found = []
    for m in re.finditer(rf"(?:benchmarks/results/)?latest/{CARD}/[\w.{{}},*-]*[\w}}*]", text):
        path = m.group(0)
        path = path if path.startswith("benchmarks/") else "benchmarks/results/" + path
        found += _expand(path)
    return found


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def results_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


def citing_sources() -> list[Path]:
    """Doc pages, tests, scripts, benchmarks and the package: what may cite a result."""
    found = list(doc_files())
    for folder, patterns in (("tests", ["*.py"]), ("benchmarks", ["*.py", "*.md"]),
                             ("scripts", ["*.py", "*.sh"]), ("src", ["*.py"])):
        for pattern in patterns:
            found += [p for p in (ROOT / folder).rglob(pattern) if RESULTS not in p.parents]
    return [*sorted(set(found)), ROOT / "Makefile"]


def _named(text: str, folder: Path) -> set[Path]:
    """What a results page in ``folder`` names: ``latest/<card>/...`` paths, ``../<card>/NAME``
    and the bare names of the files beside it."""
    names = {ROOT / p for p in result_paths(text)}
    for m in re.finditer(rf"\.\./({CARD})/([\w.{{}},-]*\w)", text):
        names |= {folder.parent / m.group(1) / n for n in _expand(m.group(2))}
    for sibling in folder.iterdir():
        if re.search(rf"(?<![\w/.-]){re.escape(sibling.name)}(?![\w-])", text):
            names.add(sibling)
    return names


def cited_results() -> set[Path]:
    """The results files cited from outside benchmarks/results/, and what those cite in
    turn by name."""
    cited, todo = set(), []
    for source in citing_sources():
        todo += [ROOT / p for p in result_paths(source.read_text(errors="replace"))]
    while todo:
        path = todo.pop()
        if path in cited or not path.is_file():
            continue
        cited.add(path)
        if path.suffix in (".md", ".txt"):
            todo += _named(path.read_text(errors="replace"), path.parent)
    return cited


def test_only_the_latest_results_are_kept():
    assert sorted(p.name for p in RESULTS.iterdir()) == ["latest"]


def test_the_results_are_at_most_2_mb():
    sizes = {_rel(p): p.stat().st_size for p in results_files()}
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert sum(sizes.values()) <= MAX_BYTES, [(p, sizes[p]) for p in largest]


def test_every_results_file_is_cited():
    cited = cited_results() | {LATEST / "README.md"}
    uncited = [_rel(p) for p in results_files() if p not in cited]
    assert not uncited, f"cite these from a doc page, or remove them (git keeps them): {uncited}"


def test_the_results_the_docs_name_exist():
    missing = []
    for page in doc_files():
        for path in result_paths(page.read_text()):
            if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{_id(page)}: {path}")
    assert not missing, missing


def test_a_results_page_cites_the_files_beside_it_by_name(tmp_path):
    card = tmp_path / "h200"
    card.mkdir()
    for name in ("run.md", "run.json", "run_tp2.json", "other.txt"):
        (card / name).write_text("")
    text = "data: `run.json`; see ../h200x2/vllm_{a,b}.md"
    assert _named(text, card) == {card / "run.json", tmp_path / "h200x2" / "vllm_a.md",
                                  tmp_path / "h200x2" / "vllm_b.md"}


# --- the README's headline numbers, from the tables they quote ------------------------------

README = (ROOT / "README.md").read_text()


def tables(path: Path) -> list[list[dict[str, str]]]:
    """The markdown tables of a results page, each a list of rows keyed by column; a repeated
    column name gets its count: ``roof %``, ``roof % 2``."""
    found, lines = [], path.read_text().splitlines()
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and re.match(r"^\|(\s*:?-+:?\s*\|)+$", lines[i + 1])):
            continue
        header, seen = [], {}
        for cell in line.strip("|").split("|"):
            name = cell.strip()
            seen[name] = seen.get(name, 0) + 1
            header.append(name if seen[name] == 1 else f"{name} {seen[name]}")
        rows = []
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            rows.append(dict(zip(header, (c.strip() for c in row.strip("|").split("|")),
                                 strict=True)))
        found.append(rows)
    return found


def number(cell: str) -> float:
    """``1.65x``, ``74.5``, ``99.1%``, ``0.409 (320, 1561)`` -> the first number."""
    return float(re.match(r"[\d.]+", cell).group(0))


def span(values: list[float], digits: int) -> str:
    """``lo–hi`` (or one value) as the README writes it, rounded to ``digits``."""
    lo, hi = (f"{v:.{digits}f}" for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo}–{hi}"


def column(rows: list[dict[str, str]], name: str, **where: str) -> list[float]:
    return [number(r[name]) for r in rows
            if all(r[k.replace("_", " ")] == v for k, v in where.items())]


def test_readme_simple_add_is_simple_add_md():
    (rows,) = tables(LATEST / "h100" / "simple_add.md")
    (row,) = [r for r in rows if r["dtype"] == "f32" and r["elements"] == "2^26"]
    assert (f"{number(row['XLA time / ours']):.2f}x XLA's add at 2^26 f32, "
            f"{number(row['ours / copy bw']):.0f} % of copy bandwidth (H100)") in README


def test_readme_kv_cache_writes_are_fused_kv_md():
    (rows,) = tables(LATEST / "h200" / "fused_kv.md")
    write = [number(r["write fused"]) / number(r["write separate"]) for r in rows]
    assert f"fused-cache write {span(write, 2)}x the separate caches' time (H200)" in README
    blocks16 = [number(r["ratio"]) for r in rows]
    assert f"fused / separate time {span(blocks16, 2)}x at 16-token blocks (H200)" in README


def test_readme_paged_attention_is_paged_attention_md():
    text = (LATEST / "h200" / "paged_attention.md").read_text()
    lo, hi, n = re.search(r"- cudnn / ours: ([\d.]+)x–([\d.]+)x over (\d+) configs", text).groups()
    (rows,) = tables(LATEST / "h200" / "paged_attention.md")
    big = [number(r["% copy bw"]) for r in rows if number(r["KV MB"]) >= 1000]
    assert (f"cuDNN / ours {lo}–{hi}x over {n} configurations, "
            f"{span(big, 0)} % of copy bandwidth at ≥ 1 GB (H200)") in README


def test_readme_ragged_attention_is_ragged_paged_attention_md():
    (rows,) = tables(LATEST / "h200" / "ragged_paged_attention.md")
    d128 = [number(r["best peer / ours"]) for r in rows
            if re.fullmatch(r"prefill \d+x\d+", r["batch"])]
    (mixed,) = [r["best peer / ours"] for r in rows if r["batch"] == "mixed 64 decode + 4x512"]
    assert (f"{span(d128, 2)}x FA3 at head_dim 128 prefill, {mixed} FA3 on a mixed batch "
            "(H200)") in README


def test_readme_sampling_is_sampling_md():
    (rows,) = tables(LATEST / "h200" / "sampling.md")
    at1, at16, at64, at256 = (column(rows, "FI/ours", batch=b) for b in ("1", "16", "64", "256"))
    assert (f"{span(at1, 1)}x FlashInfer's sampling speed at batch 1, {span(at16, 2)}x at 16, "
            f"{span(at64, 2)}x at 64, {span(at256, 2)}x at 256 (H200)" in README)


def test_readme_fused_moe_is_moe_md():
    (rows,) = tables(LATEST / "h200" / "moe.md")
    bf16 = [r for r in rows if r["weights"] == "bf16"]
    mixtral = column(bf16, "x vs ragged_dot", model="mixtral")
    qwen3 = column([r for r in bf16 if r["x vs ragged_dot"] != "-"], "x vs ragged_dot",
                   model="qwen3")
    decode = [number(r["bw %"]) for r in bf16 if (r["model"], r["tokens"]) in {
        ("mixtral", "1"), ("mixtral", "16"), ("mixtral", "64"), ("qwen3", "16"),
        ("qwen3", "64")}]
    assert (f"{span(mixtral, 1)}x `ragged_dot` on Mixtral's layer, {span(qwen3, 1)}x on "
            f"Qwen3's; decode at {span(decode, 0)} % of the weight bandwidth") in README


def test_readme_linear_and_fp8_linear_are_their_tables():
    hopper = tables(LATEST / "h200" / "linear_hopper.md")[0]

    def at(tokens, column):
        return [number(r[column]) for r in hopper if r["tokens"] == tokens]
    assert (f"one token: {span(at('1', 'x xla_dot'), 2)}x XLA's bf16 dot, "
            f"{span(at('1', 'roof %'), 0)} % of the weight-read floor; "
            f"{span(at('64', 'x xla_dot'), 2)}x at 64 tokens") in README
    fp8 = tables(LATEST / "h200" / "fp8_linear_hopper.md")[0]

    def fp8_at(*tokens, column="x xla_dot 2"):  # W8A16; W8A8 is "x xla_dot 3"
        return [number(r[column]) for r in fp8 if r["tokens"] in tokens]
    assert (f"one token: {span(fp8_at('1'), 2)}x XLA's bf16 dot on Llama-3-8B's linears; "
            f"{span(fp8_at('16', '64'), 2)}x at 16–64 tokens; "
            f"W8A8: {span(fp8_at('16', '64', column='x xla_dot 3'), 2)}x") in README


def test_readme_serving_and_vllm_ratios_are_in_their_tables():
    quoted = [  # (table, the README's number, the table's)
        ("h100/serving_1b.md", r"decode tokens/s ([\d.]+x) the same loop with plain-XLA",
         r"plain-XLA attention: ([\d.]+x)\*\*"),
        ("h200/vllm.md", r"decodes at ([\d.]+x)\s+the speed of our own",
         r"\*\*([\d.]+x)\*\* serve-bench's speed"),
        ("h200/vllm.md", r"host share of its step: ([\d.]+ %)", r"host share is\s+([\d.]+ %)"),
        ("h200x2/vllm_tp2.md", r"on two H200s at ([\d.]+x)", r"\*\*([\d.]+x)\*\*"),
    ]
    for path, in_readme, in_table in quoted:
        text = (LATEST / path).read_text()
        assert re.search(in_readme, README).group(1) == re.search(in_table, text).group(1), path
