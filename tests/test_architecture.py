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
