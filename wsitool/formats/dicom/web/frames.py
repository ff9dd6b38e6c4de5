"""The frames of one DICOMweb instance as a byte source (floor 3).

:class:`FrameSource` is one instance's frames as a :class:`~wsitool.storage.ByteSource`
whose address space holds frame ``k`` (1-based) at ``k * FRAME_STRIDE``.  The format gives each
tile the address of its frame (:func:`~wsitool.formats.dicom.web.series.frames_table`), its
byte count only an upper bound; :meth:`FrameSource.advise` (called by the region layer with
the ranges of a region's tiles) fetches every frame of the region that is not cached in one
multipart request; each tile's read then takes its frame whole from what was fetched
(:meth:`FrameSource.read_segment`; a frame nobody announced is fetched alone).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ....errors import RemoteUnavailableError, WsiError
from ....storage import ByteSource
from .client import DicomWebClient

__all__ = ["HELD", "FRAME_STRIDE", "FrameSource", "instance_url"]

#: Frames a :class:`FrameSource` keeps from its recent requests beyond the cache (each region's
#: frames stay readable until its reads took them, even with a cache budget of 0).
HELD = 512

#: Distance between two frames' addresses in a :class:`FrameSource` (no frame is 4 GiB).
FRAME_STRIDE = 1 << 32


def instance_url(client: DicomWebClient, sop: str) -> str:
    """The URL of instance ``sop`` of the client's series, as shown (without credentials): the name
    its errors carry."""
    return f"{client.shown}/instances/{sop}"


class FrameSource(ByteSource):
    """The frames of one instance in one transfer syntax, frame ``k`` at address ``k * FRAME_STRIDE``.

    ``read(address, count)`` gives the first ``count`` bytes of that frame (the
    whole frame when ``count`` is larger); :meth:`read_frame` and :meth:`read_segment` the
    whole frame (a tile's byte count is only an upper bound).
    The client is shared by the series' instances and closed by its owner.
    """

    remote = True
    framed = True
    defer_metadata = True
    protocol = "dicomweb"

    def __init__(self, client: DicomWebClient, sop: str, frames: int, syntax: str, frame_bytes: int | None = None):
        self.client = client
        self.frame_bytes = frame_bytes  # (one frame's pixels, uncompressed: bounds each answer)
        self.sop = sop
        self.frames = frames
        self.syntax = syntax
        self.path = instance_url(client, sop)  # (what its messages name)
        self.size = (frames + 1) * FRAME_STRIDE
        self._pending: dict[int, cf.Future] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._active = 0
        self._idle = threading.Condition(self._lock)

    def _number(self, offset: int) -> int:
        k, rest = divmod(int(offset), FRAME_STRIDE)
        if rest or not 1 <= k <= self.frames:
            raise OSError(f"{self.path}: address {offset} is no frame of the instance")
        return k

    def read_frame(self, offset: int) -> bytes:
        """The encoded bytes of the frame at address ``offset``: from the cache, from the
        request :meth:`advise` started, or else from a request of its own.

        Raises:
            RemoteUnavailableError, RemoteAccessError, RemoteNotFoundError: as the request.
        """
        k = self._number(offset)
        key = (self.sop, k)
        data = self.client.cache.get(key)
        if data is not None:
            return data
        with self._lock:
            fut = self._pending.get(k)
        if fut is not None:
            try:
                got = fut.result(timeout=self.client.options.operation_timeout)
            except cf.TimeoutError:
                raise RemoteUnavailableError(f"{self.path}: frames not received within the operation "
                                             f"timeout ({self.client.options.operation_timeout:g} s)") from None
            data = got.get(k)
            if data is not None:
                return data
        return self._fetch([k])[k]

    def _fetch(self, numbers: list[int]) -> dict[int, bytes]:
        frames = self.client.frames(self.sop, numbers, self.syntax, frame_bytes=self.frame_bytes)
        out = dict(zip(numbers, frames, strict=True))
        for k, data in out.items():
            self.client.cache.put((self.sop, k), data)
        return out

    def read(self, offset: int, count: int) -> bytes:
        data = self.read_frame(offset)
        return data if count >= len(data) else data[:count]

    def read_segment(self, offset: int, count: int) -> tuple[bytes, int]:
        """The frame at address ``offset`` whole, and its length (``count`` is an upper bound).

        Raises:
            RemoteUnavailableError, RemoteAccessError, RemoteNotFoundError: as the request.
            OSError: ``offset`` is no frame's address.
        """
        data = self.read_frame(offset)
        return data, len(data)

    def read_segment_into(self, offset: int, count: int, buffer: Callable[[int], Any]) -> tuple[int, int]:
        """The frame at address ``offset`` whole, copied into ``buffer(its length)``.

        Raises:
            RemoteUnavailableError, RemoteAccessError, RemoteNotFoundError: as the request.
            OSError: ``offset`` is no frame's address.
        """
        data = self.read_frame(offset)
        buffer(len(data))[:] = data
        return len(data), len(data)

    def readinto(self, offset: int, buffer: Any) -> int:
        data = self.read_frame(offset)
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(data))
        view[:n] = data[:n]
        return n

    def advise(self, ranges: Iterable[tuple[int, int]], ahead: bool = False) -> None:
        """Fetch, in one request, the frames whose addresses the ``(offset, count)`` ranges hold
        (a tile's entry holds its own frame; a row's joined entries the frames of the row) that
        are neither cached nor already being fetched (advisory: errors surface on the reads of
        those frames).
        ``ahead`` (read-ahead for a later batch): skipped where it wants more than a quarter
        of the :data:`HELD` frames (they would push out the ones being read now)."""
        if self._closed:
            return
        want = []
        with self._lock:
            # frames fetched for earlier regions stay readable (whatever the cache's budget)
            # until more than HELD frames are held: then the oldest fetched ones go
            if len(self._pending) > HELD:
                done = [k for k, f in self._pending.items() if f.done()]
                for k in done[:len(self._pending) - HELD]:
                    del self._pending[k]
            for offset, count in ranges:
                first = max(1, -(-int(offset) // FRAME_STRIDE))
                last = min(self.frames, (int(offset) + max(1, int(count)) - 1) // FRAME_STRIDE)
                for k in range(first, last + 1):
                    if k not in self._pending and self.client.cache.get((self.sop, k)) is None:
                        want.append(k)
            want = sorted(set(want))
            if not want or (ahead and 4 * len(want) > HELD):
                return
            fut: cf.Future = cf.Future()
            for k in want:
                self._pending[k] = fut
        # fetched here, in the calling thread: the frames of one request arrive together, so
        # decoding cannot start before the whole answer anyway, and no thread hand-off is paid;
        # a failure is kept for the reads (advice never raises)
        try:
            fut.set_result(self._fetch(want))
        except BaseException as exc:  # (re-raised by every read of these frames)
            fut.set_exception(exc.with_traceback(None))

    @contextlib.contextmanager
    def reading(self) -> Iterator[FrameSource]:
        with self._lock:
            if self._closed:
                raise WsiError(f"{self.path}: slide is closed")
            self._active += 1
        try:
            yield self
        finally:
            with self._lock:
                self._active -= 1
                self._idle.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            while self._active:
                self._idle.wait()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict:
        """The client's request counts (shared by the series' instances)."""
        return self.client.stats()
