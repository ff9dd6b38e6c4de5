"""A DICOMweb series assembled as the local reader assembles a series folder (floor 3).

A series URL (``.../studies/{study}/series/{series}``) is read as the local
reader reads a series folder (:func:`wsitool.formats.dicom.open_dicomweb`):
QIDO-RS lists the series' instances, WADO-RS metadata gives each instance's
header as DICOM JSON, which pydicom turns into a data set
(``Dataset.from_json``; bulk data fetched by its URI), and the same code builds
the levels, optical paths (channels), associated images and properties.  Each
instance's frames come from a :class:`~wsitool.formats.dicom.web.frames.FrameSource`:
frame ``k`` at address ``k * FRAME_STRIDE``, its byte count an upper bound
(:data:`NOMINAL`); the region layer announces a region's frames and they come
in one multipart request per instance.

Transfer syntax: the metadata does not say how the frames are stored, so each
instance is negotiated at open, on its first frame: the syntax the server
names when asked for any (``transfer-syntax=*``, only to learn it: plugins
before Orthanc DICOMweb 1.16 answer frames asked so with short bodies), then
``AvailableTransferSyntaxUID`` where QIDO gives it, then a fallback list
(lossy syntaxes only for an image that says it was lossy-compressed, so a
server never re-encodes lossless pixels lossily).  Every frame request names
that syntax explicitly.  None accepted -> :class:`~wsitool.errors.UnsupportedFormatError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....errors import CorruptFileError, RemoteAccessError, RemoteNotFoundError, UnsupportedFormatError, WsiError
from ....ground.naming import about
from ..instance import WSI_SOP_CLASS, Instance, instance_from_dataset
from .client import MEDIA_TYPES, DicomWebClient, NotAcceptable
from .frames import FRAME_STRIDE, FrameSource, instance_url

if TYPE_CHECKING:  # pragma: no cover - pydicom is imported when a DICOM slide is opened
    from pydicom.dataset import Dataset

__all__ = ["NOMINAL", "series_instances", "frames_table"]

#: The byte count a DICOMweb tile index gives every frame: an upper bound (frames are read
#: whole).  Half the address stride less one, so a tile row's entries join into one advised
#: range only where their frame numbers follow each other
#: (:func:`wsitool.read.plan.segment_ranges`; the range then holds just those frames).
NOMINAL = (1 << 31) - 1

_LOSSY = {"ISO_10918_1": ["1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51"],
          "ISO_15444_1": ["1.2.840.10008.1.2.4.91"], "ISO_14495_1": ["1.2.840.10008.1.2.4.81"]}
#: Tried for every image, in this order, after the server's own answer.
LOSSLESS = ["1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.70",
            "1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.201", "1.2.840.10008.1.2.1"]
_AVAILABLE = "00083002"


class _Sources:
    """The frame sources of one series by instance path (the pyramid's ``release`` closes the client)."""

    given = None

    def __init__(self, client: DicomWebClient, by_path: dict[str, FrameSource]):
        self.client = client
        self.by_path = by_path

    def of(self, paths: list[str]) -> FrameSource:
        if len(paths) != 1:
            raise UnsupportedFormatError(f"{paths[0]}: concatenations are not read over DICOMweb")
        return self.by_path[paths[0]]

    def close(self) -> None:
        for src in self.by_path.values():
            src.close()
        self.client.close()


def frames_table(inst: Instance) -> tuple[np.ndarray, np.ndarray, str]:
    """The frames of a DICOMweb instance: frame ``k`` (1-based) at ``k * FRAME_STRIDE``, each
    counted :data:`NOMINAL` bytes (read whole); the table is ``"wado-rs"``."""
    n = inst.frames
    offsets = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(FRAME_STRIDE)
    return offsets, np.full(n, NOMINAL, np.uint64), "wado-rs"


def _uid(item: dict, tag: str) -> str:
    values = (item.get(tag) or {}).get("Value") or [""]
    return str(values[0])


def _candidates(ds: Dataset, stored: str | None, available: list[str]) -> list[str]:
    """Transfer syntaxes to ask the first frame in, best first, without repeats."""
    order = [ts for ts in ([stored] if stored else []) + available if ts in MEDIA_TYPES]
    if str(ds.get("LossyImageCompression", "") or "") == "01":
        methods = ds.get("LossyImageCompressionMethod") or []
        methods = [methods] if isinstance(methods, str) else list(methods)
        for method in methods:
            order += _LOSSY.get(str(method), [])
        if str(ds.get("PhotometricInterpretation", "")).upper() == "YBR_ICT":
            order.append("1.2.840.10008.1.2.4.91")
        order += _LOSSY["ISO_10918_1"] + _LOSSY["ISO_15444_1"] + _LOSSY["ISO_14495_1"]
    order += LOSSLESS
    return list(dict.fromkeys(order))


def _frame_bytes(ds: Dataset) -> int | None:
    """One frame's pixel bytes uncompressed (Rows x Columns x SamplesPerPixel x bytes per
    sample), or None where the header does not say: bounds each frames answer
    (:func:`~wsitool.formats.dicom.web.client.frames_limit`)."""
    try:
        rows, cols = int(ds.get("Rows") or 0), int(ds.get("Columns") or 0)
        samples, bits = int(ds.get("SamplesPerPixel") or 1), int(ds.get("BitsAllocated") or 8)
    except (TypeError, ValueError):
        return None
    size = rows * cols * max(1, samples) * max(1, -(-bits // 8))
    return size if size > 0 else None


def _negotiate(client: DicomWebClient, sop: str, ds: Dataset, available: list[str]) -> str:
    """The transfer syntax the server sends ``sop``'s frames in (its first frame fetched and cached).

    Raises:
        UnsupportedFormatError: the server refused every syntax wsitool decodes.
    """
    tried = []
    last = ""
    frame_bytes = _frame_bytes(ds)
    for syntax in _candidates(ds, client.stored_syntax(sop, frame_bytes), available):
        try:
            (frame,) = client.frames(sop, [1], syntax, negotiate=True, frame_bytes=frame_bytes)
        except NotAcceptable as exc:
            tried.append(syntax)
            last = str(exc)
            continue
        client.cache.put((sop, 1), frame)
        return syntax
    raise UnsupportedFormatError("the DICOMweb server sends the frames in none of the transfer "
                                 f"syntaxes wsitool reads (tried {len(tried)}: {', '.join(tried)}; "
                                 f"last answer: {last})")


def series_instances(client: DicomWebClient) -> tuple[list[Instance], list[str], _Sources]:
    """The WSI instances of the client's series (headers from WADO-RS metadata), problems,
    and their frame sources (``.of``/``.close`` as the local reader's).

    Raises:
        RemoteNotFoundError: no such series.  RemoteAccessError: access denied.
        RemoteUnavailableError: the server kept failing.
        UnsupportedFormatError: no whole-slide image instance; no transfer syntax agreed.
        CorruptFileError: metadata that pydicom cannot read or a header missing attributes.
    """
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import UID

    found = client.instances()
    available = {}
    for item in found:
        values = (item.get(_AVAILABLE) or {}).get("Value") or []
        available[_uid(item, "00080018")] = [str(v) for v in values]
    metadata = client.metadata()
    if not metadata:
        raise RemoteNotFoundError(client.shown, "not found (no instance metadata)")

    def bulk(*args: str) -> bytes:  # pydicom passes (tag, vr, uri) or (uri,)
        return client.bulk(args[-1])

    instances: list[Instance] = []
    problems: list[str] = []
    by_path: dict[str, FrameSource] = {}
    for item in metadata:
        if _uid(item, "00080016") != WSI_SOP_CLASS:
            continue
        sop = _uid(item, "00080018")
        path = instance_url(client, sop)
        with about(path):  # (the one place an instance's errors get its name)
            ds = _dataset(item, bulk)
            _decimal_strings(ds)
            syntax = _negotiate(client, sop, ds, available.get(sop, []))
            ds.file_meta = FileMetaDataset()
            ds.file_meta.TransferSyntaxUID = UID(syntax)
            frames = int(ds.get("NumberOfFrames") or 1)
            size = (frames + 1) * FRAME_STRIDE
            inst = instance_from_dataset(path, ds, size)
        instances.append(inst)
        by_path[path] = FrameSource(client, sop, inst.frames, syntax, _frame_bytes(ds))
    if not instances:
        raise UnsupportedFormatError(f"{client.shown}: the DICOMweb series holds no VL Whole Slide "
                                     "Microscopy image")
    return instances, problems, _Sources(client, by_path)


def _dataset(item: dict, bulk: Any) -> Dataset:
    """The pydicom data set of one instance's DICOM JSON metadata ``item`` (bulk data read by ``bulk``).

    Raises:
        CorruptFileError: metadata pydicom cannot read.
        RemoteAccessError, RemoteNotFoundError, WsiError: reading its bulk data.
    """
    import pydicom  # (the DICOM library is imported with the first DICOM slide)

    try:
        return pydicom.Dataset.from_json(item, bulk_data_uri_handler=bulk)
    except (RemoteAccessError, RemoteNotFoundError, WsiError):
        raise
    except Exception as exc:  # pydicom's ways of refusing a JSON value
        raise CorruptFileError(f"unreadable DICOM JSON metadata: {type(exc).__name__}: {exc}") from None


def _ds_text(value: Any) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _decimal_strings(ds: Dataset) -> None:
    """Decimal String values (numbers in DICOM JSON, PS3.18 F.2.3) as the shortest text of
    their number, ``-1`` rather than ``-1.0``: the text a file most often holds, so that
    properties read as from the file (a file's ``0.2500`` still shows as ``0.25``)."""
    for elem in ds.iterall():
        if elem.VR != "DS" or elem.value is None or elem.value == "":
            continue
        try:
            if elem.VM > 1:
                elem.value = [_ds_text(v) for v in elem.value]
            else:
                elem.value = _ds_text(elem.value)
        except (TypeError, ValueError, OverflowError):
            continue
