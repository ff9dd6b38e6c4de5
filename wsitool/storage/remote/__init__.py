"""Remote slides: bytes read over the network with range requests (floor 1).

:class:`RemoteSource` is the :class:`~wsitool.storage.ByteSource` of a slide URL (HTTP(S), S3,
GCS, Azure; :func:`~wsitool.storage.open_source` picks it for a URL).  The package is split by
job:

* :mod:`.source`: :class:`RemoteSource` itself (open, reads, advice, lifetime);
* :mod:`.fetch`: one object's requests (retries, back-off, deadlines, the pinned identity);
* :mod:`.cache`: the process-wide block cache of metadata reads;
* :mod:`.readahead`: advised tile ranges, fetched in parallel within budgets per slide and
  per process; the exit hook;
* :mod:`.status`: what an answer's status means, :class:`Transient`, the back-off;
* :mod:`.options`: ``storage_options`` parsed once (:class:`StorageOptions`,
  :class:`RemoteOptions`);
* :mod:`.body`: the bounded reader of every answer's body;
* :mod:`.transport`: the :class:`Transport` interface, and :mod:`.transports` the clients
  behind it (HTTP(S), S3 / GCS / Azure, bucket listings).

A DICOMweb series is read by its own client (:mod:`wsitool.formats.dicom.web`), which reads its
answers, statuses and options through the same modules.
"""

from .cache import BLOCK_SIZE, DEFAULT_CACHE_BYTES, cache_stats, set_cache_bytes
from .options import CONCURRENCY, MAX_CONCURRENCY, RemoteOptions, StorageOptions
from .readahead import MAX_REQUEST, MERGE_GAP
from .source import HEAD_BYTES, RemoteSource
from .status import RETRY_STATUS, Transient, status_error
from .transport import Response, Transport

__all__ = [
    "RemoteSource", "Transport", "Response", "Transient", "RemoteOptions", "StorageOptions",
    "BLOCK_SIZE", "HEAD_BYTES", "MERGE_GAP", "MAX_REQUEST", "CONCURRENCY", "MAX_CONCURRENCY",
    "DEFAULT_CACHE_BYTES", "set_cache_bytes", "cache_stats", "RETRY_STATUS", "status_error",
]
