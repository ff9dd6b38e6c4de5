"""What tifffile logs while it parses a file, captured per thread as the slide's problems (floor 3)."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["tifffile_messages"]


class _TifffileCapture(logging.Handler):
    """Routes each tifffile log record to the message list of the thread that emitted it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)  # problems, not tifffile's debug chatter
        self.lists: dict[int, list[str]] = {}  # thread id -> messages (under _capture_lock)

    def emit(self, record: logging.LogRecord) -> None:
        messages = self.lists.get(record.thread) if record.thread is not None else None
        if messages is not None:
            # tifffile prefixes the object that complains: "<tifffile.TiffPages @8> ..."
            messages.append(re.sub(r"^<[^>]*>\s*", "", record.getMessage()))


_capture = _TifffileCapture()


_capture_lock = threading.Lock()


_capture_state: dict[str, Any] = {"users": 0, "level": logging.NOTSET, "propagate": True}


@contextlib.contextmanager
def tifffile_messages() -> Iterator[list[str]]:
    """Collect, as a list of strings, what tifffile logs from this thread meanwhile.

    Whatever logging the application configured, while any thread is inside
    this block the "tifffile" logger passes WARNING and above to the capture
    handler only (its level is lowered to WARNING if it was higher, and records
    do not propagate to the application's handlers or to Python's last-resort
    handler, which would print them on stderr); both settings are restored when
    the last thread leaves.  Records of other threads meanwhile are dropped.
    """
    logger = logging.getLogger("tifffile")
    me = threading.get_ident()
    messages: list[str] = []
    with _capture_lock:
        _capture.lists[me] = messages
        if _capture_state["users"] == 0:
            _capture_state["level"], _capture_state["propagate"] = logger.level, logger.propagate
            logger.addHandler(_capture)
            logger.propagate = False
            if logger.getEffectiveLevel() > logging.WARNING:
                logger.setLevel(logging.WARNING)
        _capture_state["users"] += 1
    try:
        yield messages
    finally:
        with _capture_lock:
            del _capture.lists[me]
            _capture_state["users"] -= 1
            if _capture_state["users"] == 0:
                logger.removeHandler(_capture)
                logger.setLevel(_capture_state["level"])
                logger.propagate = _capture_state["propagate"]
