#!/usr/bin/env python3
"""The shape of the package in figures (the redesign's before and after, issue 48).

Usage::

    python scripts/code_figures.py [--json]

Prints: the modules over 600 and over 400 lines, the classes over 300 (and 200) lines, the
modules directly in ``wsitool/`` (besides ``__init__`` and ``__main__``), the functions with a
parameter named ``path``, the modules outside ``storage/`` that read a byte source's
``.remote`` / ``.framed``, the modules beyond the edges (outside ``storage/``, ``cli/``,
``slide.py`` and package ``__init__`` files) that name ``storage_options``, and the import
graph's nodes, edges and cycles between sibling modules (grimp, the graph import-linter
builds).  Figures only: the budgets are asserted by tests/test_code_shape.py.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "wsitool"


def _modules() -> list[tuple[str, Path, ast.Module, int]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8")
        out.append((rel, path, ast.parse(text), text.count("\n")))
    return out


def _source_kind_readers(tree: ast.Module) -> bool:
    """Whether the module reads a byte source's ``.remote`` or ``.framed`` (``source.remote``,
    ``level.source.framed``; a slide's own ``Slide.remote``, its remote metadata, is not one)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("remote", "framed") and isinstance(node.ctx, ast.Load):
            base = node.value
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if name in ("source", "src", "_source"):
                return True
    return False


def figures() -> dict:
    mods = _modules()
    lines = {rel: n for rel, _, _, n in mods}
    classes = []
    path_functions = []
    kind_readers = []
    options_namers = []
    for rel, _path, tree, _ in mods:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
                if "path" in names:
                    path_functions.append(f"{rel}:{node.name}")
        inside = rel.split("/")[1]
        if inside != "storage" and _source_kind_readers(tree):
            kind_readers.append(rel)
        edge = inside in ("storage", "cli") or rel in ("wsitool/slide.py",) or rel.endswith("/__init__.py")
        if not edge and "storage_options" in _path.read_text(encoding="utf-8"):
            options_namers.append(rel)
    top = [rel for rel in lines if rel.count("/") == 1 and not rel.endswith(("__init__.py", "__main__.py"))]
    out = {
        "modules": len(mods),
        "lines": sum(lines.values()),
        "modules_over_600": sorted(f"{r} ({n})" for r, n in lines.items() if n > 600),
        "modules_over_400": sorted(f"{r} ({n})" for r, n in lines.items() if n > 400),
        "classes_over_300": sorted(f"{c} ({n})" for n, c in classes if n > 300),
        "classes_over_200": sorted(f"{c} ({n})" for n, c in classes if n > 200),
        "top_level_modules": sorted(top),
        "functions_with_path": len(path_functions),
        "modules_reading_source_kind": sorted(kind_readers),
        "modules_naming_storage_options": sorted(options_namers),
    }
    out.update(_graph())
    return out


def _graph() -> dict:
    try:
        import grimp
    except ImportError:  # (import-linter's graph library: the test extra)
        return {"graph": "grimp is not installed"}
    sys.path.insert(0, str(REPO))
    graph = grimp.build_graph("wsitool", cache_dir=None)
    nodes = sorted(graph.modules)
    edges = sum(len(graph.find_modules_directly_imported_by(m)) for m in nodes)
    cycles = []
    packages = {m.rpartition(".")[0] for m in nodes if "." in m}
    for parent in sorted(packages):
        siblings = [m for m in nodes if m.rpartition(".")[0] == parent]

        def top(module: str, parent: str = parent) -> str:  # the sibling a module belongs to
            return parent + "." + module[len(parent) + 1:].split(".")[0]

        edges_of = {a: set() for a in siblings}
        for module in nodes:
            if not module.startswith(parent + ".") or module == parent:
                continue
            for target in graph.find_modules_directly_imported_by(module):
                if target.startswith(parent + ".") and top(target) != top(module):
                    edges_of.setdefault(top(module), set()).add(top(target))
        cycles += [" <-> ".join(c) for c in _strongly_connected(edges_of) if len(c) > 1]
    return {"graph_nodes": len(nodes), "graph_edges": edges, "sibling_cycles": cycles}


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a small directed graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    data = figures()
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    for key, value in data.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"    {item}")
        else:
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
