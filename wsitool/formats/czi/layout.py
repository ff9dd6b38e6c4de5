"""A CZI file's levels: subblocks to mosaic levels, by scene and channel (floor 3).

Source: OpenSlide 4.0.1's Zeiss reader (``openslide-vendor-zeiss.c``) for what it reads, in
wsitool's words:

- **Canvas.** Every subblock's ``X``/``Y`` start is taken relative to the smallest over all
  subblocks (of every scene and level); level 0 is ``SizeX x SizeY`` of the XML.  Each scene
  ``s`` is reported as ``openslide.region[s].x|y|width|height``: the bounds of its
  downsample-1 subblocks.
- **Levels.** A subblock's downsample is its logical ``X`` size over its stored one, rounded
  (:attr:`~.segments.Subblock.downsample`); each downsample is a level of
  ``SizeX // d x SizeY // d`` pixels and downsample ``d``, kept where every scene has
  subblocks of that downsample or a larger one (a scene with a shallower pyramid limits the
  levels).  A subblock of level ``d`` is painted at ``(x / d, y / d)``, stored size.
- **Paint order.** Where subblocks overlap, the one with the *lower* ``M`` (mosaic index) is
  in front, as OpenSlide 4.0.1 shows them (libCZI and ZEN put the higher index in front); of
  equal ``M`` (or none), the one with the larger ``Y``, then the larger ``X``.
- **Pixels.** ``Bgr24`` and ``Bgr48`` (OpenSlide reads those two; wsitool also ``Bgra32``, its
  alpha dropped) read as RGB; uncompressed, zstd0 and zstd1 (OpenSlide), JPEG XR and JPEG
  (wsitool only).

wsitool's own additions (OpenSlide refuses such files):

- **A scene** (the ``scene`` option): only that scene's subblocks, on a canvas of its
  bounds (``openslide.region[s]``), with every downsample that scene has.
- **Channels** (``C`` > 0, or grey pixel types): one single-sample mosaic per channel,
  read through the channel API (:func:`wsitool.model.multichannel_level`); a colour channel
  among several (brightfield under polarised light beside the plain one) is three of them,
  its red, green and blue samples.
- **Other dimensions** (``T``, ``Z``, ...): plane 0 of each is read; subblocks of others
  are left out (a line in ``Pyramid.problems``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from itertools import pairwise

import numpy as np

from ...errors import CorruptFileError, InvalidOptionError, UnsupportedFormatError
from ...model import Channel, PyramidLevel, multichannel_level
from ...mosaic import DecodedImages, MosaicBuilder, mosaic_level
from ...storage import ByteSource
from .segments import COMPRESSIONS, PIXEL_TYPES, Subblock

__all__ = ["Canvas", "canvas", "scenes", "levels", "codec_name", "TILE"]

#: The virtual tile size of a CZI level (pixels).
TILE = 512
#: The largest level 0 read (pixels; 2**38, e.g. 640,000 x 430,000): the XML's size sets the
#: virtual tile grid, whose tables hold one entry per tile (a million at this size).
MAX_PIXELS = 1 << 38
_GREY = {0, 1}  # Gray8, Gray16
_BGR = {3, 4, 9}  # Bgr24, Bgr48, Bgra32
_CODEC = {0: "raw", 5: "zstd0", 6: "zstd1", 4: "jpegxr", 1: "jpeg"}


@dataclasses.dataclass(frozen=True)
class Canvas:
    """What one view of the file shows.

    Attributes:
        subblocks: the subblocks it paints.
        origin: the level-0 position of its top-left pixel (file coordinates).
        width, height: its level-0 size.
        downsamples: its levels' downsamples, ascending.
        regions: ``(x, y, width, height)`` of every scene on this canvas (level 0).
        scene: the scene shown, or None for the whole slide.
    """

    subblocks: tuple[Subblock, ...]
    origin: tuple[int, int]
    width: int
    height: int
    downsamples: tuple[int, ...]
    regions: dict[int, tuple[int, int, int, int]]
    scene: int | None


def _planes(subblocks: Sequence[Subblock], problems: list[str]) -> list[Subblock]:
    kept = [s for s in subblocks if all(v == 0 for k, v in s.dims.items() if k not in ("C", "S", "M"))]
    if len(kept) < len(subblocks):
        problems.append(f"CZI: {len(subblocks) - len(kept)} subblock(s) of planes other than the first "
                        "(T, Z, ... > 0) left out")
    return kept


def scenes(subblocks: Sequence[Subblock]) -> list[int]:
    """The scenes (``S`` starts) the subblocks belong to, ascending."""
    return sorted({s.dim("S") for s in subblocks})


def _bounds(subs: Sequence[Subblock]) -> tuple[int, int, int, int]:
    x0 = min(s.x for s in subs)
    y0 = min(s.y for s in subs)
    return x0, y0, max(s.x + s.logical_width for s in subs) - x0, max(s.y + s.logical_height for s in subs) - y0


def canvas(subblocks: Sequence[Subblock], size: tuple[int, int], scenes: int, scene: int | None,
           problems: list[str]) -> Canvas:
    """The :class:`Canvas` of the whole slide (``scene`` None, as OpenSlide shows it) or of one
    scene, from the directory's ``subblocks`` and the XML's ``size`` and scene count.

    Raises:
        CorruptFileError: no subblocks, or a scene without subblocks at downsample 1.
        InvalidOptionError: ``scene`` is not a scene of the file.
        UnsupportedFormatError: a canvas of more than :data:`MAX_PIXELS` pixels.
    """
    subs = _planes(subblocks, problems)
    if not subs:
        raise CorruptFileError("CZI: no subblocks")
    gx, gy = min(s.x for s in subs), min(s.y for s in subs)
    by_scene: dict[int, list[Subblock]] = {}
    for s in subs:
        by_scene.setdefault(s.dim("S"), []).append(s)
    regions = {}
    for k, members in sorted(by_scene.items()):
        base = [s for s in members if s.downsample == 1]
        if not base:
            raise CorruptFileError(f"CZI: scene {k} has no full-resolution subblocks")
        x, y, w, h = _bounds(base)
        regions[k] = (x - gx, y - gy, w, h)
    width, height = size if scene is None else regions[scene][2:] if scene in regions else (1, 1)
    if width * height > MAX_PIXELS:
        raise UnsupportedFormatError(f"CZI: a level 0 of {width}x{height} pixels, more than wsitool reads "
                                     f"({MAX_PIXELS} pixels)")
    if scene is None:
        top = min(max(s.downsample for s in members) for members in by_scene.values())
        downs = sorted({s.downsample for s in subs if s.downsample <= top})
        return Canvas(tuple(s for s in subs if s.downsample <= top), (gx, gy), size[0], size[1],
                      tuple(downs), regions, None)
    if scene not in by_scene:
        listed = ", ".join(str(k) for k in sorted(by_scene))
        raise InvalidOptionError(f"scene {scene} is not in this slide (its scenes: {listed})")
    x, y, w, h = regions[scene]
    members = by_scene[scene]
    downs = sorted({s.downsample for s in members})
    return Canvas(tuple(members), (x + gx, y + gy), w, h, tuple(downs), {scene: (0, 0, w, h)}, scene)


def codec_name(sub: Subblock) -> str:
    """The :mod:`wsitool.codec.czi` codec of ``sub``.

    Raises:
        UnsupportedFormatError: a compression or pixel type wsitool does not read.
    """
    comp = _CODEC.get(sub.compression)
    if comp is None:
        name = COMPRESSIONS.get(sub.compression, f"compression {sub.compression}")
        raise UnsupportedFormatError(f"CZI: {name} subblocks are not supported")
    if sub.pixel_type not in _GREY | _BGR:
        name = PIXEL_TYPES.get(sub.pixel_type, (f"pixel type {sub.pixel_type}",))[0]
        raise UnsupportedFormatError(f"CZI: {name} pixels are not supported")
    if sub.pixel_type in _BGR and comp in ("raw", "zstd0", "zstd1"):
        return f"czi-{comp}-bgra" if sub.pixel_type == 9 else f"czi-{comp}-bgr"
    return f"czi-{comp}"


def _extents(source: ByteSource, starts: Sequence[int]) -> dict[int, int]:
    """Each segment start's distance to the next start (or the end of the file)."""
    ordered = sorted(set(starts) | {source.size})
    return {a: b - a for a, b in pairwise(ordered)}


def _mosaic_level(source: ByteSource, subs: Sequence[Subblock], index: int, ds: int, cv: Canvas,
                  extents: Mapping[int, int], samples: int, dtype: np.dtype,
                  photometric: tuple[str, int], decoded: DecodedImages, part: str = "") -> PyramidLevel:
    builder = MosaicBuilder(samples=samples, dtype=dtype, decoded=decoded)
    src = builder.source(source)
    ox, oy = cv.origin
    # paint order: the higher M first (behind), then ascending y, x (the later on top)
    for s in sorted(subs, key=lambda s: (-s.dim("M"), s.y, s.x, s.index)):
        k = builder.image(src, s.position, extents.get(s.position, 0), s.width, s.height, codec_name(s) + part)
        builder.place(k, (s.x - ox) / ds, (s.y - oy) / ds)
    return mosaic_level(builder.build(), index=index, width=max(1, cv.width // ds), height=max(1, cv.height // ds),
                        downsample=float(ds), tile_width=TILE, tile_height=TILE, photometric=photometric[0],
                        photometric_code=photometric[1])


def _kind(subs: Sequence[Subblock]) -> tuple[int, np.dtype]:
    """``(samples, dtype)`` the subblocks decode to (one pixel type per level and channel)."""
    types = {s.pixel_type for s in subs}
    if len(types) != 1:
        raise UnsupportedFormatError(f"CZI: subblocks of several pixel types ({sorted(types)}) in one plane")
    code = types.pop()
    for s in subs:
        codec_name(s)  # (refuses what wsitool does not read, at open)
    _name, samples, size = PIXEL_TYPES[code]
    return (3 if code in _BGR else samples), np.dtype(f"u{size}")


def levels(source: ByteSource, cv: Canvas, starts: Sequence[int],
           channels: Sequence[Channel]) -> tuple[PyramidLevel, ...]:
    """The pyramid levels of canvas ``cv``, largest first: one mosaic level per downsample, or
    for several channels (``channels``: one per ``C`` value 0, 1, ..., three for a colour one:
    its red, green and blue) one multi-channel level of a mosaic per channel (three for a colour
    one, each decoding one sample).  ``starts``: every segment position the file lists (bounds
    each subblock's bytes).

    Raises:
        UnsupportedFormatError: a compression or pixel type wsitool does not read, several pixel
            types in one plane.
    """
    extents = _extents(source, [*starts, *(s.position for s in cv.subblocks)])
    decoded = DecodedImages()  # (one cache of decoded subblocks for every level and channel)
    out = []
    cs = sorted({s.dim("C") for s in cv.subblocks})
    multi = len(cs) > 1 or any(s.pixel_type in _GREY for s in cv.subblocks)
    for index, ds in enumerate(cv.downsamples):
        at = [s for s in cv.subblocks if s.downsample == ds]
        if not multi:
            samples, dtype = _kind(at)
            out.append(_mosaic_level(source, at, index, ds, cv, extents, samples, dtype, ("RGB", 2), decoded))
            continue
        planes = []
        for c in cs:
            mine = [s for s in at if s.dim("C") == c]
            if not mine:
                raise CorruptFileError(f"CZI: channel {c} has no subblocks at downsample {ds}")
            samples, dtype = _kind(mine)
            for part in ("",) if samples == 1 else (".r", ".g", ".b"):  # a colour channel: 3 planes
                planes.append(_mosaic_level(source, mine, index, ds, cv, extents, 1, dtype, ("MINISBLACK", 1),
                                            decoded, part))
        out.append(multichannel_level(planes, list(channels)))
    return tuple(out)


def colour_channels(subblocks: Sequence[Subblock]) -> set[int]:
    """The ``C`` values whose subblocks are colour (Bgr) ones."""
    return {s.dim("C") for s in subblocks if s.pixel_type in _BGR}
