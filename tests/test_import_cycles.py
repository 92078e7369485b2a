"""No import circles in the `chord` and `humming` packages (docs/architecture.md, "Core and lab").

The graph is read from the source: every import statement of every module, lazy ones inside
functions and ``if TYPE_CHECKING:`` ones included. ``import a.b`` is an edge to module ``a.b``;
``from a import b`` an edge to the submodule ``a.b`` when there is one, else to ``a``. The implicit
import of a parent package (importing ``a.b`` runs ``a/__init__.py`` first) is not an edge: a
package's ``__init__`` importing its own submodules, which import their siblings, is the layering
itself, not a circle."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chord", "humming")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """`name` itself when it is a module of the packages, else its longest prefix that is."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return None


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """{module: the modules of `packages` it imports} for every .py file under root/<package>."""
    files = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]  # the package relative imports start from
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_resolve(a.name, modules) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.add(sub if sub in modules else _resolve(base, modules))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a -> b -> ... -> a) per strongly connected group of two or more modules
    (Tarjan's algorithm, then a shortest way around inside the group)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in groups:
        start = min(group)
        prev = {start: None}
        frontier = [start]
        found = None
        while frontier and found is None:  # breadth first, back to start
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        out.append(path[::-1] + [start])
    return out


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The reader itself: absolute, from-, relative, lazy and TYPE_CHECKING imports are edges,
    and a circle is named module by module."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from p import a\n")
    (pkg / "a.py").write_text("import p.b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n")
    (pkg / "d.py").write_text("from p.sub import c\nimport os\n")
    g = import_graph(tmp_path, ("p",))
    assert g == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.sub.c"}, "p.sub": set(), "p.sub.c": {"p.a"},
                 "p.d": {"p.sub.c"}}
    assert cycles(g) == [["p.a", "p.b", "p.sub.c", "p.a"]]
    (pkg / "sub" / "c.py").write_text("import json\n")
    assert cycles(import_graph(tmp_path, ("p",))) == []


def test_chord_and_humming_have_no_import_circles():
    graph = import_graph()
    assert "humming._chord" in graph and "chord.ops" in graph  # the packages were read
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)
