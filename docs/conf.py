"""Sphinx configuration of the wsitool documentation.

Build (what ``.ci/run`` runs; warnings are errors, every cross-reference must resolve)::

    sphinx-build -W -n -b html docs docs/_build/html

The build is offline: references to Python, NumPy and the other projects resolve
through the inventories committed under ``docs/_inventories/`` (see the README there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))  # the site's own extension (wsitool_docs)
sys.path.insert(0, str(HERE.parent))  # the package itself, when not installed

# The CLI reference renders `--help` at a fixed width, the same as `COLUMNS=80 wsitool CMD --help`.
os.environ["COLUMNS"] = "80"

from wsitool.version import __version__  # noqa: E402

project = "wsitool"
author = "the wsitool authors"
copyright = "the wsitool authors"  # noqa: A001 - the name Sphinx reads
version = __version__
release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    # a [source] link beside each object, to its lines on GitHub (viewcode made a page of every
    # module: a third of the site's pages and of its 2 min build)
    "sphinx.ext.linkcode",
    "wsitool_docs",
    "wsitool_layers",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# docs/pending/: pages other engineers drop for the lead to fold in; not part of the site yet.
exclude_patterns = ["_build", "pending", "_inventories/README.md", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Code blocks without a language (command synopses) are shown as typed, not guessed at.
highlight_language = "text"
myst_heading_anchors = 3

# Google-style docstrings (Args / Returns / Raises).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # (False would describe dataclass fields twice)
# Section titles the docstrings use beyond Google's own.
napoleon_custom_sections = [("Fields", "attributes_style")]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Optional dependencies that may be absent where the docs are built.
autodoc_mock_imports = ["cupy"]

nitpicky = True
# Objects of projects whose inventory this offline build does not have: typer documents itself
# with MkDocs (no inventory), tifffile has no documentation site (only docstrings), and the
# inventories of rich (rich.readthedocs.io) and PyTorch (docs.pytorch.org) could not be fetched
# here nor found in a Debian package.  Their names stay plain text.
nitpick_ignore_regex = [
    ("py:.*", r"typer\..*"),
    ("py:.*", r"tifffile\..*"),
    ("py:.*", r"rich\..*"),
    ("py:.*", r"torch\..*"),
    # starlette and uvicorn have no inventory; the serve handlers' annotations name starlette's
    # Request class, the server's settings uvicorn's Config.
    ("py:class", r"(starlette\..*|Request|uvicorn\..*)"),
    # missing from the committed Python inventory
    ("py:class", r"types\.FrameType"),
]

# Offline inventories (docs/_inventories/README.md says where each came from).
INV = HERE / "_inventories"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", str(INV / "python.inv")),
    "numpy": ("https://numpy.org/doc/stable", str(INV / "numpy.inv")),
    "PIL": ("https://pillow.readthedocs.io/en/stable", str(INV / "pillow.inv")),
    "pydicom": ("https://pydicom.github.io/pydicom/stable", str(INV / "pydicom.inv")),
    "click": ("https://click.palletsprojects.com/en/stable", str(INV / "click.inv")),
    "dask": ("https://docs.dask.org/en/stable", str(INV / "dask.inv")),
    "distributed": ("https://distributed.dask.org/en/stable", str(INV / "distributed.inv")),
}
intersphinx_timeout = 1

html_theme = "furo"
html_title = f"wsitool {release}"
html_static_path = ["_static"]
html_css_files = ["wsitool.css"]
html_show_sourcelink = False


SOURCE_URL = "https://github.com/wsitool/wsitool/blob/main"


def linkcode_resolve(domain: str, info: dict) -> str | None:
    """The GitHub URL of a documented Python object's source lines (``sphinx.ext.linkcode``),
    or None where it has none to show (a constant, a mocked or compiled module)."""
    import importlib
    import inspect

    if domain != "py" or not info.get("module"):
        return None
    try:
        obj = importlib.import_module(info["module"])
        for part in info["fullname"].split("."):
            obj = getattr(obj, part)
        obj = inspect.unwrap(obj)
        if isinstance(obj, property):
            obj = obj.fget
        path = Path(inspect.getsourcefile(obj) or "").resolve()
        lines, first = inspect.getsourcelines(obj)
    except (AttributeError, ImportError, OSError, TypeError, ValueError):
        return None
    try:
        rel = path.relative_to(HERE.parent)
    except ValueError:
        return None
    return f"{SOURCE_URL}/{rel.as_posix()}#L{first}-L{first + len(lines) - 1}"
