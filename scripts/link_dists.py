"""Hard-link installed distributions from this interpreter's site-packages into another's.

    python scripts/link_dists.py TARGET_SITE_PACKAGES torch

links every file that `torch` and the distributions it requires (transitively, markers
evaluated for this interpreter) recorded in their RECORD, dist-info included, so that pip in
the target environment sees them installed and downloads nothing. The wheel matrix uses it to
give a fresh venv the torch of `.venv` without a second copy of its ~5 GB: a hard link costs
no disk, and pip replaces files (unlink, then write) rather than writing into them, so
installing over a linked file in one venv leaves the other's intact.

Only files under site-packages are linked (console scripts carry the source venv's
interpreter in their first line). Both directories must be on one file system.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import sys
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement


def dependency_closure(names: list[str]) -> list[md.Distribution]:
    """The named distributions and everything they require here, each once."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = md.distribution(name)
        seen[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def link_distribution(dist: md.Distribution, target: Path) -> int:
    site = Path(dist.locate_file(""))
    count = 0
    for rel in dist.files or []:
        if ".." in rel.parts:
            continue
        source = site / rel
        if not source.is_file():
            continue  # RECORD also names .pyc files that were never written
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.unlink()
        os.link(source, dest)
        count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="the other environment's site-packages")
    parser.add_argument("names", nargs="+", help="distributions to link, with their requirements")
    args = parser.parse_args()
    if not args.target.is_dir():
        parser.error(f"{args.target} is not a directory")
    dists = dependency_closure(args.names)
    files = sum(link_distribution(d, args.target) for d in dists)
    names = ", ".join(sorted(f"{d.metadata['Name']}=={d.version}" for d in dists))
    print(f"linked {files} files of {len(dists)} distributions: {names}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
