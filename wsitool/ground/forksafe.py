"""Per-process resources: worker threads and decoders that a forked child must make anew.

Ground floor (standard library only).  After ``fork()`` (PyTorch ``DataLoader``
workers on Linux) only the forking thread exists in the child: a thread pool of
the parent would never run the child's work, a lock held by another parent
thread stays locked, and native decoders may count on threads of their library
that are gone.  A :class:`PerProcess` value is made on first use in each
process; in a forked child it is made again.  The parent's object is kept
referenced in the child (neither used nor destroyed there: destroying it could
wait on threads that do not exist).  This module holds the package's fork hook
for such values; :mod:`wsitool.ground.outputs` has one more, which forgets the parent's
live partial outputs in the child.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerProcess"]

T = TypeVar("T")

_all: list[PerProcess] = []
#: Values of the parent process, kept alive (unused) in a forked child.
_inherited: list[object] = []


class PerProcess(Generic[T]):
    """A value made by ``factory()`` on first :meth:`get` in each process.

    Thread-safe: concurrent first calls make one value.  In a forked child the
    first :meth:`get` makes a new value (and the lock is new too).
    """

    def __init__(self, factory: Callable[[], T]):
        self._factory = factory
        self._lock = threading.Lock()
        self._value: T | None = None
        _all.append(self)

    def get(self) -> T:
        """This process's value, made on first use."""
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._factory()
                value = self._value
        return value

    def peek(self) -> T | None:
        """This process's value if already made, else None (makes nothing)."""
        return self._value

    def _forget(self) -> None:
        if self._value is not None:
            _inherited.append(self._value)
        self._value = None
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    for item in _all:
        item._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
