"""scripts/repack_flashinfer_wheel.py: its doctests, a planted wheel repacked through the
command line (dropped members and their RECORD lines gone, the rest byte for byte), the
messages of its refusals, and no needed source under a dropped prefix."""

from __future__ import annotations

import doctest
import subprocess
import sys
import zipfile
from pathlib import Path

from xla_kernels.bench import load_script

SCRIPT = Path(__file__).parents[1] / "scripts" / "repack_flashinfer_wheel.py"

repack_flashinfer_wheel = load_script(SCRIPT)


def test_doctests_pass():
    assert doctest.testmod(repack_flashinfer_wheel).failed == 0


def test_drops_the_unused_sources_and_keeps_the_rest(tmp_path):
    wheel = tmp_path / "in" / "flashinfer_python-0.7.2.post1-py3-none-any.whl"
    wheel.parent.mkdir()
    kept = {"flashinfer/__init__.py": b"x = 1\n",
            **{name: name.encode() * 5 for name in repack_flashinfer_wheel.needed_members()}}
    drop = repack_flashinfer_wheel.DROP
    dropped = {drop[0] + "gen.cu": b"s" * 500, drop[-1] + "k.cu": b"k" * 500}
    record = "".join(f"{name},sha256=x,1\n" for name in [*kept, *dropped])
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in {**kept, **dropped}.items():
            z.writestr(name, data)
        z.writestr("flashinfer_python-0.7.2.post1.dist-info/RECORD", record)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "2 files dropped" in proc.stdout
    with zipfile.ZipFile(tmp_path / "out" / wheel.name) as z:
        assert {name: z.read(name) for name in kept} == kept
        assert not set(dropped) & set(z.namelist())
        lines = z.read("flashinfer_python-0.7.2.post1.dist-info/RECORD").decode().splitlines()
    assert [line.split(",")[0] for line in lines] == list(kept)


def test_refuses_to_drop_a_needed_source(tmp_path):
    wheel = tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("flashinfer/__init__.py", "x = 1\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(tmp_path / "out"),
                           "--needs", "sampling"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "needed but missing or dropped: flashinfer/data/csrc/sampling.cu" in proc.stderr
    assert not (tmp_path / "out" / wheel.name).exists()


def test_no_needed_source_is_dropped():
    needed = repack_flashinfer_wheel.needed_members()
    assert not [name for name in needed if name.startswith(repack_flashinfer_wheel.DROP)]


def test_refuses_a_missing_wheel_and_overwriting_its_input(tmp_path):
    missing = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "no.whl"),
                              str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "no wheel at" in missing.stderr and "Fix: pip download it first" in missing.stderr
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("a.py", "a")
    same = subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert same.returncode == 1 and "would overwrite the input" in same.stderr
    assert zipfile.ZipFile(wheel).namelist() == ["a.py"]
