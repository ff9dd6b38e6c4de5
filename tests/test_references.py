"""Every ``wsitool.`` name and every repository path that the words around the code name resolves:
docstrings and comments (Python and C), the documentation pages, ``pyproject.toml`` and the README.

A name is resolved by importing its longest module prefix and walking the rest as attributes; an
attribute that instances get (assigned to ``self`` in a method, a dataclass field, an annotation)
counts.  A path is looked up from the repository root (``path::name``: the name must occur in
that file).  The changelog is history and is not checked.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re

import pytest

from helpers import REPO

NAME = re.compile(r"(?<![\w/.-])wsitool(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH = re.compile(r"(?<![\w/.-])((?:tests|scripts|docs|wsitool|samples|\.ci)/[A-Za-z0-9_./-]*[A-Za-z0-9_])"
                  r"(?:::([A-Za-z_][A-Za-z0-9_]*))?")
#: compiled modules that a build may leave out (their absence is reported at run time)
OPTIONAL_MODULES = {"wsitool._jpegloop", "wsitool._boxfilter"}
#: path patterns that name what a command makes, not a file of the repository (docs/pending/: where
#: engineers drop pages for the lead, empty between features)
MADE = ("docs/_build", "samples/out", "docs/pending", "wsitool/_build.json")  # (the last: setup.py's record)
#: namespaces of slide property names (``wsitool.dicom.level[0].missing-tiles``, ``wsitool.czi.scenes``),
#: not Python names
PROPERTY_NAMESPACES = ("wsitool.dicom", "wsitool.czi")
#: files that quote other repositories' paths (where a vendored file came from)
FOREIGN = ("docs/_inventories/README.md",)


def _texts() -> list[tuple[str, str]]:
    files = [*sorted((REPO / "wsitool").rglob("*.py")), *sorted((REPO / "wsitool").rglob("*.c")),
             *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "docs").rglob("*.py")),
             REPO / "pyproject.toml", REPO / "README.md", REPO / "setup.py"]
    return [(f.relative_to(REPO).as_posix(), f.read_text(encoding="utf-8")) for f in files
            if "_build" not in f.parts and f.relative_to(REPO).as_posix() not in FOREIGN]


def _mentions(pattern: re.Pattern) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for where, text in _texts():
        for no, line in enumerate(text.splitlines(), 1):
            for m in pattern.finditer(line):
                found.setdefault(m.group(0), []).append(f"{where}:{no}")
    return found


@functools.cache
def _instance_attributes(cls: type) -> frozenset[str]:
    """Names a class's instances get: ``self.X = ...`` in its methods, annotations, slots."""
    names: set[str] = set()
    for klass in cls.__mro__:
        names.update(getattr(klass, "__annotations__", {}))
        names.update(getattr(klass, "__slots__", ()) or ())
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        try:
            tree = ast.parse(inspect.cleandoc("\n" + source) if source.startswith(" ") else source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    return frozenset(names)


def _resolves(name: str) -> bool:
    if name.startswith(PROPERTY_NAMESPACES) or name == "wsitool.css":  # (a property; the docs' style sheet)
        return True
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in OPTIONAL_MODULES:
            return True
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("wsitool"):
                pytest.skip(f"{name}: needs {exc.name}, not installed")
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                # an instance attribute (its value is not known here), or nothing
                return isinstance(obj, type) and attr in _instance_attributes(obj)
            obj = getattr(obj, attr)
        return True
    return False


def test_every_wsitool_name_in_the_words_resolves():
    bad = {name: where for name, where in _mentions(NAME).items() if not _resolves(name)}
    assert not bad, "\n".join(f"{n}  ({', '.join(w[:3])})" for n, w in sorted(bad.items()))


def test_every_repository_path_in_the_words_exists():
    bad = {}
    for ref, where in _mentions(PATH).items():
        path, _, name = ref.partition("::")
        path = path.rstrip(".")
        if path.startswith(MADE) or any(c in path for c in "*{<"):
            continue
        target = REPO / path
        if not target.exists() and not (REPO / (path + ".py")).exists():
            # a module path written with dots for its package (wsitool/read/fill) or a folder
            bad[ref] = where
        elif name and target.is_file() and name not in target.read_text(encoding="utf-8"):
            bad[ref] = where
    assert not bad, "\n".join(f"{r}  ({', '.join(w[:3])})" for r, w in sorted(bad.items()))


def test_the_checks_bite():
    assert not _resolves("wsitool.storage.remote.NoSuchThing")
    assert _resolves("wsitool.storage.remote.RemoteSource.advise")
    assert _resolves("wsitool.storage.remote.RemoteSource.size")  # (an instance attribute)
    assert not (REPO / "tests/test_export_interop.py").exists()
