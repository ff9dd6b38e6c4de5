"""Command-line interface: a thin typer layer over the Python API (floor 9).

Each command parses its arguments, calls the API and formats the result with
rich.  Expected errors print one line, ``wsitool: error: <file>: <cause>``,
and exit with the code of their class (:data:`EXIT_CODES`); no traceback.
One module per command (:mod:`.info`, :mod:`.read`, :mod:`.export`,
:mod:`.stress`, :mod:`.serve`); :mod:`.console` holds the output and error mapping, :mod:`.group`
the command group.

Exit codes:
    0 success; 1 other wsitool error; 2 bad command-line usage;
    3 unsupported format; 4 corrupt file; 5 invalid region request;
    6 resource limit exceeded; 7 tile decode error; 8 no CUDA device;
    9 file not found or other I/O error (also EMFILE/ENOMEM/EIO; a URL naming no object);
    16 remote access denied (HTTP 401/403, expired credentials or presigned URL, 416);
    17 remote source failing after retries (timeout, 5xx, reset, truncated body; no HTTP range support);
    18 remote slide changed on the server while open (size or ETag);
    19 ``stow``: the DICOMweb server did not store every instance sent;
    130 / 143 / 129 interrupted by SIGINT / SIGTERM / SIGHUP (wsitool.ground.signals).
    ``wsitool stress`` adds its own verdict codes (see its help).
"""

from __future__ import annotations

import logging
import warnings

from ..ground import signals
from . import export, info, patches, read, serve, stow, stress  # noqa: F401  (each registers its command on app)
from .console import EXIT_CODES, exit_code_for, fail, handle_errors, show_warning
from .group import app

__all__ = ["app", "main", "EXIT_CODES", "exit_code_for", "fail", "handle_errors"]


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``wsitool.__main__.main``, the console script's entry point, calls it).

    SIGINT, SIGTERM and SIGHUP get one clean shutdown (:mod:`wsitool.ground.signals`):
    temporary outputs are removed, a Dask cluster or the stress child is shut
    down, and the exit status is 128 + the signal number (130, 143, 129).
    """
    logging.getLogger("tifffile").setLevel(logging.ERROR)
    warnings.showwarning = show_warning
    previous = signals.install()
    try:
        app(args=argv, prog_name="wsitool")
    finally:
        # After a signal the handler stays until the process exits, so that a second
        # signal during the last of the clean-up is ignored (not a kill by the default one).
        if signals.received() is None:
            signals.restore(previous)


