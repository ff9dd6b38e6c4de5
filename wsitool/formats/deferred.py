"""A slide's properties where a few values are computed on first use (floor 3).

Most properties are known once a format has parsed the file's structure; a few
cost reads of their own (``openslide.quickhash-1`` reads up to 5 MiB of the
smallest level, :mod:`wsitool.formats.tiff.quickhash`).  Those are *deferred*:
their key is present from the start (``in``, ``len()``, iteration and
``keys()`` read nothing), and the value is computed the first time it is asked
for (``[key]``, ``get``, ``items()``, ``values()``, ``dict(...)``), once, under
a lock, then kept.  A computation that fails raises to the caller and is tried
again at the next access (nothing is cached); its error names the slide (:attr:`~DeferredProperties.subject`,
set by the opener: the format that computes it does not know the name).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping

from ..ground.naming import attach

__all__ = ["DeferredProperties"]


class DeferredProperties(Mapping[str, str]):
    """A read-only ``str -> str`` mapping: the ``ready`` values, then the ``deferred`` ones.

    Args:
        ready: the values known now (copied).
        deferred: key -> a function of no arguments returning that key's value;
            called on the first access of the key.  A key in both is deferred.

    Attributes:
        subject: the slide as messages name it, attached to what a computation raises
            (:func:`wsitool.ground.naming.attach`); None: left as raised.
    """

    subject: str | None = None

    def __init__(self, ready: Mapping[str, str], deferred: Mapping[str, Callable[[], str]]):
        self._values: dict[str, str] = {k: v for k, v in ready.items() if k not in deferred}
        self._pending: dict[str, Callable[[], str]] = dict(deferred)
        self._keys: tuple[str, ...] = tuple(self._values) + tuple(self._pending)
        self._key_set = frozenset(self._keys)
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> str:
        try:
            return self._values[key]
        except KeyError:
            if key not in self._key_set:
                raise
        with self._lock:
            if key not in self._values:  # another thread may have computed it meanwhile
                try:
                    self._values[key] = self._pending[key]()
                except BaseException as exc:
                    if self.subject is not None:
                        attach(exc, self.subject)
                    raise
                del self._pending[key]
            return self._values[key]

    def __contains__(self, key: object) -> bool:
        return key in self._key_set  # never computes

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __reversed__(self) -> Iterator[str]:
        return reversed(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def copy(self) -> dict[str, str]:
        """A plain ``dict`` of every property (computes the deferred ones)."""
        return {k: self[k] for k in self._keys}

    def __or__(self, other: object) -> dict[str, str]:
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**self.copy(), **other}

    def __ror__(self, other: object) -> dict[str, str]:
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**other, **self.copy()}

    def __repr__(self) -> str:
        shown = {k: self._values.get(k, "<computed on first access>") for k in self._keys}
        return f"{type(self).__name__}({shown!r})"
