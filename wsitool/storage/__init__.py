"""Byte sources: where a slide's encoded bytes come from (floor 1).

:class:`~wsitool.storage.source.ByteSource` is the interface the layers above
read through; :class:`~wsitool.storage.local.LocalFile` implements it over a
file descriptor (``pread`` / ``preadv``, ``posix_fadvise``).  A remote source
(:class:`~wsitool.storage.remote.RemoteSource`: HTTP(S), S3, GCS and Azure
range reads, the package :mod:`wsitool.storage.remote`; :func:`open_source` picks it for a
URL) implements the same interface, and so does a DICOMweb instance's frames
(:mod:`wsitool.formats.dicom.web`).  Each source applies its own storage policy behind
:meth:`ByteSource.advise`; nothing above branches on which kind of source it reads.
"""

from .local import LocalFile
from .opener import open_source
from .source import ByteSource
from .urls import is_url, redact, redact_text
from .view import SourceFile

__all__ = ["ByteSource", "LocalFile", "SourceFile", "open_source", "is_url", "redact", "redact_text"]
