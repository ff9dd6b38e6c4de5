"""DICOMweb series read as slides: the client, the frames as byte sources, the series assembly (floor 3).

One package for everything DICOMweb, as the local DICOM reader keeps its files' parsing in
:mod:`wsitool.formats.dicom`:

* :mod:`.client`: :class:`~.client.DicomWebClient`, the requests to one service about one series
  (QIDO-RS, WADO-RS metadata and frames), through the remote stack's statuses,
  back-off and bounded body reader (:mod:`wsitool.storage.remote`); :mod:`.options` its
  storage options, :mod:`.multipart` the parts of its frame answers;
* :mod:`.store`: STOW-RS upload (:func:`~.store.stow`: files streamed from disk in batches,
  the answer judged per instance by :mod:`.store_answer`; :func:`~.store.upload` its short form);
* :mod:`.frames`: :class:`~.frames.FrameSource`, one instance's frames as a
  :class:`~wsitool.storage.ByteSource` (frames fetched by number, a region's in one request);
* :mod:`.series`: the series' instances assembled from their WADO-RS metadata
  (:func:`~.series.series_instances`).

A series URL (``.../studies/{study}/series/{series}``) is recognised by
:func:`wsitool.storage.urls.parse_series_url`, with the other slide locations.
"""

from .client import JSON_LIMIT, MEDIA_TYPES, DicomWebClient, NotAcceptable, frames_limit
from .frames import FRAME_STRIDE, FrameSource
from .series import NOMINAL, frames_table, series_instances
from .store import StowInstance, StowReport, stow, upload

__all__ = ["DicomWebClient", "FrameSource", "NotAcceptable", "MEDIA_TYPES", "JSON_LIMIT", "FRAME_STRIDE",
           "NOMINAL", "frames_limit", "frames_table", "series_instances", "stow", "StowReport", "StowInstance",
           "upload"]
