"""``.. wsitool-layers::``: the layer table of docs/architecture.md, made from the import-linter
contract in pyproject.toml (``[tool.importlinter]``, the contract whose ``id`` is ``layers``) when
the site is built, so the page cannot drift from what ``lint-imports`` enforces.

Each floor of the contract is a row, top floor first; each of its members (a package or a
module of ``wsitool``; ``(serve)``: an optional member, present where the package is) is
listed with the first sentence of its docstring, and for a package the modules under it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def contract_layers(pyproject: Path = PYPROJECT) -> tuple[str, list[list[str]]]:
    """``(root package, floors)`` of the ``layers`` contract: each floor a list of member names
    (relative to the root), top floor first."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c.get("id") == "layers")
    floors = [[m.strip().strip("()") for m in layer.split("|")] for layer in contract["layers"]]
    return config["root_package"], floors


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring, without reST roles (``:mod:`x``` -> ``x``)."""
    text = " ".join((doc or "").split())
    text = re.sub(r":[a-z]+:`~?([^`<]+?)(?: <[^>]+>)?`", r"\1", text).replace("``", "")
    text = re.sub(r"\s*\(floor [^()]*(?:\([^()]*\)[^()]*)*\)", "", text)  # (the table says the floor)
    m = re.match(r"(.+?[.:])(\s|$)", text)
    return (m.group(1) if m else text).rstrip(":.") + "." if text else ""


def members(root: str, name: str) -> tuple[str, list[str]]:
    """``(first sentence of its docstring, its modules)`` of member ``name`` of ``root``."""
    module = importlib.import_module(f"{root}.{name}")
    inside = []
    if hasattr(module, "__path__"):
        inside = sorted(info.name for info in pkgutil.iter_modules(module.__path__)
                        if not info.name.startswith("_"))
    return first_sentence(module.__doc__), inside


class LayersDirective(SphinxDirective):
    """The table of floors (see the module docstring)."""

    def run(self) -> list[nodes.Node]:
        root, floors = contract_layers()
        self.env.note_dependency(str(PYPROJECT))
        table = nodes.table(classes=["wsitool-layers"])
        group = nodes.tgroup(cols=3)
        table += group
        for width in (8, 18, 74):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        head += self._row(["floor", "package or module", "what it holds"])
        body = nodes.tbody()
        group += body
        for k, floor in enumerate(floors):
            number = str(len(floors) - 1 - k)
            for j, name in enumerate(floor):
                try:
                    sentence, inside = members(root, name)
                except ImportError:  # (an optional member not installed)
                    sentence, inside = "(optional, not installed)", []
                label = f"{name}/" if inside else f"{name}.py"
                more = f" Modules: {', '.join(inside)}." if inside else ""
                body += self._row([number if j == 0 else "", label, sentence + more])
        return [table]

    @staticmethod
    def _row(cells: list[str]) -> nodes.row:
        row = nodes.row()
        for text in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=text)
            row += entry
        return row


def setup(app):
    """Register the directive."""
    app.add_directive("wsitool-layers", LayersDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
