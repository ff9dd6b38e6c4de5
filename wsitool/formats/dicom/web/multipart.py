"""The parts of a ``multipart/related`` answer, and the parameters of a header value (floor 3).

WADO-RS sends frames (and some bulk data) as ``multipart/related`` (PS3.18 8.7.3): one part a
frame, each with its own headers.  The body has been read whole, within its bound, by
:func:`~wsitool.storage.remote.body.read_body`; a body cut short is a
:class:`~wsitool.storage.remote.status.Transient` failure (retried).
"""

from __future__ import annotations

import re

from ....errors import RemoteAccessError
from ....storage.remote.status import Transient

__all__ = ["parse_multipart", "header_param"]


def parse_multipart(data: bytes, content_type: str, shown: str) -> list[tuple[dict, bytes]]:
    """The parts of a ``multipart/related`` body: ``(lower-case headers, body)`` each.

    Raises:
        Transient: a body cut short (no closing delimiter).
        RemoteAccessError: not a multipart answer (no boundary).
    """
    boundary = header_param(content_type, "boundary")
    if not boundary:
        raise RemoteAccessError(f"{shown}: the DICOMweb server answered {content_type or 'no type'} "
                                "instead of multipart/related")
    delim = b"--" + boundary.encode("latin-1")
    pos = data.find(delim)
    if pos < 0:
        raise Transient("the multipart body was cut short (no boundary)")
    parts: list[tuple[dict, bytes]] = []
    pos += len(delim)
    while True:
        if data[pos:pos + 2] == b"--":
            return parts
        head_end = data.find(b"\r\n\r\n", pos)
        if head_end < 0:
            raise Transient("the multipart body was cut short (part headers)")
        headers = {}
        for line in data[pos:head_end].split(b"\r\n"):
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        nxt = data.find(b"\r\n" + delim, head_end + 4)
        if nxt < 0:
            raise Transient("the multipart body was cut short")
        parts.append((headers, data[head_end + 4:nxt]))
        pos = nxt + 2 + len(delim)


def header_param(header: str, name: str) -> str | None:
    """Parameter ``name`` of a header value (``type="..."; boundary=...``), quotes removed."""
    for piece in re.split(r';(?=(?:[^"]*"[^"]*")*[^"]*$)', header or ""):
        key, sep, value = piece.strip().partition("=")
        if sep and key.strip().lower() == name:
            return value.strip().strip('"')
    return None
