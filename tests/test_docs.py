"""The documentation's promises that a test can hold: the CLI reference is the real ``--help``,
the README stays short and keeps the commands CI runs, every module has a reference page.

Building the site itself (``sphinx-build -W -n``) is a step of ``.ci/run``, not a test.
"""

from __future__ import annotations

import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import wsitool

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
COMMANDS = [None, "info", "read-region", "read-regions", "export-pyramid", "export-many", "stress", "serve", "patches",
            "patches plan", "stow"]


@pytest.fixture(scope="module")
def docs_ext():
    pytest.importorskip("sphinx", reason="the docs extra (sphinx) is not installed")
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import wsitool_docs
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    return wsitool_docs


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "wsitool")
def test_cli_reference_is_the_commands_help(docs_ext, command):
    """What the CLI reference page renders equals ``COLUMNS=100 wsitool [COMMAND] --help``."""
    args = [sys.executable, "-m", "wsitool.cli"] + (command.split() if command else []) + ["--help"]
    env = dict(os.environ, COLUMNS=str(docs_ext.HELP_WIDTH))
    real = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    rendered = docs_ext.help_text(command)
    # `python -m wsitool.cli` names itself like the console script does (prog_name="wsitool")
    assert rendered == docs_ext.normalise_help(real)
    assert "Usage: wsitool" in rendered
    if command:
        assert f"wsitool {command}" in rendered


def test_cli_reference_has_every_command(docs_ext):
    """Each command and sub-command has its section, and each option a type in words."""
    page = (DOCS / "reference" / "cli.md").read_text()
    paths = docs_ext.command_paths()
    assert {"info", "read-region", "export-pyramid", "stress", "serve"} <= set(paths)
    for path in paths:
        assert f".. wsitool-cli:: {path}\n" in page, f"add 'wsitool {path}' to docs/reference/cli.md"
        for param in docs_ext.find_command(path).params:
            assert docs_ext.describe_type(param)


def test_readme_is_short_and_keeps_the_ci_command():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    test_line = next(line for line in readme.splitlines() if "python -m pytest" in line)
    assert test_line in ci, "the README's test command must be the line .ci/run runs"
    assert "sphinx-build -q -W -n -b html docs docs/_build/html" in "\n".join(ci)
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).exists(), link


def test_every_module_has_a_reference_page():
    """The internals pages walk packages; together with the public pages they cover every module."""
    pages = "\n".join(p.read_text() for p in (DOCS / "reference").rglob("*.md"))
    walked = set(re.findall(r"wsitool-modules:: (\S+)", pages))
    explicit = set(re.findall(r"automodule:: (\S+)", pages))
    top_level = "wsitool" in walked  # :top-level: on the foundation page
    for info in pkgutil.walk_packages(wsitool.__path__, "wsitool."):
        name = info.name
        if any(part.startswith("_") for part in name.split(".")[1:]):
            continue  # compiled modules and __main__
        covered = name in explicit or any(name == p or name.startswith(p + ".") for p in walked - {"wsitool"})
        covered = covered or (top_level and name.count(".") == 1 and not info.ispkg)
        assert covered, f"{name} has no reference page (add its package to docs/reference/internals/)"


def test_benchmark_pages_say_date_and_machine():
    for page in (DOCS / "benchmarks").glob("*-20*.md"):
        text = page.read_text()
        date = re.search(r"\d{4}-\d{2}-\d{2}", page.stem).group(0)
        assert f"**Date**: {date}" in text, page.name
        assert "**Machine**:" in text, page.name


def test_the_readme_links_every_guide():
    """The README's documentation list names every page of docs/guides (7 of 17 were missing)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((REPO / "docs" / "guides").glob("*.md"))
               if f"(docs/guides/{p.name})" not in readme]
    assert not missing, missing
