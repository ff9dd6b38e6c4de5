"""TIFF-based slides: Aperio SVS, Hamamatsu NDPI, generic tiled TIFF, OME-TIFF (floor 3).

tifffile parses the structure (IFDs, SubIFDs, tags); this package decides which
images are pyramid levels (:mod:`.levels`) and which are associated images
(vendor rules: :mod:`.aperio`, :mod:`.ndpi`), describes how their segments are encoded
(:mod:`.encoding`) and gathers the metadata (:mod:`.properties`, :mod:`.ome`).
It decodes nothing.

Candidates are all IFDs of the file, top-level and SubIFDs (TIFF tag 330, used
by OME-TIFF pyramids), with non-zero width and height that are not transparency
masks (NewSubfileType bit 2).  Vendor layouts first remove associated images
(Aperio: every stripped IFD, see :mod:`.aperio`; NDPI: the macro, and the
focus map, which is dropped, see :mod:`.ndpi`; OME-TIFF: the OME Images after
the first, named by their ``Name``, see :mod:`.ome`); the rest go through the
level rule of :mod:`.levels`.  tifffile reads the file through the file object its
byte source gives (:meth:`~wsitool.storage.ByteSource.open_file`: a local file's
:class:`~wsitool.storage.view.BoundedFile`, a view of a remote one), whose reads never ask
for more than the file holds, so no value in the file makes it allocate more.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import IO, Any, cast

import tifffile
from tifffile import FILETYPE

from ...errors import CorruptFileError, UnsupportedFormatError, WsiError
from ...ground.oserrors import raise_if_os_resource
from ...model import AssociatedImage, Pyramid, PyramidLevel, multichannel_level
from ...storage import ByteSource
from . import aperio, ndpi, ndpi_scaled, ome, qptiff
from .encoding import associated_from_page, icc_profile, level_from_page
from .levels import choose_levels
from .logcapture import tifffile_messages
from .properties import build_properties
from .quickhash import with_quickhash
from .tables import EAGER, DeferredTables, scan
from .tags import MALFORMED, check_page, description

__all__ = ["NAME", "READS_URLS", "sniff", "open_pyramid"]

#: The format's name in messages (:class:`~wsitool.formats.contract.Format`).
NAME = "TIFF"
#: Its files are read from local paths and URLs alike.
READS_URLS = True

_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # TIFF 6.0 section 2; BigTIFF


def sniff(head: bytes) -> bool:
    """True when the first bytes of a file are a TIFF or BigTIFF header."""
    return head[:4] in _MAGIC


def open_pyramid(source: ByteSource) -> Pyramid:
    """Describe the TIFF whose bytes ``source`` reads as a :class:`~wsitool.model.Pyramid`.

    What tifffile logs while parsing (an IFD offset past the end of the file, a
    tag it could not read) becomes ``Pyramid.problems``.  Errors do not name the file: the
    opener attaches its name (:func:`wsitool.ground.naming.about`), and the levels' ``path``
    (named in tile errors) is left empty for it to fill.

    Raises:
        UnsupportedFormatError: not a TIFF, or no image usable as a level.
        CorruptFileError: the TIFF structure or its tags are broken.
    """
    head = source.read(0, 4)
    if not sniff(head):
        raise UnsupportedFormatError(f"not a TIFF file (unsupported format; header {head[:4]!r})")
    # a source whose metadata reads are requests (remote) defers the tile tables to their
    # level's first read (.tables); tifffile parses through the file its source gives (a
    # remote one: a view of its block cache, never a read-ahead of its own)
    tables = scan(source) if source.defer_metadata else EAGER
    with tifffile_messages() as messages:
        fh = source.open_file(blank=tables.blank)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tiff = tifffile.TiffFile(cast(IO[bytes], fh))  # (a raw file: tifffile reads, seeks, tells)
                pages = list(tiff.pages)
        except tifffile.TiffFileError as exc:
            fh.close()
            raise CorruptFileError(f"unreadable TIFF structure: {exc}") from None
        except MALFORMED as exc:
            fh.close()
            raise_if_os_resource(exc)  # EMFILE, ENOMEM, EIO: the machine's, not the file's
            # tifffile trusts tag types and counts; a tag of the wrong type or
            # count surfaces as TypeError/ValueError/... deep inside it.
            raise CorruptFileError(
                f"unreadable TIFF structure: {type(exc).__name__}: {exc}"
            ) from None
        except BaseException:
            fh.close()
            raise

        def release() -> None:
            tiff.close()  # (tifffile leaves a file object it was given open)
            fh.close()

        try:
            pyramid = _describe(source, tiff, pages, tables)
        except WsiError:
            release()
            raise
        except MALFORMED as exc:
            release()
            raise_if_os_resource(exc)
            raise CorruptFileError(f"malformed TIFF tags: {type(exc).__name__}: {exc}") from None
        except BaseException:
            release()
            raise
    pyramid.release = release
    pyramid.problems = list(pyramid.problems) + list(messages)
    return pyramid


def _candidates(pages: list[Any]) -> list[tuple[tifffile.TiffPage, int]]:
    """Every IFD and SubIFD as ``(page, index of its top-level IFD)``."""
    candidates: list[tuple[tifffile.TiffPage, int]] = []
    for i, page in enumerate(pages):
        if not isinstance(page, tifffile.TiffPage):
            continue
        candidates.append((page, i))
        if page.subifds:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    for sub in tifffile.TiffPages(page):
                        if isinstance(sub, tifffile.TiffPage):
                            candidates.append((sub, i))
            except Exception as exc:
                raise CorruptFileError(f"unreadable SubIFD: {exc}") from None
    return candidates


def _describe(source: ByteSource, tiff: tifffile.TiffFile, pages: list[Any],
              tables: DeferredTables) -> Pyramid:
    """The pyramid of the parsed TIFF ``tiff`` (its top-level ``pages``; the tile tables
    ``tables`` left unread): the vendor, then the levels and associated images its rules
    pick, then the properties."""
    if not pages:
        # TIFF 6.0 section 2 requires at least one IFD; none readable means a
        # truncated file or a first-IFD offset pointing nowhere.
        raise CorruptFileError("no readable image file directory (truncated or corrupt TIFF)")
    first_desc = description(pages[0])
    vendor = _vendor(tiff, first_desc)
    associated_pages, pool = _sort_pages(source, tiff, pages, vendor)
    problems: list[str] = []
    base, levels = _levels(source, pool, vendor, problems, tables)
    vendor_props: dict[str, str] = {}
    mpp_x, mpp_y, objective = _vendor_metadata(vendor, first_desc, tiff, pages, source, vendor_props)
    properties = build_properties(vendor, base, levels, vendor_props, (mpp_x, mpp_y), objective)
    associated = {name: associated_from_page(name, page, tables) for name, page in associated_pages.items()}
    profile = icc_profile(base)
    _thumbnail_profile(vendor, associated, profile)
    _openslide_structure_properties(properties, profile, associated)
    return Pyramid(vendor=vendor, levels=levels, associated=associated,
                   properties=with_quickhash(tiff, pages, source, properties, tables.values),  # read on first use
                   color_profile=profile, problems=problems)


def _vendor(tiff: tifffile.TiffFile, first_desc: str) -> str:
    """The layout whose rules apply: ``"aperio"``, ``"hamamatsu"``, ``"qptiff"``,
    ``"ome-tiff"`` or ``"generic-tiff"`` (first match, in that order)."""
    if aperio.is_aperio(first_desc):
        return "aperio"
    if ndpi.is_ndpi(tiff):
        return "hamamatsu"
    if qptiff.is_qptiff(first_desc):
        return "qptiff"
    if tiff.is_ome:
        return "ome-tiff"
    return "generic-tiff"


def _sort_pages(source: ByteSource, tiff: tifffile.TiffFile, pages: list[Any],
                vendor: str) -> tuple[dict[str, tifffile.TiffPage], list[tifffile.TiffPage]]:
    """``(associated images by name, the pages left for the level rule)`` of every IFD and
    SubIFD, after the checks of each (:func:`.tags.check_page`, NDPI's McuStarts); empty
    pages, transparency masks and the NDPI focus map are neither.

    Raises:
        CorruptFileError: a broken IFD, or no level and an image of zero width or height.
        UnsupportedFormatError: no image usable as a slide level.
    """
    candidates = _candidates(pages)
    associated_pages: dict[str, tifffile.TiffPage] = {}
    pool: list[tifffile.TiffPage] = []
    ome_other = ome.other_images(tiff) if vendor == "ome-tiff" else {}
    for page, top_index in candidates:
        if vendor == "hamamatsu":
            ndpi.check_page(page, source.size)  # first: tifffile made the segments of McuStarts
            if ndpi.is_map(page):  # the focus map: not shown by OpenSlide
                continue
        check_page(page, top_index)
        if page.imagewidth <= 0 or page.imagelength <= 0:
            continue
        if int(page.subfiletype) & FILETYPE.MASK:  # transparency mask
            continue
        if top_index in ome_other:  # a further OME Image (label, macro): never a level
            if page is pages[top_index]:
                associated_pages.setdefault(ome_other[top_index], page)
            continue
        name = (aperio.associated_name(page, top_index) if vendor == "aperio"
                else ndpi.associated_name(page) if vendor == "hamamatsu"
                else qptiff.associated_name(description(page)) if vendor == "qptiff" else None)
        if name is not None:
            associated_pages.setdefault(name, page)
        else:
            pool.append(page)
    if not pool:
        if any(p.imagewidth <= 0 or p.imagelength <= 0 for p, _ in candidates):
            raise CorruptFileError("image has zero width or height")
        raise UnsupportedFormatError("no image usable as a slide level")
    return associated_pages, pool


def _levels(source: ByteSource, pool: list[tifffile.TiffPage], vendor: str,
            problems: list[str], tables: DeferredTables) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
    """``(level 0's page, the levels)`` the level rule (:mod:`.levels`; QPTIFF's channel
    pages, :func:`_qptiff_levels`) picks from ``pool``, with NDPI's scaled levels."""
    if vendor == "qptiff":
        return _qptiff_levels(source, pool, problems, tables)
    chosen = choose_levels(pool)
    base = chosen[0]
    base_size = (int(base.imagewidth), int(base.imagelength))
    levels = tuple(level_from_page(source, i, page, base_size, tables) for i, page in enumerate(chosen))
    if vendor == "hamamatsu":  # OpenSlide's levels made by scaled JPEG decoding (see .ndpi_scaled)
        levels = ndpi_scaled.with_scaled_levels(levels, base_size)
    return base, levels


def _vendor_metadata(vendor: str, first_desc: str, tiff: tifffile.TiffFile, pages: list[Any],
                     source: ByteSource, vendor_props: dict[str, str]) -> tuple[float | None, float | None,
                                                                                float | None]:
    """``(mpp_x, mpp_y, objective power)`` from the vendor's own metadata (None where it gives
    none); its own keys go into ``vendor_props``."""
    if vendor == "aperio":
        return aperio.description_metadata(first_desc, vendor_props)
    if vendor == "hamamatsu":
        return ndpi.description_metadata(pages[0], source.read, vendor_props)
    if vendor == "ome-tiff":
        return ome.ome_metadata(tiff.ome_metadata or "", vendor_props)
    if vendor == "qptiff":
        return None, None, qptiff.objective_power(first_desc)
    return None, None, None


def _thumbnail_profile(vendor: str, associated: dict[str, AssociatedImage], profile: bytes | None) -> None:
    """Give an Aperio thumbnail without a profile of its own level 0's ``profile``."""
    thumb = associated.get("thumbnail")
    if vendor == "aperio" and thumb is not None and thumb.color_profile is None and profile is not None:
        # An Aperio thumbnail is a reduced copy of the scan and carries no tag of
        # its own; OpenSlide 4 reports level 0's profile for it (checked on a
        # TCGA SVS: the same 3144 bytes), and so does wsitool.
        associated["thumbnail"] = dataclasses.replace(thumb, color_profile=profile)


def _qptiff_levels(source: ByteSource, pool: list[tifffile.TiffPage], problems: list[str],
                   tables: DeferredTables) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
    """``(level 0's page, levels)`` of a QPTIFF's channel pages (:mod:`.qptiff`): the pages of
    one size, in file order, are the channels of one level, largest size first; a size with
    another page count than level 0 is passed over (reported in ``problems``).  One page of
    a size makes plain single-sample levels, as any TIFF."""
    groups: dict[tuple[int, int], list[tifffile.TiffPage]] = {}
    for page in pool:
        groups.setdefault((int(page.imagewidth), int(page.imagelength)), []).append(page)
    sizes = sorted(groups, key=lambda wh: -(wh[0] * wh[1]))
    count = len(groups[sizes[0]])
    base = groups[sizes[0]][0]
    base_size = sizes[0]
    descs = [description(p) for p in groups[sizes[0]]]
    channels = [qptiff.page_channel(d, k, count) for k, d in enumerate(descs)]
    levels: list[PyramidLevel] = []
    for size in sizes:
        pages = groups[size]
        if len(pages) != count:
            problems.append(f"passed over the {size[0]}x{size[1]} pages: {len(pages)} page(s) for "
                            f"{count} channel(s)")
            continue
        index = len(levels)
        planes = [level_from_page(source, index, page, base_size, tables) for page in pages]
        if count == 1:
            levels.append(planes[0])
            continue
        first = planes[0]
        if any((p.samples, p.dtype, p.tile_width, p.tile_height) !=
               (1, first.dtype, first.tile_width, first.tile_height) for p in planes):
            raise UnsupportedFormatError(f"QPTIFF channel pages of {size[0]}x{size[1]} differ in "
                                         "samples, sample type or tile size")
        levels.append(multichannel_level(planes, channels))
    return base, tuple(levels)


def _openslide_structure_properties(props: dict[str, str], profile: bytes | None,
                                    associated: dict[str, AssociatedImage]) -> None:
    """OpenSlide's structural keys (OpenSlide 4, ``openslide.h``): ``openslide.comment``
    (the ImageDescription), ``openslide.icc-size`` (bytes of level 0's ICC profile),
    ``openslide.associated.<name>.width|height|icc-size``."""
    if "tiff.ImageDescription" in props:
        props["openslide.comment"] = props["tiff.ImageDescription"]
    if profile is not None:
        props["openslide.icc-size"] = str(len(profile))
    for name, image in associated.items():
        props[f"openslide.associated.{name}.width"] = str(image.width)
        props[f"openslide.associated.{name}.height"] = str(image.height)
        if image.color_profile is not None:
            props[f"openslide.associated.{name}.icc-size"] = str(len(image.color_profile))
