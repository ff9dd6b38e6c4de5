"""Slide URLs: which strings are URLs, how they are shown without secrets, and which name a DICOMweb series (floor 1).

A slide location is a URL when it starts with one of :data:`SCHEMES` followed
by ``://``; anything else is a local path.  :func:`redact` is the only form of
a URL that wsitool prints, logs or stores in a property: the user name and
password of the authority and the whole query string (presigned URLs carry
their signature and credential there) are replaced.  :func:`parse_series_url`
tells a DICOMweb series URL (read by :mod:`wsitool.formats.dicom.web`) from the
URL of one object.
"""

from __future__ import annotations

import os
import re
import urllib.parse

from ..errors import InvalidOptionError, WsiError

__all__ = ["SCHEMES", "is_url", "scheme_of", "redact", "redact_text", "check_url", "SeriesUrl", "parse_series_url"]

#: URL schemes wsitool reads slides from (``gcs`` is an alias of ``gs``; ``abfs`` / ``abfss`` / ``azure`` of ``az``).
SCHEMES = ("http", "https", "s3", "gs", "gcs", "az", "abfs", "abfss", "azure",
           "dicomweb+http", "dicomweb+https")  # (a DICOMweb series, wsitool.formats.dicom.web)


def scheme_of(location: object) -> str | None:
    """The lower-case scheme of ``location`` when it is a slide URL (one of :data:`SCHEMES`), else None."""
    if isinstance(location, os.PathLike) or not isinstance(location, str):
        return None
    head, sep, _ = location.partition("://")
    if not sep:
        return None
    head = head.lower()
    return head if head in SCHEMES else None


def is_url(location: object) -> bool:
    """True when ``location`` is a string URL of a scheme in :data:`SCHEMES`."""
    return scheme_of(location) is not None


def redact(url: str) -> str:
    """``url`` with its secrets replaced: ``user:password@`` becomes ``***@`` and a query
    string becomes ``?<redacted>`` (a fragment is dropped).  Not a URL: returned unchanged."""
    if not is_url(url):
        return url
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. "Invalid IPv6 URL" (an unclosed '['): split by hand
        scheme, _, rest = url.partition("://")
        netloc, slash, tail = rest.partition("/")
        path, _, query = (slash + tail).partition("#")[0].partition("?")
        netloc = "***@" + netloc.rpartition("@")[2] if "@" in netloc else netloc
        return f"{scheme}://{netloc}{path}" + ("?<redacted>" if query else "")
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "?<redacted>" if parts.query else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}"  # (urlunsplit drops an empty host's "//")


#: ``scheme://`` of any scheme (ftp, sftp, file, ... too; also ``scheme:/``, as a path made of the
#: argument shows it) where a word starts, its user information (up to the last ``@`` before the
#: path, as ``urlsplit`` takes it) and its query (up to white space).
_ANY_URL = re.compile(r"(?P<head>(?<![^\s'\"(\[<=,])[A-Za-z][A-Za-z0-9+.-]*:/{1,3})(?P<user>[^\s/?#]*@)?"
                      r"(?P<rest>[^\s?#]*)(?P<query>\?\S*)?")
#: Characters that end a sentence or a quotation after a URL's query, kept (not part of a secret's meaning).
_AFTER = ":,;)'\"."


def _redact_match(m: re.Match) -> str:
    query = m.group("query") or ""
    if query:
        tail = query[len(query.rstrip(_AFTER)):]  # "?sig=S:" -> ":" (the message's own colon)
        query = "?<redacted>" + tail if query.rstrip(_AFTER) != "?" else query
    return m.group("head") + ("***@" if m.group("user") else "") + m.group("rest") + query


def redact_text(text: str) -> str:
    """``text`` (a message) with every ``scheme://`` in it shown without secrets, whatever the
    scheme (``ftp://user:PW@host/x.svs`` is no slide URL, but its password is one): the user
    information becomes ``***@`` and a query ``?<redacted>``, as :func:`redact` does."""
    return _ANY_URL.sub(_redact_match, text) if ":/" in text else text


def check_url(url: str) -> None:
    """Raise when the URL ``url`` cannot even be split into its parts.

    Raises:
        InvalidOptionError: e.g. an unclosed ``[`` of an IPv6 host ("Invalid IPv6 URL");
            the message shows the URL through :func:`redact`.
    """
    try:
        urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise InvalidOptionError(f"{redact(url)}: not a valid URL ({exc})") from None


_SERIES = re.compile(r"^(?P<base>.+?)/studies/(?P<study>[0-9.]+)/series/(?P<series>[0-9.]+)/?$")


class SeriesUrl:
    """A DICOMweb series URL taken apart: ``base`` (the service root), ``study``, ``series``."""

    def __init__(self, base: str, study: str, series: str, given: str):
        self.base = base
        self.study = study
        self.series = series
        self.given = given

    @property
    def shown(self) -> str:
        """The URL as messages show it (no user, password or query)."""
        return redact(self.given.removeprefix("dicomweb+"))


def parse_series_url(location: object) -> SeriesUrl | None:
    """The :class:`SeriesUrl` of ``location`` when it is a DICOMweb series URL, else None.

    A series URL is ``http(s)://host/.../studies/{StudyInstanceUID}/series/{SeriesInstanceUID}``
    (UIDs are digits and dots), optionally with the scheme prefix ``dicomweb+``;
    a ``dicomweb+`` URL that does not end so raises.

    Raises:
        WsiError: a ``dicomweb+`` URL that names no series.
    """
    if not isinstance(location, str):
        return None
    low = location[:16].lower()
    prefixed = low.startswith("dicomweb+")
    url = location[len("dicomweb+"):] if prefixed else location
    if not url.lower().startswith(("http://", "https://")):
        if prefixed:
            raise WsiError(f"{redact(url)}: a dicomweb+ URL must be dicomweb+http(s)://")
        return None
    parts = urllib.parse.urlsplit(url)
    m = _SERIES.match(parts.path)
    if m is None:
        if prefixed:
            raise WsiError(f"{redact(url)}: not a DICOMweb series URL (.../studies/{{study}}/series/{{series}})")
        return None
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, m.group("base"), "", ""))
    return SeriesUrl(base, m.group("study"), m.group("series"), location)
