"""The import graph of ``src/xla_kernels``: no circle, and imports move forward only.

Every module is parsed with :mod:`ast` (nothing is imported). An edge ``a -> b`` is an import of
``b`` written in ``a``: at module level, or inside a function (``a ~> b``, run later but still a
dependency: a function-level import that closes a circle is a circle). Imports under
``if TYPE_CHECKING:`` never run and are not edges. ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``); the parent packages that
Python initialises on the way are not edges (every module would otherwise depend on
``xla_kernels/__init__``).

Run as a script to print the graph's circles and the layering findings.
"""

from __future__ import annotations

import ast
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "xla_kernels"

# Modules outside frontends/ allowed to import a frontend, with the reason. Integrations and
# tools sit on top of the core and use the ops the way a user does; the core has one door.
FRONTEND_USERS = {
    "xla_kernels.op": "Op.__call__ runs the op on JAX arrays: it is frontends.jax.call, named "
                      "(frontends.jax imports op for type annotations only)",
    "xla_kernels.cli": "`xla-kernels doctor` reports whether torchax imports and which "
                       "torch dispatcher library a torch call would load",
    "xla_kernels.aot": "`xla-kernels build --aot xla_kernels` prebuilds the torch dispatcher "
                       "library against the running torch",
    "xla_kernels.serving": "the serving loop is a user of the torchax frontend (model_torch)",
}

# Modules that must not import torch (at module level or inside a function).
NO_TORCH = ("xla_kernels.builder",)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    deferred: bool  # inside a function
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(node, deferred) for every import that runs, skipping ``if TYPE_CHECKING:`` bodies."""
    def walk(node: ast.AST, deferred: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    yield from walk(other, deferred)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, deferred
            inner = deferred or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from walk(child, inner)
    yield from walk(tree, False)


def _resolve_from(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges(known: dict[str, Path] | None = None) -> list[Edge]:
    known = modules() if known is None else known
    found: list[Edge] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node, deferred in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve_from(node, name, is_package)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known else base)
            for target in targets:
                while target and target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name:
                    found.append(Edge(name, target, deferred, node.lineno))
    return found


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _shortest_path(graph: dict[str, set[str]], start: str, goal: str,
                   within: set[str]) -> list[str]:
    previous = {start: start}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & within):
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
        if goal in previous:
            break
    path = [goal]
    while path[-1] != start:
        path.append(previous[path[-1]])
    return path[::-1]


def cycles(found: list[Edge], *, deferred: bool) -> list[str]:
    """One shortest circle through every edge that lies on a circle, written ``a -> b -> a``
    (``~>`` marks a function-level import). ``deferred=False``: module-level imports only;
    ``deferred=True``: the circles that only exist once function-level imports are counted."""
    names = {e.source for e in found} | {e.target for e in found}
    graph: dict[str, set[str]] = {n: set() for n in names}
    kinds: dict[tuple[str, str], bool] = {}
    for e in found:
        if e.deferred and not deferred:
            continue
        graph[e.source].add(e.target)
        kinds[e.source, e.target] = kinds.get((e.source, e.target), True) and e.deferred
    seen: set[tuple[str, ...]] = set()
    written: list[str] = []
    for component in _sccs(graph):
        within = set(component)
        for source in component:
            for target in sorted(graph[source] & within):
                path = [source, *_shortest_path(graph, target, source, within)]
                hops = list(itertools.pairwise(path))
                if deferred and not any(kinds[h] for h in hops):
                    continue  # a module-level circle, reported by deferred=False
                turn = min(range(len(path) - 1), key=lambda i: path[i])
                key = tuple(path[turn:-1] + path[:turn])
                if key in seen:
                    continue
                seen.add(key)
                text = key[0]
                for a, b in zip(key, (*key[1:], key[0]), strict=False):
                    text += (" ~> " if kinds[a, b] else " -> ") + b
                written.append(text)
    return written


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def frontend_imports_outside_frontends(found: list[Edge]) -> list[str]:
    bad = []
    for e in found:
        if not _within(e.target, f"{PACKAGE}.frontends") or e.target == f"{PACKAGE}.frontends":
            continue
        if _within(e.source, f"{PACKAGE}.frontends"):
            continue
        allowed = any(e.source == m or (m != PACKAGE and _within(e.source, m))
                      for m in FRONTEND_USERS)
        if not allowed:
            bad.append(f"{e.source}:{e.line} imports {e.target}")
    return bad


def frontend_imports_another(found: list[Edge]) -> list[str]:
    """``frontends/<a>`` never imports ``frontends/<b>``, but for the named exceptions: torchax
    lowers the torch operator (``frontends/torch/operator.py``) to the JAX call, and
    torch_xla gives the same torch operator its XLA kernel; ``jax_partitioning`` is the JAX
    frontend's sharding half, one frontend in two files."""
    allowed = {("torchax", "jax"), ("torchax", "torch"), ("torch_xla", "torch"),
               ("jax", "jax_partitioning")}
    bad = []
    prefix = f"{PACKAGE}.frontends."
    for e in found:
        if not (e.source.startswith(prefix) and e.target.startswith(prefix)):
            continue
        a = e.source[len(prefix):].split(".")[0]
        b = e.target[len(prefix):].split(".")[0]
        if a != b and (a, b) not in allowed:
            bad.append(f"{e.source}:{e.line} imports {e.target}")
    return bad


def torch_imports(known: dict[str, Path], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for name, path in known.items():
        if not any(_within(name, f) for f in forbidden):
            continue
        for node, _ in _imports(ast.parse(path.read_text(), str(path))):
            roots = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if not node.level else [])
            if any(r == "torch" or r.startswith(("torch.", "torch_xla", "torchax"))
                   for r in roots):
                bad.append(f"{name}:{node.lineno} imports {', '.join(roots)}")
    return bad


def test_the_parser_sees_both_kinds_of_import():
    found = edges()
    assert len(found) > 100
    assert any(e.deferred for e in found) and any(not e.deferred for e in found)
    assert not any(e.source == e.target for e in found)


def test_no_module_level_import_circle():
    found = cycles(edges(), deferred=False)
    assert not found, "module-level import circles:\n" + "\n".join(found)


def test_no_function_level_import_closes_a_circle():
    found = cycles(edges(), deferred=True)
    assert not found, "circles closed by a function-level import (~>):\n" + "\n".join(found)


def test_only_listed_integrations_import_a_frontend():
    found = frontend_imports_outside_frontends(edges())
    assert not found, "\n".join(found)
    users = {e.source for e in edges()
             if _within(e.target, f"{PACKAGE}.frontends") and e.target != f"{PACKAGE}.frontends"}
    stale = [m for m in FRONTEND_USERS if not any(_within(u, m) for u in users)]
    assert not stale, f"listed but importing no frontend (drop them): {stale}"


def test_no_frontend_imports_another():
    found = frontend_imports_another(edges())
    assert not found, "\n".join(found)


def test_the_builder_imports_no_torch():
    found = torch_imports(modules(), NO_TORCH)
    assert not found, "\n".join(found)


def test_the_cycle_finder_reports_a_circle():
    found = [Edge("a", "b", False, 1), Edge("b", "c", True, 1), Edge("c", "a", False, 1),
             Edge("c", "d", False, 1)]
    assert cycles(found, deferred=False) == []
    assert cycles(found, deferred=True) == ["a -> b ~> c -> a"]


if __name__ == "__main__":
    graph = edges()
    report = {
        "module-level circles": cycles(graph, deferred=False),
        "circles closed by a function-level import": cycles(graph, deferred=True),
        "frontend imported outside frontends/": frontend_imports_outside_frontends(graph),
        "a frontend imports another": frontend_imports_another(graph),
        "torch in the builder": torch_imports(modules(), NO_TORCH),
    }
    for title, lines in report.items():
        print(f"{title}: {len(lines)}")
        for line in lines:
            print("  " + line)
    sys.exit(1 if any(report.values()) else 0)
