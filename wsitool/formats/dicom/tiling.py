"""From frames to a tile grid: TILED_FULL and TILED_SPARSE, concatenations, optical path and focal plane (floor 3).

A DICOM WSI image is a grid of frames (tiles) of Columns x Rows pixels over
the Total Pixel Matrix (PS3.3 C.8.12.4).  Dimension Organization Type
(PS3.3 C.7.6.17.3):

* TILED_FULL: every tile is present, frames ordered by column position, then
  row, then focal plane, then optical path; frame ``row * across + col`` of the
  first focal plane and optical path is the tile at ``(col, row)``.
* TILED_SPARSE (or no type but per-frame positions): each frame's Plane Position
  (Slide) Sequence in the Per-Frame Functional Groups (PS3.3 C.8.12.6.1) gives
  its 1-based Column / Row Position In Total Image Pixel Matrix; positions
  without a frame are missing tiles (offset 0: transparent, counted missing).
  A frame not on the tile grid is refused.

One optical path and one focal plane are read: the first item of the Optical
Path Sequence (PS3.3 C.8.12.5) and, for sparse images, the Z offset of the first
frame of that path (for TILED_FULL, the first plane in frame order).  What was
picked and how many there are go into :class:`GridNotes`.

Concatenations (PS3.3 C.7.6.16.2.2.4): the parts' frames, each part placed at
its Concatenation Frame Offset Number, form one image; the caller reads them
through one :class:`~wsitool.storage.span.Span` (frame offsets shifted by the
part's base).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...errors import CorruptFileError, UnsupportedFormatError
from .instance import Instance
from .instance import first_item as _first

__all__ = ["Image", "GridNotes", "merge_parts", "tile_grid"]


@dataclasses.dataclass(eq=False)
class Image:
    """One image: a single instance or the parts of a concatenation.

    Attributes:
        parts: the instances, in frame order (``parts[0]`` carries the shared attributes).
        offsets, counts: ``(frames,)`` uint64 byte offsets / lengths of all frames,
            in the address space of the parts laid end to end (one file: the file).
        frames: total frame count.
        table: how the frames were located (``"native"``, ``"basic"``, ``"extended"``, ``"none"``).
    """

    parts: list[Instance]
    offsets: np.ndarray
    counts: np.ndarray
    frames: int
    table: str

    @property
    def head(self) -> Instance:
        """The first part (the instance itself where there is one)."""
        return self.parts[0]


@dataclasses.dataclass
class GridNotes:
    """What :func:`tile_grid` picked: organization, optical path and focal plane, and counts."""

    organization: str
    optical_path: str
    optical_paths: int
    focal_plane: str
    focal_planes: int
    missing: int


def merge_parts(parts: list[Instance], tables: list[tuple[np.ndarray, np.ndarray, str]]) -> Image:
    """The image of one instance, or of a concatenation's parts (any order).

    Raises:
        CorruptFileError: parts whose frame ranges overlap or leave gaps, or
            that disagree on the image geometry.
    """
    order = sorted(range(len(parts)), key=lambda k: (parts[k].concat_offset, parts[k].concat_number))
    head = parts[order[0]]
    base = 0
    offsets, counts = [], []
    expected = 0
    for k in order:
        inst = parts[k]
        if (inst.width, inst.height, inst.frame_width, inst.frame_height) != (
                head.width, head.height, head.frame_width, head.frame_height):
            raise CorruptFileError(f"{inst.path}: concatenation part with another geometry than "
                                   f"{head.path}")
        if inst.concat_offset != expected:
            raise CorruptFileError(
                f"{inst.path}: concatenation part starts at frame {inst.concat_offset}, "
                f"{expected} expected (a part is missing or overlaps)"
            )
        off, cnt, _table = tables[k]
        offsets.append(off + np.uint64(base))
        counts.append(cnt)
        expected += inst.frames
        base += inst.file_size
    table = tables[order[0]][2]
    return Image(parts=[parts[k] for k in order],
                 offsets=np.ascontiguousarray(np.concatenate(offsets), np.uint64),
                 counts=np.ascontiguousarray(np.concatenate(counts), np.uint64),
                 frames=expected, table=table)


def _path_id(item: Any, shared: Any, default: str) -> str:
    for group in (item, shared):
        ident = _first(group, "OpticalPathIdentificationSequence")
        if ident is not None and ident.get("OpticalPathIdentifier") is not None:
            return str(ident.OpticalPathIdentifier)
    return default


def _per_frame(image: Image) -> list[Any]:
    items: list[Any] = []
    for inst in image.parts:
        seq = inst.ds.get("PerFrameFunctionalGroupsSequence")
        items.extend(seq if seq is not None else [])
    return items


def _is_sparse(image: Image, per_frame: list[Any]) -> bool:
    org = image.head.organization
    if org == "TILED_SPARSE":
        return True
    if org == "TILED_FULL":
        return False
    return bool(per_frame) and _first(per_frame[0], "PlanePositionSlideSequence") is not None


def tile_grid(image: Image, path_index: int = 0) -> tuple[np.ndarray, np.ndarray, GridNotes]:
    """The ``(across * down,)`` uint64 offsets and counts of the image's tiles in row-major
    grid order (0 for missing tiles), for optical path ``path_index`` (the item of the
    instance's Optical Path Sequence; default the first) and the first focal plane.

    Raises:
        CorruptFileError: fewer TILED_FULL frames than the grid has tiles
            (inconsistent Total Pixel Matrix), sparse frames without positions
            or outside the matrix.
        UnsupportedFormatError: sparse frames not on the tile grid.
    """
    ds = image.head.ds
    path_seq = ds.get("OpticalPathSequence") or []
    chosen = str(path_seq[path_index].get("OpticalPathIdentifier", "")) if path_seq else ""
    paths = int(ds.get("NumberOfOpticalPaths") or len(path_seq) or 1)
    planes = int(ds.get("TotalPixelMatrixFocalPlanes") or 1)
    per_frame = _per_frame(image)
    if not _is_sparse(image, per_frame):
        offsets, counts = _full_tiles(image, path_index, paths, planes)
        missing = int(np.count_nonzero(counts == 0))
        offsets[counts == 0] = 0
        return offsets, counts, GridNotes("TILED_FULL", chosen or "(none)", paths, "1", planes, missing)
    offsets, counts, z_chosen = _sparse_tiles(image, per_frame, chosen)
    missing = int(np.count_nonzero(counts == 0))
    notes = GridNotes("TILED_SPARSE", chosen or "(none)", paths,
                      "1" if z_chosen is None else f"z={z_chosen:g}", planes, missing)
    return offsets, counts, notes


def _grid_size(head: Instance) -> tuple[int, int]:
    """``(across, down)``: the tile grid of the Total Pixel Matrix in frames."""
    return -(-head.width // head.frame_width), -(-head.height // head.frame_height)


def _full_tiles(image: Image, path_index: int, paths: int, planes: int) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the offsets and counts of optical path ``path_index``'s first focal plane
    in a TILED_FULL image: frames run by column, row, focal plane, then optical path, so
    path k starts after k paths' worth of every focal plane.

    Raises:
        CorruptFileError: fewer frames than that grid needs.
    """
    head = image.head
    across, down = _grid_size(head)
    n = across * down
    first = path_index * n * planes
    if image.frames < first + n:
        raise CorruptFileError(
            f"{head.path}: inconsistent Total Pixel Matrix: {head.width}x{head.height} in "
            f"frames of {head.frame_width}x{head.frame_height} is a grid of {across}x{down} = "
            f"{n} tiles" + (f" for optical path {path_index + 1} of {paths}" if path_index else "")
            + f", but the image has {image.frames} frame(s)"
        )
    return image.offsets[first:first + n].copy(), image.counts[first:first + n].copy()


def _sparse_tiles(image: Image, per_frame: list[Any],
                  chosen: str) -> tuple[np.ndarray, np.ndarray, float | None]:
    """``(offsets, counts, the focal plane's z)`` of a TILED_SPARSE image: each frame of
    optical path ``chosen`` in the first focal plane met placed by its Plane Position
    (Slide); the first frame placed in a cell wins.

    Raises:
        CorruptFileError: fewer per-frame items than frames, a frame without a position.
        UnsupportedFormatError: a frame off the tile grid (see :func:`_sparse_cell`).
    """
    head = image.head
    if len(per_frame) < image.frames:
        raise CorruptFileError(f"{head.path}: TILED_SPARSE image with {len(per_frame)} per-frame "
                               f"functional group items for {image.frames} frames")
    shared = _first(head.ds, "SharedFunctionalGroupsSequence")
    across, down = _grid_size(head)
    offsets = np.zeros(across * down, np.uint64)
    counts = np.zeros(across * down, np.uint64)
    z_chosen = None
    for k in range(image.frames):
        item = per_frame[k]
        if chosen and _path_id(item, shared, chosen) != chosen:
            continue
        pos = _first(item, "PlanePositionSlideSequence") or _first(shared, "PlanePositionSlideSequence")
        if pos is None:
            raise CorruptFileError(f"{head.path}: sparse frame {k} has no Plane Position (Slide)")
        c = pos.get("ColumnPositionInTotalImagePixelMatrix")
        r = pos.get("RowPositionInTotalImagePixelMatrix")
        if c is None or r is None:
            raise CorruptFileError(f"{head.path}: sparse frame {k} has no position in the total "
                                   "pixel matrix")
        z_value = pos.get("ZOffsetInSlideCoordinateSystem")
        z = None if z_value is None else float(z_value)
        if z_chosen is None:
            z_chosen = z if z is not None else 0.0
        if z is not None and z != z_chosen:
            continue
        index = _sparse_cell(head, k, int(c) - 1, int(r) - 1)
        if counts[index] == 0 and image.counts[k] > 0:
            offsets[index] = image.offsets[k]
            counts[index] = image.counts[k]
    return offsets, counts, z_chosen


def _sparse_cell(head: Instance, k: int, x: int, y: int) -> int:
    """The row-major grid index of sparse frame ``k`` at pixel ``(x, y)`` of the matrix.

    Raises:
        UnsupportedFormatError: not on the tile grid.  CorruptFileError: outside the matrix.
    """
    tw, th = head.frame_width, head.frame_height
    across, down = _grid_size(head)
    if x % tw or y % th:
        raise UnsupportedFormatError(
            f"{head.path}: sparse frame {k} at column {x + 1}, row {y + 1} is not on the "
            f"{tw}x{th} tile grid"
        )
    col, row = x // tw, y // th
    if not (0 <= col < across and 0 <= row < down):
        raise CorruptFileError(f"{head.path}: sparse frame {k} at column {x + 1}, row {y + 1} "
                               f"lies outside the {head.width}x{head.height} total pixel matrix")
    return row * across + col
