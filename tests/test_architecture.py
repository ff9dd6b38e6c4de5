"""The layers of the package (pyproject.toml [tool.importlinter]): the import graph is a DAG.

``lint-imports`` checks the contract on the real package; a copy of the package
with one deliberate back-edge (a ground-floor module importing the facade)
must make it fail, so the contract is known to bite.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from helpers import REPO


def _lint(cwd, extra_path=None) -> subprocess.CompletedProcess:
    env = None
    if extra_path is not None:
        import os

        env = dict(os.environ, PYTHONPATH=str(extra_path))
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_layers_contract_is_kept():
    res = _lint(REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken" in res.stdout


def test_a_back_edge_breaks_the_contract(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(REPO / "wsitool", copy / "wsitool",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    geometry = copy / "wsitool" / "ground" / "geometry.py"
    geometry.write_text(geometry.read_text() + "\nfrom ..slide import Slide  # deliberate back-edge\n")
    res = _lint(copy, extra_path=copy)
    assert res.returncode != 0
    assert "wsitool.ground is not allowed to import wsitool.slide" in res.stdout
    assert "wsitool.ground.geometry -> wsitool.slide" in res.stdout


def test_consumers_reopen_slides_from_their_public_location():
    """distributed/ reads a slide's public ``location`` and ``identity`` (issue 48 item 1), not the
    private fields of :class:`wsitool.Slide` it read to reopen a slide elsewhere."""
    import re

    private = re.compile(r"\b(?:s|slide|src)\._(?:location|source|storage_options)\b")
    found = [f"{path.relative_to(REPO)}:{no}" for path in sorted((REPO / "wsitool" / "distributed").rglob("*.py"))
             for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if private.search(line)]
    assert not found, found


def test_one_module_sorts_locations():
    """Only wsitool.opening.location asks the storage layer what a location is (a DICOMweb series,
    a bucket prefix): the facade and the consumers get a typed location from it."""
    import ast

    def asks(path) -> bool:  # (code that imports or calls them; a docstring naming them does not count)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                     else [node.id] if isinstance(node, ast.Name)
                     else [node.attr] if isinstance(node, ast.Attribute) else [])
            if {"parse_series_url", "is_prefix_url"} & set(names):
                return True
        return False

    askers = sorted(str(p.relative_to(REPO)) for p in (REPO / "wsitool").rglob("*.py")
                    if not p.is_relative_to(REPO / "wsitool" / "storage") and asks(p))
    assert askers == ["wsitool/opening/location.py"], askers
