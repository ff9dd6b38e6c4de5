"""Opening a slide: one typed location, parsed once, and one opener that the formats register with (floor 4½).

* :mod:`.location`: :func:`parse_location` sorts a path or URL once into a
  :class:`LocalFile`, :class:`LocalFolder`, :class:`ObjectUrl`, :class:`BucketPrefix` or
  :class:`DicomWebSeries`, carrying the :class:`LocationOptions` it is read with; picklable,
  and never showing a secret.
* :mod:`.opener`: :func:`open_location` turns a location into an :class:`OpenedSlide` (the
  pyramid, the byte source, the identity) with the first registered format that reads it.
* :mod:`.held`: this process's open slides by location, for the tasks that reopen a slide
  elsewhere (Dask, batch workers).

The facade (:class:`wsitool.Slide`) takes what the opener returns; nothing above this
package sorts locations or calls a format.
"""

from .held import cached_slide, chunk_read_count, read_chunk
from .location import (
    BucketPrefix,
    DicomWebSeries,
    FileLocation,
    LocalFile,
    LocalFolder,
    Location,
    LocationOptions,
    ObjectUrl,
    location_from_wire,
    parse_location,
)
from .opener import OpenedSlide, file_stamp, open_location, register, slide_identity, unregister

__all__ = ["Location", "FileLocation", "LocalFile", "LocalFolder", "ObjectUrl", "BucketPrefix", "DicomWebSeries",
           "LocationOptions", "parse_location", "location_from_wire", "OpenedSlide", "open_location", "register",
           "unregister", "slide_identity", "file_stamp", "cached_slide", "read_chunk", "chunk_read_count"]
