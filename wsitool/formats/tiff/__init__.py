"""TIFF-based slides: Aperio SVS, Hamamatsu NDPI, Leica SCN, Philips, Ventana, QPTIFF, generic TIFF, OME-TIFF (floor 3).

tifffile parses the structure (IFDs, SubIFDs, tags); this package decides which
images are pyramid levels (:mod:`.levels`) and which are associated images
(vendor rules: the table of :mod:`.vendors`, over :mod:`.aperio`, :mod:`.ndpi`,
:mod:`.leica`, :mod:`.philips`, :mod:`.ventana`, :mod:`.qptiff`, :mod:`.ome`), describes how their segments are encoded
(:mod:`.encoding`) and gathers the metadata (:mod:`.properties`, :mod:`.ome`).
It decodes nothing.

Candidates are all IFDs of the file, top-level and SubIFDs (TIFF tag 330, used
by OME-TIFF pyramids), with non-zero width and height that are not transparency
masks (NewSubfileType bit 2).  Vendor layouts first remove associated images
(Aperio: every stripped IFD, see :mod:`.aperio`; NDPI: the macro, and the
focus map, which is dropped, see :mod:`.ndpi`; OME-TIFF: the OME Images after
the first, named by their ``Name``, see :mod:`.ome`; Philips: stripped IFDs, and only
top-level IFDs count, see :mod:`.philips`; Ventana: the ``Label Image`` and ``Thumbnail``
IFDs, and only top-level IFDs described ``level=`` are levels, see :mod:`.ventana`; Leica: the IFDs its
SCN XML names, see :mod:`.leica`); the rest go through the
level rule of :mod:`.levels`.  tifffile reads the file through the file object its
byte source gives (:meth:`~wsitool.storage.ByteSource.open_file`: a local file's
:class:`~wsitool.storage.view.BoundedFile`, a view of a remote one), whose reads never ask
for more than the file holds, so no value in the file makes it allocate more.
"""

from __future__ import annotations

import warnings
from typing import IO, Any, cast

import tifffile
from tifffile import FILETYPE

from ...errors import CorruptFileError, UnsupportedFormatError, WsiError
from ...ground.oserrors import raise_if_os_resource
from ...model import AssociatedImage, Pyramid
from ...storage import ByteSource
from .encoding import associated_from_page, icc_profile
from .logcapture import tifffile_messages
from .properties import build_properties
from .quickhash import with_quickhash
from .tables import EAGER, DeferredTables, scan
from .tags import MALFORMED, check_page, description
from .vendors import VENDORS, Context, Vendor, detect

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


def _candidates(pages: list[Any], subifds: bool = True) -> list[tuple[tifffile.TiffPage, int]]:
    """Every IFD (and SubIFD, where ``subifds``) as ``(page, index of its top-level IFD)``."""
    candidates: list[tuple[tifffile.TiffPage, int]] = []
    for i, page in enumerate(pages):
        if not isinstance(page, tifffile.TiffPage):
            continue
        candidates.append((page, i))
        if page.subifds and subifds:
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
    ``tables`` left unread): the vendor (:mod:`.vendors`), then the levels and associated
    images its rules pick, then the properties."""
    if not pages:
        # TIFF 6.0 section 2 requires at least one IFD; none readable means a
        # truncated file or a first-IFD offset pointing nowhere.
        raise CorruptFileError("no readable image file directory (truncated or corrupt TIFF)")
    ctx = Context(tiff, pages, description(pages[0]), source, tables)
    vendor = detect(ctx)
    vendor.prepare(ctx)
    associated_pages, pool = _sort_pages(ctx, vendor)
    problems: list[str] = []
    base, levels = vendor.levels(ctx, pool, problems)
    vendor_props: dict[str, str] = {}
    mpp_x, mpp_y, objective = vendor.metadata(ctx, vendor_props)
    properties = build_properties(vendor.name, base, levels, vendor_props, (mpp_x, mpp_y), objective)
    associated = {name: associated_from_page(name, page, tables) for name, page in associated_pages.items()}
    profile = icc_profile(base) if vendor.icc else None
    vendor.finish(ctx, properties, associated, profile)
    _openslide_structure_properties(properties, profile, associated)
    hashed = with_quickhash(tiff, pages, source, properties, VENDORS, tables.values)  # read on first use
    return Pyramid(vendor=vendor.name, levels=levels, associated=associated, properties=hashed,
                   color_profile=profile, problems=problems)


def _sort_pages(ctx: Context, vendor: Vendor) -> tuple[dict[str, tifffile.TiffPage], list[tifffile.TiffPage]]:
    """``(associated images by name, the pages left for the level rule)`` of every IFD and
    SubIFD, after the checks of each (:func:`.tags.check_page`, the vendor's own); empty
    pages, transparency masks and what the vendor drops are neither.

    Raises:
        CorruptFileError: a broken IFD, or no level and an image of zero width or height.
        UnsupportedFormatError: no image usable as a slide level.
    """
    candidates = _candidates(ctx.pages, vendor.subifds)
    associated_pages: dict[str, tifffile.TiffPage] = {}
    pool: list[tifffile.TiffPage] = []
    for page, top_index in candidates:
        if not vendor.keep(ctx, page):
            continue
        check_page(page, top_index)
        if page.imagewidth <= 0 or page.imagelength <= 0:
            continue
        if int(page.subfiletype) & FILETYPE.MASK:  # transparency mask
            continue
        name = vendor.associated_name(ctx, page, top_index)
        if name:
            associated_pages.setdefault(name, page)
        elif name is None:
            pool.append(page)
    if not pool:
        if any(p.imagewidth <= 0 or p.imagelength <= 0 for p, _ in candidates):
            raise CorruptFileError("image has zero width or height")
        raise UnsupportedFormatError("no image usable as a slide level")
    return associated_pages, pool


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
