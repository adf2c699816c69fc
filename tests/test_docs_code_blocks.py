"""The code blocks of README.md, CONTRIBUTING.md and docs/ run as written.

Each file's ```python blocks run in order in one fresh process, sharing one namespace (a
page may build on its earlier blocks). A block is compiled under the markdown file's name
with its own line numbers, so a failure points at the page and line. The fence's info
string says how a block runs:

- ```python                 on the CPU (JAX_PLATFORMS=cpu), in CI and on a GPU machine alike;
- ```python gpu             only where JAX sees a GPU (the GPU job), after the page's other
                            blocks (which then run on the GPU too);
- ```python as=PATH         compiled as if it were the file PATH (relative to the repository),
                            so that relative kernel sources resolve next to PATH;
- ```python norun           shown, never run (kept rare: a fragment with `...`).

The ```bash blocks' commands are checked to exist: `make` targets in the Makefile, scripts
and benchmark files, and `xla-kernels` subcommands.

Run one page by hand: python tests/test_docs_code_blocks.py docs/tutorial.md
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
TAGS = {"gpu", "norun"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first code line
    lang: str
    tags: frozenset[str]
    as_path: str | None
    code: str


def doc_files() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in pages if p.exists()]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, with their info strings parsed.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = Path(d) / "x.md"
    ...     _ = p.write_text("text\\n```python gpu\\nx = 1\\n```\\n```bash\\nls\\n```\\n")
    ...     [(b.lang, sorted(b.tags), b.line, b.code) for b in blocks(p)]
    [('python', ['gpu'], 3, 'x = 1\\n'), ('bash', [], 6, 'ls\\n')]
    """
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w+)(.*)$", lines[i])
        if not m:
            i += 1
            continue
        lang, words = m.group(1), m.group(2).split()
        tags = frozenset(w for w in words if "=" not in w)
        as_path = next((w.split("=", 1)[1] for w in words if w.startswith("as=")), None)
        end = i + 1
        while end < len(lines) and lines[end] != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{i + 1}: code block never closed")
        code = "".join(line + "\n" for line in lines[i + 1:end])
        found.append(Block(path, i + 2, lang, tags, as_path, code))
        i = end + 1
    return found


def run_page(path: Path, gpu: bool) -> None:
    """Run a page's python blocks (CPU ones; with ``gpu`` the GPU ones after them)."""
    namespace: dict = {"__name__": "__docs__"}
    page = [b for b in blocks(path) if b.lang == "python" and "norun" not in b.tags]
    chosen = [b for b in page if "gpu" not in b.tags]
    if gpu:
        chosen += [b for b in page if "gpu" in b.tags]
    for block in chosen:
        filename = str(ROOT / block.as_path) if block.as_path else str(path)
        source = "\n" * (block.line - 1) + block.code
        print(f"--- {path}:{block.line}", flush=True)
        exec(compile(source, filename, "exec"), namespace)


def _run_in_subprocess(path: Path, gpu: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if not gpu:
        env["JAX_PLATFORMS"] = "cpu"  # CPU blocks run on the CPU, on a GPU machine too
    args = [sys.executable, __file__, str(path)] + (["--gpu"] if gpu else [])
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, flags=re.M))


def _cli_commands() -> set[str]:
    from xla_kernels import cli

    sub = next(a for a in cli._parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(sub.choices)


def command_problems(block: Block, targets: set[str], commands: set[str]) -> list[str]:
    """What a bash block names that does not exist (a make target, a file, a subcommand)."""
    problems = []
    text = block.code.replace("\\\n", " ")
    for offset, raw in enumerate(text.splitlines()):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # leading VAR=value assignments
        if not words:
            continue
        where = f"{block.path.name}:{block.line + offset}"
        if words[0] == "make":
            for target in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
                if target not in targets:
                    problems.append(f"{where}: no make target {target!r}")
        elif words[0] in ("bash", "python", "python3") or words[0].endswith("/python"):
            script = next((w for w in words[1:] if not w.startswith("-")), None)
            if words[1:2] == ["-m"] or script is None:
                continue
            if "/" in script and not (ROOT / script).exists():
                problems.append(f"{where}: no file {script!r}")
        elif (words[0] == "xla-kernels" and len(words) > 1 and not words[1].startswith("-")
              and words[1] not in commands):
            problems.append(f"{where}: no xla-kernels command {words[1]!r}")
    return problems


# --- the tests ----------------------------------------------------------------------------

import pytest  # noqa: E402

PAGES = doc_files()
PYTHON_PAGES = [p for p in PAGES
                if any(b.lang == "python" and not b.tags & {"gpu", "norun"} for b in blocks(p))]
GPU_PAGES = [p for p in PAGES if any(b.lang == "python" and "gpu" in b.tags for b in blocks(p))]


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_python_block_has_known_tags():
    bad = [f"{_id(b.path)}:{b.line}: {sorted(b.tags - TAGS)}" for p in PAGES
           for b in blocks(p) if b.lang == "python" and b.tags - TAGS]
    assert not bad, bad


def test_the_readme_and_the_tutorial_have_blocks_that_run():
    assert ROOT / "README.md" in PYTHON_PAGES
    assert ROOT / "docs" / "tutorial.md" in PYTHON_PAGES


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_id)
def test_python_blocks_run_on_the_cpu(page):
    done = _run_in_subprocess(page)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-6000:])


@pytest.mark.gpu
@pytest.mark.parametrize("page", GPU_PAGES, ids=_id)
def test_gpu_blocks_run_on_the_gpu(page):
    done = _run_in_subprocess(page, gpu=True)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-6000:])


def test_kernel_pages_show_torch_op_before_naming_its_operator():
    """`torch.ops.xla_kernels.X` exists once `torch_op(X)` ran in the process (see the
    next test): a kernel page that names the operator shows `torch_op(X)` first."""
    problems = []
    for page in sorted((ROOT / "docs" / "kernels").glob("*.md")):
        text = page.read_text()
        for m in re.finditer(r"torch\.ops\.xla_kernels\.(\w+)", text):
            if not 0 <= text.find(f"torch_op({m.group(1)})") < m.start():
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{_id(page)}:{line}: {m.group(0)} before torch_op({m.group(1)})")
    assert not problems, problems


def test_a_torch_operator_exists_once_torch_op_ran():
    code = ("import torch\nimport xla_kernels.frontends.torch as xt\n"
            "from xla_kernels.kernels.simple_add import simple_add\n"
            "assert not hasattr(torch.ops.xla_kernels, 'simple_add')\n"
            "xt.torch_op(simple_add)\n"
            "print(torch.ops.xla_kernels.simple_add(torch.ones(2), torch.ones(2)).tolist())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.strip() == "[2.0, 2.0]", done.stderr[-3000:]


def test_a_failing_block_fails_the_page_and_names_its_line(tmp_path):
    page = tmp_path / "broken.md"
    page.write_text("# broken\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'no'\n```\n")
    done = _run_in_subprocess(page)
    assert done.returncode != 0
    assert f'File "{page}", line 8' in done.stderr and "AssertionError: no" in done.stderr


def test_bash_blocks_name_commands_that_exist():
    targets, commands = _make_targets(), _cli_commands()
    problems = [p for page in PAGES for b in blocks(page) if b.lang == "bash"
                for p in command_problems(b, targets, commands)]
    assert not problems, problems


def test_command_check_can_fail(tmp_path):
    page = tmp_path / "cmds.md"
    page.write_text("```bash\nmake nothing-here\nbash scripts/none.sh\nxla-kernels fly\n```\n")
    (block,) = blocks(page)
    block = Block(ROOT / "x.md", block.line, block.lang, block.tags, None, block.code)
    problems = command_problems(block, _make_targets(), _cli_commands())
    assert len(problems) == 3, problems


def test_the_readme_installs_from_a_clone_first():
    """A newcomer has a clone, not a wheel: the first commands are `make demo`, and the wheel
    comes from `make wheel` before it is installed."""
    first, *rest = [b for b in blocks(ROOT / "README.md") if b.lang == "bash"]
    assert first.code.lstrip().startswith("make demo") and "pip install" not in first.code
    wheel = next(b.code for b in rest if ".whl" in b.code)
    assert wheel.index("make wheel") < wheel.index("pip install dist/")


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_tutorials_complete_handlers_are_the_ones_it_runs():
    """A ```cpp block of the tutorial that defines a handler without eliding its body is
    the code its ops run, verbatim (so the page shows what was tested)."""
    source = (ROOT / "examples" / "tutorial" / "tutorial_ops.cc").read_text()
    shown = [b for b in blocks(ROOT / "docs" / "tutorial.md") if b.lang == "cpp"
             and "XLA_FFI_DEFINE_HANDLER_SYMBOL" in b.code and "{ ... }" not in b.code]
    assert shown, "the tutorial shows no complete handler"
    for block in shown:
        assert block.code.strip() in source, f"docs/tutorial.md:{block.line}"


if __name__ == "__main__":
    run_page(Path(sys.argv[1]).resolve(), gpu="--gpu" in sys.argv[2:])
