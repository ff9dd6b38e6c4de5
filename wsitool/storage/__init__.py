"""Byte sources: where a slide's encoded bytes come from (floor 1).

:class:`~wsitool.storage.source.ByteSource` is the interface the layers above
read through; :class:`~wsitool.storage.local.LocalFile` implements it over a
file descriptor (``pread`` / ``preadv``, ``posix_fadvise``).  A remote source
(HTTP, S3 through fsspec range reads) is another module here implementing the
same interface; nothing above changes, except that the compiled JPEG loop
applies only where :meth:`ByteSource.fileno` gives a descriptor.
"""

from .local import LocalFile
from .source import ByteSource

__all__ = ["ByteSource", "LocalFile"]
