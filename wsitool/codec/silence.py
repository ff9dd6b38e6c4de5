"""Keeping native libraries' own chatter off the user's terminal.

Ground floor (standard library only).  nvImageCodec prints one "Failed to load
nvjpeg library" line per missing GPU extension when it loads on a machine
without CUDA, and logs every failed decode (which wsitool reports as an
exception instead); OpenCV's OpenJPEG wrapper inside it warns once per JPEG 2000
tile.  Nothing here runs at import time: :mod:`wsitool.codec.library` calls it
when it loads nvImageCodec.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["stderr_silenced", "quiet_environment"]

#: Environment defaults that quiet nvImageCodec's Python layer and OpenCV.  Set
#: only where the user has not set them (users who want the logs set them first).
QUIET_ENVIRONMENT = {"PYNVIMGCODEC_VERBOSITY": "0", "OPENCV_LOG_LEVEL": "ERROR"}


def quiet_environment() -> None:
    """Apply :data:`QUIET_ENVIRONMENT` as defaults of ``os.environ`` (call before loading the library)."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def stderr_silenced():
    """Redirect file descriptor 2 to /dev/null for the duration of the block
    (native libraries print there, below Python's ``sys.stderr``)."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all
        yield
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        os.close(saved)  # (out of descriptors: leave none behind)
        raise
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
