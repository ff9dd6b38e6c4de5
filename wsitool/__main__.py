"""``python -m wsitool``: the command line, as the ``wsitool`` script runs it (same commands, exit codes).

:func:`main` is also the console script's entry point (``[project.scripts]``): it installs
the signal handling of :mod:`wsitool.ground.signals` before the command line's modules are
imported (typer, rich, numpy, tifffile, the codecs: about a second), so that Ctrl-C (or
SIGTERM, SIGHUP) during that start-up ends with the one line and exit status of an
interruption after it (130, 143, 129), not a ``KeyboardInterrupt`` traceback.  This module
and what it imports first (``wsitool``, :mod:`wsitool.ground.signals`) stay light for that.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import Any

from .ground import signals


def main(argv: list[str] | None = None) -> None:
    """Run the command line (:func:`wsitool.cli.main`) on ``argv`` (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: always, with the command's exit status; 128 + the signal number
            (130 SIGINT, 143 SIGTERM, 129 SIGHUP) for a signal during start-up.
    """
    # wsitool calls no BLAS routine, and its threads are its own: OpenBLAS's pool (numpy's, one thread
    # per core) would only spin, about a tenth of the CPU of a 2-core machine during an export
    # (docs/benchmarks/dicom-export-2026-12-08.md). A value the user set is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    previous = signals.install()
    unraisable = sys.unraisablehook
    sys.unraisablehook = _quiet_interruption(unraisable)
    try:
        from .cli import main as run

        # The objects of the modules just imported live as long as the process: out of the cyclic
        # collector's way, so that its collections during a command (one every few thousand new
        # objects: tiles' views, futures) do not walk them each time (0.09 s of a 0.8 s DICOM export,
        # docs/benchmarks/dicom-export-2026-12-08.md).
        gc.freeze()
        got = signals.received()
        if got is not None:  # a library's import caught the interruption and went on
            _say_interrupted(128 + got)
        run(argv)
    except SystemExit:
        raise
    except BaseException as exc:
        # (an extension module may turn the interruption into an ImportError of its own)
        if not isinstance(exc, KeyboardInterrupt) and signals.received() is None:
            raise
        _say_interrupted(signals.exit_code(exc))
    finally:
        sys.unraisablehook = unraisable
        if signals.received() is None:
            signals.restore(previous)


def _quiet_interruption(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """An unraisable hook that says nothing of an interruption raised where Python can only
    print it ("Exception ignored in" a weakref callback of the import system, a ``__del__``):
    :func:`wsitool.ground.signals.received` has it, and the one "interrupted" line follows."""
    def hook(unraisable: Any) -> object:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and signals.received() is not None:
            return None
        return previous(unraisable)

    return hook


def _say_interrupted(code: int) -> None:
    """The one line of an interruption on stderr (no rich: it may not be imported yet);
    raises SystemExit(``code``)."""
    word = "interrupted" if code == 130 else f"interrupted by {signals.signal_name(code - 128)}"
    try:
        sys.stderr.write(f"wsitool: error: {word}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # no terminal any more (SIGHUP), a closed pipe
        pass
    raise SystemExit(code) from None


if __name__ == "__main__":
    main()
