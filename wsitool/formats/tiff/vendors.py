"""The table of TIFF vendor layouts: each vendor's rules behind one interface (floor 3).

A layout is a :class:`Vendor`: how wsitool detects it (:meth:`Vendor.detect`), which IFDs
are its associated images, how its levels are made, what its own metadata gives, what it
changes at the end; and, for ``openslide.quickhash-1``, how OpenSlide detects it
(:meth:`Vendor.openslide_mark`, on the raw tags: :class:`.quickhash.Marks`) and which IFD
it hashes (:meth:`Vendor.hashed_page`).  The defaults are generic TIFF's.

:data:`VENDORS` is the one table, in OpenSlide 4's detection order (``openslide.c``):
NDPI, Trestle, Aperio, Huron, Argos, Leica, Philips, Ventana, then the layouts OpenSlide
reads as generic TIFF (QPTIFF, OME-TIFF) and generic TIFF.  wsitool reads a file as the
first entry whose :meth:`Vendor.detect` passes, and hashes it as the first whose
:meth:`Vendor.openslide_mark` passes.  Entries wsitool does not read yet (Trestle, Huron,
Argos: :class:`OpenSlideOnly`) only say how OpenSlide hashes them; their
files open as generic TIFF.  A new vendor is a module with its rules and its entry here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tifffile

from ...errors import CorruptFileError, UnsupportedFormatError
from ...model import AssociatedImage, Channel, PyramidLevel, channel_color, multichannel_level
from ...mosaic import DecodedImages
from ...storage import ByteSource
from . import aperio, leica, ndpi, ndpi_scaled, ome, philips, qptiff, ventana, ventana_mosaic
from .encoding import level_from_page
from .levels import choose_levels
from .quickhash import Marks, generic_level, is_tiled, last_tiled, ndpi_level
from .tables import DeferredTables
from .tags import description

__all__ = ["Context", "Vendor", "VENDORS", "detect"]


@dataclasses.dataclass
class Context:
    """One file being described: tifffile's parse, its first ImageDescription, its byte
    source and deferred tables, and what the vendor keeps between its steps (``state``)."""

    tiff: tifffile.TiffFile
    pages: list[tifffile.TiffPage]
    first_desc: str
    source: ByteSource
    tables: DeferredTables
    state: dict = dataclasses.field(default_factory=dict)  # (values of the vendor's own types)


class Vendor:
    """The rules of one TIFF layout; these defaults are generic TIFF's.

    Attributes:
        name: ``openslide.vendor`` of its slides.
        subifds: whether SubIFDs are candidates (OpenSlide's Philips reader walks the top
            level only).
        icc: whether the slide reports level 0's ICC profile (OpenSlide's Leica reader
            reports none).
    """

    name = "generic-tiff"
    subifds = True
    icc = True

    def detect(self, ctx: Context) -> bool:
        """True when wsitool reads the file as this layout."""
        return True

    def openslide_mark(self, marks: Marks) -> bool:
        """True when OpenSlide's detection of this format passes (generic TIFF: a tiled first IFD)."""
        return marks.tiled

    def hashed_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage | None:
        """The IFD whose segments OpenSlide hashes for this format, or None (no hash)."""
        return generic_level(pages)

    def hashed_text_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage:
        """The IFD whose text tags OpenSlide hashes after the level's bytes (most formats: the first)."""
        return pages[0]

    def prepare(self, ctx: Context) -> None:
        """Parse what the later steps need (into ``ctx.state``); raise CorruptFileError where
        the file claims the layout but breaks it."""

    def keep(self, ctx: Context, page: tifffile.TiffPage) -> bool:
        """False for an IFD that is neither level nor associated image (checked first)."""
        return True

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        """The associated image an IFD is, None for a level candidate, ``""`` for neither."""
        return None

    def levels(self, ctx: Context, pool: list[tifffile.TiffPage],
               problems: list[str]) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
        """``(level 0's page, the levels)`` made from the level candidates ``pool``."""
        chosen = choose_levels(pool)
        return chosen[0], _plain_levels(ctx, chosen)

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        """``(mpp_x, mpp_y, objective power)`` from the vendor's metadata; its keys into ``props``."""
        return None, None, None

    def finish(self, ctx: Context, props: dict[str, str], associated: dict[str, AssociatedImage],
               profile: bytes | None) -> None:
        """Last changes to the properties and associated images."""


def _plain_levels(ctx: Context, chosen: list[tifffile.TiffPage]) -> tuple[PyramidLevel, ...]:
    base = chosen[0]
    size = (int(base.imagewidth), int(base.imagelength))
    return tuple(level_from_page(ctx.source, i, page, size, ctx.tables) for i, page in enumerate(chosen))


class Aperio(Vendor):
    """:mod:`.aperio`."""

    name = "aperio"

    def detect(self, ctx: Context) -> bool:
        return aperio.is_aperio(ctx.first_desc)

    def openslide_mark(self, marks: Marks) -> bool:
        return marks.tiled and marks.starts(270, b"Aperio")

    def hashed_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage | None:
        return last_tiled(pages)

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        return aperio.associated_name(page, top_index)

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        return aperio.description_metadata(ctx.first_desc, props)

    def finish(self, ctx: Context, props: dict[str, str], associated: dict[str, AssociatedImage],
               profile: bytes | None) -> None:
        thumb = associated.get("thumbnail")
        if thumb is not None and thumb.color_profile is None and profile is not None:
            # An Aperio thumbnail is a reduced copy of the scan and carries no tag of
            # its own; OpenSlide 4 reports level 0's profile for it (checked on a
            # TCGA SVS: the same 3144 bytes), and so does wsitool.
            associated["thumbnail"] = dataclasses.replace(thumb, color_profile=profile)


class Hamamatsu(Vendor):
    """:mod:`.ndpi` and :mod:`.ndpi_scaled`."""

    name = "hamamatsu"

    def detect(self, ctx: Context) -> bool:
        return ndpi.is_ndpi(ctx.tiff)

    def openslide_mark(self, marks: Marks) -> bool:
        return marks.ndpi

    def hashed_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage | None:
        return ndpi_level(pages)

    def keep(self, ctx: Context, page: tifffile.TiffPage) -> bool:
        ndpi.check_page(page, ctx.source.size)  # first: tifffile made the segments of McuStarts
        return not ndpi.is_map(page)  # the focus map: not shown by OpenSlide

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        return ndpi.associated_name(page)

    def levels(self, ctx: Context, pool: list[tifffile.TiffPage],
               problems: list[str]) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
        base, levels = super().levels(ctx, pool, problems)
        # OpenSlide's levels made by scaled JPEG decoding (see .ndpi_scaled)
        return base, ndpi_scaled.with_scaled_levels(levels, (int(base.imagewidth), int(base.imagelength)))

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        return ndpi.description_metadata(ctx.pages[0], ctx.source.read, props)


class Philips(Vendor):
    """:mod:`.philips`."""

    name = "philips"
    subifds = False

    def detect(self, ctx: Context) -> bool:
        return philips.is_philips(ctx.tiff)

    def openslide_mark(self, marks: Marks) -> bool:
        # (OpenSlide also parses the XML: a file failing that wsitool refuses, see .philips)
        return marks.starts(305, b"Philips") and marks.contains(270, b"DPUfsImport")

    def hashed_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage | None:
        return last_tiled(pages)

    def prepare(self, ctx: Context) -> None:
        ctx.state["layout"] = philips.parse(ctx.first_desc)

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        return philips.associated_name(page)

    def levels(self, ctx: Context, pool: list[tifffile.TiffPage],
               problems: list[str]) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
        philips.check_levels(pool)
        return pool[0], philips.fix_levels(_plain_levels(ctx, pool), ctx.state["layout"])

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        own = ctx.state["layout"].properties()
        props.update(own)
        mpp_x, mpp_y, objective, barcode = philips.metadata(own)
        if barcode is not None:
            props["openslide.barcode"] = barcode
        return mpp_x, mpp_y, objective

    def finish(self, ctx: Context, props: dict[str, str], associated: dict[str, AssociatedImage],
               profile: bytes | None) -> None:
        props.pop("tiff.ImageDescription", None)  # the XML is no property (OpenSlide)
        associated.update(philips.xml_associated(ctx.state["layout"], set(associated)))


class Ventana(Vendor):
    """:mod:`.ventana`: Ventana TIFF, and BIF (its tile map the stored grid, or mosaic levels:
    :mod:`.ventana_mosaic`)."""

    name = "ventana"
    subifds = False

    def detect(self, ctx: Context) -> bool:
        return ventana.is_ventana(ctx.tiff)

    def openslide_mark(self, marks: Marks) -> bool:
        # (OpenSlide also parses the XMP: a file failing that wsitool refuses, see .ventana)
        return marks.contains(700, b"iScan")

    def hashed_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage | None:
        levels = [p for p in pages if "level=" in description(p)]
        # the smallest level: the last of OpenSlide's levels sorted by width, largest first
        return min(reversed(levels), key=lambda p: int(p.imagewidth)) if levels else None

    def hashed_text_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage:
        levels = [p for p in pages if "level=" in description(p)]
        return max(levels, key=lambda p: int(p.imagewidth)) if levels else pages[0]

    def prepare(self, ctx: Context) -> None:
        ctx.state["props"] = ventana.iscan_properties(ctx.pages[0])

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        return ventana.associated_name(page)

    def levels(self, ctx: Context, pool: list[tifffile.TiffPage],
               problems: list[str]) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
        checked = ventana.check_levels(pool)
        base = checked[0][0]
        tile_w, tile_h = int(base.tilewidth), int(base.tilelength)
        packet = ventana.xmp(base)
        bif = ventana.parse_bif(packet, tile_w, tile_h) if packet is not None else None
        ctx.state["bif"], ctx.state["tile_size"] = bif, (tile_w, tile_h)
        ordered = sorted(checked, key=lambda pd: -int(pd[0].imagewidth))  # OpenSlide: by width
        levels = _plain_levels(ctx, [p for p, _ in ordered])
        downsamples = [d for _, d in ordered]
        if bif is not None and not ventana.on_stored_grid(bif, levels, downsamples, tile_w, tile_h):
            return ordered[0][0], ventana_mosaic.mosaic_levels(levels, downsamples, bif, tile_w, tile_h)
        return ordered[0][0], ventana.fix_levels(levels, downsamples, bif, tile_w, tile_h)

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        own = ctx.state["props"]
        props.update(own)
        return ventana.metadata(own)

    def finish(self, ctx: Context, props: dict[str, str], associated: dict[str, AssociatedImage],
               profile: bytes | None) -> None:
        bif = ctx.state["bif"]
        if bif is not None:
            for key in [k for k in props if k.startswith("openslide.level[") and "].tile-" in k]:
                del props[key]  # OpenSlide gives a BIF's levels no tile size hint
            props.update(ventana.region_properties(bif, *ctx.state["tile_size"]))


class Leica(Vendor):
    """:mod:`.leica`: the brightfield main images composited on the collection's canvas, or a
    fluorescence image's channels."""

    name = "leica"
    subifds = False
    icc = False  # OpenSlide 4.0.1 gives a Leica slide and its macro no ICC profile (checked)

    def detect(self, ctx: Context) -> bool:
        return leica.is_leica(ctx.first_desc)

    def openslide_mark(self, marks: Marks) -> bool:
        # (OpenSlide also parses the XML: a file failing that wsitool refuses, see .leica)
        return marks.tiled and any(marks.contains(270, ns.encode()) for ns in leica.NAMESPACES)

    def _hashed(self, pages: list[tifffile.TiffPage]) -> tuple[int, int] | None:
        try:
            found = leica.hashed_ifds(leica.parse(leica.first_description(pages)))
        except (CorruptFileError, RecursionError):
            return None
        if found is None or not all(0 <= i < len(pages) for i in found):
            return None
        return found

    def hashed_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage | None:
        found = self._hashed(pages)
        return None if found is None else pages[found[0]]

    def hashed_text_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage:
        found = self._hashed(pages)
        return pages[0] if found is None else pages[found[1]]

    def prepare(self, ctx: Context) -> None:
        coll = leica.parse(ctx.first_desc)
        main = coll.main_images()
        macro = coll.macro()
        fluo = coll.fluorescence() if not main else None
        if not main and fluo is None:
            raise CorruptFileError("Leica SCN: can't find main image")
        if main:
            leica.check_main_images(main)
            used = {d.ifd for image in main for d in image.dims}
        else:
            assert fluo is not None
            used = {d.ifd for d in fluo.dims}
        for ifd in used:
            leica.page(ctx.pages, ifd)
        macro_ifd = None
        if macro is not None and macro.dims:
            macro_ifd = macro.dims[0].ifd
            leica.page(ctx.pages, macro_ifd)
        ctx.state.update(coll=coll, main=main, fluo=fluo, used=used, macro=macro_ifd)

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        if page is not ctx.pages[top_index]:
            return ""
        if top_index == ctx.state["macro"]:
            return "macro"
        return None if top_index in ctx.state["used"] else ""

    def levels(self, ctx: Context, pool: list[tifffile.TiffPage],
               problems: list[str]) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
        if ctx.state["main"]:
            return self._brightfield(ctx)
        return _leica_fluorescence(ctx, ctx.state["fluo"])

    def _brightfield(self, ctx: Context) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
        coll, main = ctx.state["coll"], ctx.state["main"]
        levels: list[PyramidLevel] = []
        decoded = DecodedImages()  # (off-grid levels: one decoded-image cache for the slide)
        for k in range(len(main[0].dims)):
            _nm, width, height, offsets = leica.level_geometry(coll, main, k)
            areas = []
            for image, (x, y) in zip(main, offsets, strict=True):
                dim = image.dims[k]
                page = leica.page(ctx.pages, dim.ifd)
                leica.check_dimension(page, dim)
                stored = level_from_page(ctx.source, k, page, (width, height), ctx.tables)
                areas.append(leica.Area(stored, x, y))
            if k == 0:
                ctx.state["areas0"] = areas
            levels.append(leica.canvas_level(k, width, height, areas, decoded))
            if sum(lv.tiles_across * lv.tiles_down for lv in levels) > leica.MAX_CANVAS_TILES:
                raise UnsupportedFormatError("Leica SCN levels of more tiles than wsitool's limit")
        w0, h0 = levels[0].width, levels[0].height
        for lv in levels:
            lv.downsample = (w0 / lv.width + h0 / lv.height) / 2.0
        return ctx.pages[main[0].dims[0].ifd], tuple(levels)

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        image = ctx.state["main"][0] if ctx.state["main"] else ctx.state["fluo"]
        own, objective = leica.properties(ctx.state["coll"], image)
        props.update(own)
        return None, None, objective  # MPP: level 0's resolution tags

    def finish(self, ctx: Context, props: dict[str, str], associated: dict[str, AssociatedImage],
               profile: bytes | None) -> None:
        props.pop("tiff.ImageDescription", None)  # the XML is no property (OpenSlide)
        for name, image in associated.items():
            associated[name] = dataclasses.replace(image, color_profile=None)
        if ctx.state["main"]:
            for key in [k for k in props if k.startswith("openslide.level[") and "].tile-" in k]:
                del props[key]  # OpenSlide gives a Leica level (its areas' grids) no tile size hint
            props.update(leica.bounds_properties(ctx.state["areas0"]))


class QPTiff(Vendor):
    """:mod:`.qptiff`: a level's channel pages."""

    name = "qptiff"

    def detect(self, ctx: Context) -> bool:
        return qptiff.is_qptiff(ctx.first_desc)

    def openslide_mark(self, marks: Marks) -> bool:
        return False  # OpenSlide reads it as generic TIFF

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        return qptiff.associated_name(description(page))

    def levels(self, ctx: Context, pool: list[tifffile.TiffPage],
               problems: list[str]) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
        return _qptiff_levels(ctx, pool, problems)

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        return None, None, qptiff.objective_power(ctx.first_desc)


class OmeTiff(Vendor):
    """:mod:`.ome`: the OME Images after the first are associated images, named by their ``Name``."""

    name = "ome-tiff"

    def detect(self, ctx: Context) -> bool:
        return bool(ctx.tiff.is_ome)

    def openslide_mark(self, marks: Marks) -> bool:
        return False  # OpenSlide reads it as generic TIFF

    def prepare(self, ctx: Context) -> None:
        ctx.state["other"] = ome.other_images(ctx.tiff)

    def associated_name(self, ctx: Context, page: tifffile.TiffPage, top_index: int) -> str | None:
        other = ctx.state["other"]
        if top_index in other:  # a further OME Image (label, macro): never a level
            return other[top_index] if page is ctx.pages[top_index] else ""
        return None

    def metadata(self, ctx: Context, props: dict[str, str]) -> tuple[float | None, float | None, float | None]:
        return ome.ome_metadata(ctx.tiff.ome_metadata or "", props)


class OpenSlideOnly(Vendor):
    """A format OpenSlide reads and wsitool does not yet: never detected (its files open as
    generic TIFF); its mark and hashed IFD are OpenSlide's (``hashed=None``: a hash wsitool
    does not reproduce, so none)."""

    def __init__(self, name: str, mark: Callable[[Marks], bool],
                 hashed: Callable[[list[tifffile.TiffPage]], tifffile.TiffPage | None] | None):
        self.name, self._mark, self._hashed = name, mark, hashed

    def detect(self, ctx: Context) -> bool:
        return False

    def openslide_mark(self, marks: Marks) -> bool:
        return bool(self._mark(marks))

    def hashed_page(self, pages: list[tifffile.TiffPage]) -> tifffile.TiffPage | None:
        return None if self._hashed is None else self._hashed(pages)


#: The one table, in OpenSlide's detection order (module docstring); the last (generic TIFF)
#: is read for every file no other entry claims.
VENDORS: tuple[Vendor, ...] = (
    Hamamatsu(),
    OpenSlideOnly("trestle", lambda m: (m.starts(305, b"MedScan") and m.has(270)
                                        and all(is_tiled(p) for p in m.pages)), last_tiled),
    Aperio(),
    OpenSlideOnly("huron", lambda m: m.tiled and m.starts(271, b"Huron"), last_tiled),
    OpenSlideOnly("argos", lambda m: m.tiled and m.contains(65000, b"Argos.Scan.Metadata"),
                  None),  # (hashes its XML too)
    Leica(),
    Philips(),
    Ventana(),
    QPTiff(),
    OmeTiff(),
    Vendor(),
)


def detect(ctx: Context) -> Vendor:
    """The first layout of :data:`VENDORS` whose detection passes."""
    return next(v for v in VENDORS if v.detect(ctx))


def _qptiff_levels(ctx: Context, pool: list[tifffile.TiffPage],
                   problems: list[str]) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
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
        planes = [level_from_page(ctx.source, index, page, base_size, ctx.tables) for page in pages]
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


def _leica_fluorescence(ctx: Context, image: leica.Image) -> tuple[tifffile.TiffPage, tuple[PyramidLevel, ...]]:
    """``(level 0's page, levels)`` of a Leica fluorescence image (:mod:`.leica`): its dimensions
    by ``r`` (resolution), each level the channels' IFDs in ``c`` order, at their own size.

    Raises:
        CorruptFileError: a resolution without every channel, or channel IFDs of several sizes.
        UnsupportedFormatError: channel IFDs that are not single-sample, or differ in sample
            type or tile size.
    """
    by_r: dict[int, dict[int, leica.Dimension]] = {}
    for dim in image.dims:
        by_r.setdefault(dim.r, {}).setdefault(dim.c, dim)
    count = len(by_r.get(0, {}))
    names = [f"C{c}" for c in sorted(by_r.get(0, {}))]
    channels = [Channel(name=n, color=channel_color(k, count)[0], color_source="default")
                for k, n in enumerate(names)]
    levels: list[PyramidLevel] = []
    base_page = None
    base_size = (0, 0)
    for r in sorted(by_r):
        dims = [by_r[r][c] for c in sorted(by_r[r])]
        if [f"C{d.c}" for d in dims] != names:
            raise CorruptFileError(f"Leica SCN: resolution {r} of the fluorescence image lacks a channel")
        pages = [leica.page(ctx.pages, d.ifd) for d in dims]
        for p, d in zip(pages, dims, strict=True):
            leica.check_dimension(p, d)
        sizes = {(int(p.imagewidth), int(p.imagelength)) for p in pages}
        if len(sizes) != 1:
            raise CorruptFileError(f"Leica SCN: the channel IFDs of resolution {r} differ in size")
        if base_page is None:
            base_page, base_size = pages[0], sizes.pop()
        index = len(levels)
        planes = [level_from_page(ctx.source, index, p, base_size, ctx.tables) for p in pages]
        first = planes[0]
        if any((p.samples, p.dtype, p.tile_width, p.tile_height) != (1, first.dtype, first.tile_width,
                                                                      first.tile_height) for p in planes):
            raise UnsupportedFormatError(f"Leica SCN fluorescence resolution {r}: channel IFDs differ in "
                                         "samples, sample type or tile size")
        levels.append(planes[0] if count == 1 else multichannel_level(planes, channels))
    if base_page is None:
        raise CorruptFileError("Leica SCN: the fluorescence image has no dimension")
    return base_page, tuple(levels)
