"""Optional dependencies: the one place that says which extra to install when one is missing.

wsitool's optional features (remote slides, Dask arrays, PyTorch datasets, the server, plots,
the OpenSlide drop-in) import their libraries where they are used; where one is missing,
the error names the extra that brings it, always in the same words (:func:`install_hint`):
``pip install 'wsitool[remote]'``.  :func:`optional_import` imports a module or raises that
error; :func:`needs_extra` wraps imports that keep their own ``import`` statements (so type
checkers still read them).

Standard library only.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from collections.abc import Callable, Iterator

__all__ = ["install_hint", "optional_import", "needs_extra"]


def install_hint(extra: str) -> str:
    """The command that installs the optional extra ``extra``: ``pip install 'wsitool[extra]'``."""
    return f"pip install 'wsitool[{extra}]'"


def _message(what: str, extra: str, exc: ImportError) -> str:
    return what.format(exc=exc, name=exc.name) + install_hint(extra)


@contextlib.contextmanager
def needs_extra(extra: str, what: str,
                error: Callable[[str], BaseException] = ImportError) -> Iterator[None]:
    """Imports in the ``with`` block that need the optional extra ``extra``: an
    :class:`ImportError` there becomes ``error(message)``, raised without the import's
    traceback.  The message is ``what`` followed by :func:`install_hint`; ``what`` may name
    ``{exc}`` (the import error's text) and ``{name}`` (the module missing), e.g.
    ``"serve needs the web stack ({name}): "``.

    Raises:
        ImportError: an import in the block failed (or what ``error`` makes of the message).
    """
    try:
        yield
    except ImportError as exc:
        raise error(_message(what, extra, exc)) from None


def optional_import(module: str, extra: str, what: str,
                    error: Callable[[str], BaseException] = ImportError) -> types.ModuleType:
    """The module ``module``, imported (once: later calls find it in ``sys.modules``).

    Raises:
        ImportError: ``module`` (or one it imports) is not installed (or what ``error`` makes
            of the message of :func:`needs_extra`).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise error(_message(what, extra, exc)) from None
