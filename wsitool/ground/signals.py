"""One way to stop on a signal: SIGINT, SIGTERM and SIGHUP all unwind like Ctrl-C.

Python turns SIGINT into :class:`KeyboardInterrupt`, so every ``finally`` and
``except BaseException`` cleanup in wsitool (temporary outputs deleted, the
stress child killed, a Dask cluster closed) runs on Ctrl-C.  SIGTERM (``kill``,
a batch system's time limit, ``docker stop``) and SIGHUP (the terminal closed)
have no Python handler by default: the process dies on the spot and leaves its
temporary files behind.  :func:`install` gives the three signals one handler
that raises :class:`Interrupted`, a subclass of :class:`KeyboardInterrupt`, in
the main thread, so they all take the Ctrl-C path; the command line maps it to
the exit status ``128 + signal number`` (130 SIGINT, 143 SIGTERM, 129 SIGHUP),
as a shell reports a process killed by that signal.

Only the command line's entry point installs the handler (never an import:
a library must not take over its host's signals).  A second signal while the
first one is still unwinding is ignored, so the cleanup is not cut short.

Standard library only at import (the console script's entry point installs the handler
before anything heavy is imported); :mod:`wsitool.ground.outputs` on the first clean-up.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

#: A handler :func:`signal.signal` takes back: a callable or ``SIG_DFL`` / ``SIG_IGN``.
Handler = Callable[[int, FrameType | None], Any] | int

__all__ = ["Interrupted", "HANDLED", "install", "restore", "handling", "received",
           "exit_code", "signal_name", "cleanup_partials"]

#: Signals turned into :class:`Interrupted` (SIGHUP where the platform has it).
HANDLED: tuple[int, ...] = tuple(
    s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None),
                getattr(signal, "SIGHUP", None)) if s is not None)

_received: int | None = None


class Interrupted(KeyboardInterrupt):
    """A handled signal arrived (see :func:`install`); unwinds like Ctrl-C.

    Attributes:
        signum: the signal number (e.g. ``signal.SIGTERM``).
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        """``128 + signum``: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {signal_name(self.signum)}"


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, etc. (``"signal N"`` for an unknown number)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handler(signum, frame) -> None:
    global _received
    if _received is not None:  # already unwinding: let the cleanup finish
        return
    _received = signum
    raise Interrupted(signum)


def install() -> dict[int, Handler]:
    """Route SIGINT, SIGTERM and SIGHUP to :class:`Interrupted` in the main thread.

    Returns the previous handlers (for :func:`restore`).  Does nothing (and
    returns ``{}``) outside the main thread, where Python cannot set handlers.
    A signal that is ignored (``SIG_IGN``, e.g. SIGHUP under ``nohup``, SIGINT
    of a background job) stays ignored; so does one whose handler was set from C
    (``getsignal`` gives None: it could not be put back).
    """
    global _received
    if threading.current_thread() is not threading.main_thread():
        return {}
    _received = None
    previous: dict[int, Handler] = {}
    for signum in HANDLED:
        current = signal.getsignal(signum)
        # ignored: leave it so; None: a handler set from C, which could not be put back
        if current is signal.SIG_IGN or current is None:
            continue
        previous[signum] = current
        signal.signal(signum, _handler)
    return previous


def restore(previous: dict[int, Handler]) -> None:
    """Put back the handlers :func:`install` returned (and forget the signal received)."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        return
    _received = None
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """``with handling():`` :func:`install` for the block, then :func:`restore`."""
    previous = install()
    try:
        yield
    finally:
        restore(previous)


def received() -> int | None:
    """The handled signal that arrived since :func:`install`, or None."""
    return _received


def exit_code(exc: BaseException) -> int:
    """Exit status for an interruption: ``128 + signum`` for :class:`Interrupted`,
    else the signal :func:`received` saw, else 130 (a plain KeyboardInterrupt)."""
    if isinstance(exc, Interrupted):
        return exc.exit_code
    if _received is not None:
        return 128 + _received
    return 130


def cleanup_partials() -> int:
    """Last resort after an interruption: remove the temporary outputs this
    process still has open (:func:`wsitool.ground.outputs.remove_live_partials`); returns
    how many were removed.  Never raises (nor does that function)."""
    from . import outputs as atomic  # (ctypes, socket: not before the handler is in place)

    return atomic.remove_live_partials()
