"""What ``read-region --regions`` and batch ``export-pyramid`` share: the progress bar and the exit code
of a failed batch (floor 9)."""

from __future__ import annotations

import contextlib

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..distributed import BatchOptionError
from .console import EXIT_CODES, err_console, fail


def batch_progress(quiet: bool):
    """A rich Progress for batch commands (disabled when quiet or not a terminal)."""

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                    disable=quiet or not err_console.is_terminal, transient=False)


@contextlib.contextmanager
def usage_errors():
    """Report a BatchOptionError (unknown scheduler/format, clashing outputs) as usage, exit 2."""

    try:
        yield
    except BatchOptionError as exc:
        raise fail(str(exc), 2) from None


def failure_code(error_types: tuple[str, ...]) -> int:
    """Exit code of a failure recorded by class names (see wsitool.distributed)."""
    for cls, code in EXIT_CODES:
        if cls.__name__ in error_types:
            return code
    if "ValueError" in error_types:  # an invalid export option, as in the single-slide form
        return 2
    return 1


