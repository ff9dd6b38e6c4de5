"""Interoperability of export-pyramid's outputs (issue 14, items 7 and 8).

Three real slides -- a JPEG Aperio SVS (CMU-1 small region, with label and
macro), a JPEG 2000 (33005) Aperio SVS (TCGA, no label or macro) and a generic
deflate pyramid (OpenSlide's boxes.tiff) -- are exported (small regions, so the
file stays fast), in the tile codec of the source, as ``tiff`` and
``ome-tiff``.  Every reader that can read the format must agree with what the
export says it wrote (:class:`~wsitool.export.ExportResult`) on the level count
and dimensions and the MPP, and where the reader exposes them on the
associated image names; the pixels each reader returns are compared with
wsitool's read of the same output (a reader without a codec may return black
without an error, which fails here, see :func:`check_pixels`).

Readers: ``tiff`` -- OpenSlide, tiffslide, tifffile (``series[0].levels``),
libvips (``tiffload`` with ``page``) and wsitool; ``ome-tiff`` -- tifffile,
tiffslide, libvips (``tiffload`` with ``subifd``) and wsitool, and the OME-XML
is validated against the OME schema with ``ome-types``.

libvips is the ``pyvips`` + ``pyvips-binary`` wheels of the test extra; that
build has no JPEG 2000 codec (``jp2kload`` absent), so it is skipped, with that
reason, for the JPEG 2000 exports only.

The Aperio layout expected (OpenSlide's Aperio notes, openslide.org/formats/
aperio, quoting Aperio's "Digital Slides and Third-party Data Interchange"
p. 14): IFD 0 the full resolution, IFD 1 a stripped thumbnail, then the other
levels, then the label (NewSubfileType 1) and macro (NewSubfileType 9), each
stripped and named on the second line of its ImageDescription.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tifffile
from tifffile.tifffile import svs_description_metadata
from typer.testing import CliRunner

import wsitool
from wsitool.export import export_pyramid
from wsitool.export.associated import thumbnail_level as _thumbnail_level

from helpers import shared_sample

#: (slide, region (x, y, w, h) or None for the whole slide, compression, tile size)
CASES = {
    "jpeg-svs": ("aperio-cmu1-small-region-jpeg.svs", (300, 500, 1100, 900), "jpeg", 256),
    "j2k-svs": ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", (1500, 1200, 1100, 900), "jpeg2000", 256),
    "generic": ("generic-boxes-deflate-4level.tiff", None, "deflate", 64),
}
FORMATS = {"tiff": "out.svs", "ome-tiff": "out.ome.tif"}


@dataclasses.dataclass
class Export:
    path: Path
    fmt: str
    compression: str
    dims: list[tuple[int, int]]
    mpp: tuple[float, float] | None
    associated: dict[str, np.ndarray]  # carried over from the source: label, macro
    reference: list[np.ndarray]  # wsitool's read of each level of the output
    source: Path
    region: tuple[int, int, int, int] | None


@pytest.fixture(scope="module", params=[(c, f) for c in CASES for f in FORMATS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request, tmp_path_factory) -> Export:
    case, fmt = request.param
    name, region, compression, tile = CASES[case]
    src = shared_sample(name)
    out = tmp_path_factory.mktemp(f"{case}-{fmt}") / FORMATS[fmt]
    with wsitool.open_slide(src) as s:
        mpp = s.mpp
        carried = {n: np.asarray(s.associated_images[n]) for n in ("label", "macro")
                   if n in s.associated_images}
    res = export_pyramid(src, out, format=fmt, region=region, compression=compression,
                         tile_size=tile, quality=90, threads=2)
    with wsitool.open_slide(out) as s:
        reference = [s.read_region((0, 0), k, d, mode="rgb") for k, d in enumerate(s.level_dimensions)]
    return Export(out, fmt, compression, [tuple(d) for d in res.level_dimensions], mpp, carried,
                  reference, src, region)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def check_pixels(exp: Export, k: int, got: np.ndarray, reader: str) -> None:
    """Level ``k`` as ``reader`` decoded it equals wsitool's read of the output:
    exactly for deflate, within 40 dB PSNR for the lossy codecs (two decoders
    of one stream); a black or empty read (a reader lacking the codec) fails."""
    ref = exp.reference[k]
    got = np.asarray(got)[..., :3]
    assert got.shape == ref.shape, f"{reader} level {k}: shape {got.shape} != {ref.shape}"
    assert got.any(), f"{reader} level {k}: all black (no codec for {exp.compression}?)"
    if exp.compression == "deflate":
        np.testing.assert_array_equal(got, ref, err_msg=f"{reader} level {k}")
    else:
        value = psnr(got, ref)
        assert value >= 40.0, f"{reader} level {k}: PSNR {value:.1f} dB against wsitool"


def expected_mpp(exp: Export, k: int = 0) -> tuple[float, float] | None:
    if exp.mpp is None:
        return None
    w0, h0 = exp.dims[0]
    w, h = exp.dims[k]
    return exp.mpp[0] * w0 / w, exp.mpp[1] * h0 / h


def check_mpp(exp: Export, got, reader: str, k: int = 0) -> None:
    want = expected_mpp(exp, k)
    if want is None:
        assert got is None, f"{reader}: MPP {got} for a source without MPP"
    else:
        assert got is not None, f"{reader}: no MPP"
        assert got == pytest.approx(want, rel=1e-4), f"{reader} level {k}: MPP {got} != {want}"


def expected_names(exp: Export) -> set[str]:
    names = set(exp.associated)
    return names | {"thumbnail"} if exp.fmt == "tiff" else names


def check_associated(exp: Export, read: Callable[[str], np.ndarray], reader: str) -> None:
    """Carried label (LZW: exact) and macro (JPEG: >= 35 dB) against the source's;
    the thumbnail (JPEG) against the output level it was made from (>= 30 dB)."""
    for name, ref in exp.associated.items():
        got = np.asarray(read(name))[..., :3]
        assert got.shape == ref.shape, f"{reader} {name}: shape {got.shape} != {ref.shape}"
        if name == "label":
            np.testing.assert_array_equal(got, ref, err_msg=f"{reader} label")
        else:
            assert psnr(got, ref) >= 35.0, f"{reader} {name}: PSNR {psnr(got, ref):.1f} dB"
    if exp.fmt == "tiff":
        kt = _thumbnail_level(exp.dims)
        got = np.asarray(read("thumbnail"))[..., :3]
        assert got.shape == exp.reference[kt].shape, f"{reader} thumbnail: shape {got.shape}"
        assert kt == len(exp.dims) - 1  # never larger than the smallest level (Bio-Formats)
        # two lossy encodings (JPEG thumbnail, the level's tiles) of the same pixels
        assert psnr(got, exp.reference[kt]) >= 30.0, f"{reader} thumbnail"


def tiff_resolution_mpp(page) -> tuple[float, float] | None:
    """MPP from XResolution / YResolution in ResolutionUnit centimetre (TIFF 6.0 section 8)."""
    if page.resolutionunit != tifffile.RESUNIT.CENTIMETER:
        return None
    xr, yr = page.get_resolution()
    return 1e4 / xr, 1e4 / yr


# ---------------------------------------------------------------------- the readers


def test_wsitool(exported):
    exp = exported
    with wsitool.open_slide(exp.path) as s:
        assert s.vendor == ("aperio" if exp.fmt == "tiff" else "ome-tiff")
        assert [tuple(d) for d in s.level_dimensions] == exp.dims
        check_mpp(exp, s.mpp, "wsitool")
        assert set(s.associated_images) == expected_names(exp)
        check_associated(exp, lambda n: s.associated_images[n], "wsitool")
    # level 0 against the source itself: the export kept it
    with wsitool.open_slide(exp.source) as src:
        x, y, w, h = exp.region or (0, 0, *src.dimensions)
        ref = src.read_region((x, y), 0, (w, h), mode="rgb")
    value = psnr(exp.reference[0], ref)
    # a sanity check (same image, not shifted or black); tile quality is pinned in test_export.py
    assert value >= (float("inf") if exp.compression == "deflate" else 30.0), f"level 0 vs source: {value:.1f} dB"


def test_openslide(exported):
    exp = exported
    if exp.fmt != "tiff":
        pytest.skip("OpenSlide does not read OME-TIFF (issue 14 lists no OpenSlide check for it)")
    openslide = pytest.importorskip("openslide")
    osr = openslide.OpenSlide(str(exp.path))
    try:
        assert osr.properties["openslide.vendor"] == "aperio"
        assert [tuple(d) for d in osr.level_dimensions] == exp.dims
        mpp = None
        if "openslide.mpp-x" in osr.properties:
            mpp = (float(osr.properties["openslide.mpp-x"]), float(osr.properties["openslide.mpp-y"]))
        check_mpp(exp, mpp, "OpenSlide")
        assert set(osr.associated_images) == expected_names(exp)
        check_associated(exp, lambda n: osr.associated_images[n].convert("RGB"), "OpenSlide")
        for k, d in enumerate(exp.dims):
            check_pixels(exp, k, np.asarray(osr.read_region((0, 0), k, d)), "OpenSlide")
    finally:
        osr.close()


def test_tiffslide(exported):
    exp = exported
    tiffslide = pytest.importorskip("tiffslide")
    with tiffslide.TiffSlide(exp.path) as ts:
        assert [tuple(d) for d in ts.level_dimensions] == exp.dims
        mx, my = ts.properties.get("tiffslide.mpp-x"), ts.properties.get("tiffslide.mpp-y")
        check_mpp(exp, (mx, my) if mx is not None else None, "tiffslide")
        assert set(ts.associated_images) == expected_names(exp)
        check_associated(exp, lambda n: ts.associated_images[n].convert("RGB"), "tiffslide")
        for k, d in enumerate(exp.dims):
            check_pixels(exp, k, ts.read_region((0, 0), k, d, as_array=True), "tiffslide")


def test_tifffile(exported):
    exp = exported
    with tifffile.TiffFile(exp.path) as tf:
        series = tf.series[0]
        levels = series.levels
        assert [(lv.shape[-2], lv.shape[-3]) for lv in levels] == exp.dims
        names = {s.name.lower() for s in tf.series[1:]}
        if exp.fmt == "tiff":
            assert tf.is_svs
            assert series.name == "Baseline"
            desc = svs_description_metadata(tf.pages[0].description)
            mpp = (desc["MPP"], desc["MPP"]) if "MPP" in desc else None
            check_mpp(exp, mpp, "tifffile (Aperio MPP)")
            # the layout itself: IFD 1 a stripped thumbnail, label 1 / macro 9 at the end
            assert not tf.pages[1].is_tiled and tf.series[1].name == "Thumbnail"
            subtypes = {s.name.lower(): int(s.keyframe.subfiletype) for s in tf.series[1:]}
            assert subtypes == {"thumbnail": 0, **{n: {"label": 1, "macro": 9}[n] for n in exp.associated}}
            for s in tf.series[1:]:
                assert not s.keyframe.is_tiled
        else:
            assert tf.is_ome
            pixels = tifffile.xml2dict(tf.ome_metadata)["OME"]["Image"]
            pixels = (pixels[0] if isinstance(pixels, list) else pixels)["Pixels"]
            mpp = None
            if "PhysicalSizeX" in pixels:
                assert pixels["PhysicalSizeXUnit"] == "µm"
                mpp = (pixels["PhysicalSizeX"], pixels["PhysicalSizeY"])
            check_mpp(exp, mpp, "tifffile (OME PhysicalSize)")
        assert names == expected_names(exp)
        by_name = {s.name.lower(): s for s in tf.series[1:]}
        check_associated(exp, lambda n: by_name[n].asarray(), "tifffile")
        for k, lv in enumerate(levels):
            check_mpp(exp, tiff_resolution_mpp(lv.keyframe), "tifffile (resolution tags)", k)
            check_pixels(exp, k, np.squeeze(lv.asarray()), "tifffile")


def test_ome_xml_is_valid_against_the_ome_schema(exported):
    exp = exported
    if exp.fmt != "ome-tiff":
        pytest.skip("Aperio TIFF has no OME-XML")
    ome_types = pytest.importorskip("ome_types", reason="ome-types (test extra) validates OME-XML")
    with tifffile.TiffFile(exp.path) as tf:
        xml = tf.ome_metadata
    ome_types.validate_xml(xml)  # raises on an invalid document
    ome = ome_types.from_xml(xml)
    assert [im.name for im in ome.images[1:]] == [n for n in ("label", "macro") if n in exp.associated]
    px = ome.images[0].pixels
    assert (px.size_x, px.size_y) == exp.dims[0]
    if exp.mpp is not None:
        assert (px.physical_size_x, px.physical_size_y) == pytest.approx(expected_mpp(exp), rel=1e-6)
    # the validator is live: a broken document is refused (ome_types.ValidationError, a ValueError)
    with pytest.raises(ValueError):
        ome_types.validate_xml(xml.replace('DimensionOrder="XYCZT"', 'DimensionOrder="bogus"', 1))


def test_libvips(exported):
    exp = exported
    pyvips = pytest.importorskip("pyvips", reason="pyvips (test extra) not installed")
    if exp.compression == "jpeg2000" and not pyvips.type_find("VipsOperation", "jp2kload"):
        pytest.skip("this libvips (pyvips-binary) has no JPEG 2000 codec: it fails on 33005 tiles "
                    "and reads 34712 tiles as black")
    first = pyvips.Image.tiffload(str(exp.path), page=0)
    if exp.fmt == "tiff":
        n = first.get("n-pages")
        tiled = [p for p in range(n)
                 if "tile-width" in pyvips.Image.tiffload(str(exp.path), page=p).get_fields()]
        # levels are the tiled pages: IFD 0 and IFD 2...; IFD 1 is the stripped thumbnail
        assert tiled == [0, *range(2, len(exp.dims) + 1)]
        assert n == len(exp.dims) + 1 + len(exp.associated)
        images = [pyvips.Image.tiffload(str(exp.path), page=p) for p in tiled]
    else:
        assert first.get("n-pages") == 1 + len(exp.associated)  # the pyramid, label, macro
        images = [first] + [pyvips.Image.tiffload(str(exp.path), page=0, subifd=k)
                            for k in range(len(exp.dims) - 1)]
    assert [(im.width, im.height) for im in images] == exp.dims
    for k, im in enumerate(images):
        # libvips reports resolution in pixels per millimetre; 1.0 when the file has none
        mpp = None if exp.mpp is None else (1e3 / im.get("xres"), 1e3 / im.get("yres"))
        if exp.mpp is None:
            assert im.get("xres") == pytest.approx(1.0)
        check_mpp(exp, mpp, "libvips", k)
        check_pixels(exp, k, im.numpy(), "libvips")


# ---------------------------------------------------------------------- dropping label / macro


@pytest.mark.parametrize("fmt,name", list(FORMATS.items()))
def test_no_label_and_no_associated(tmp_path, cmu1, fmt, name):
    region = (300, 500, 512, 512)
    thumb = {"thumbnail"} if fmt == "tiff" else set()
    for kwargs, expect in (({}, {"label", "macro"}), ({"label": False}, {"macro"}),
                           ({"associated": False}, set())):
        out = tmp_path / f"{len(kwargs)}-{kwargs.get('label', 'x')}-{name}"
        export_pyramid(cmu1, out, format=fmt, region=region, **kwargs)
        with wsitool.open_slide(out) as s:
            assert set(s.associated_images) == expect | thumb, kwargs
        with tifffile.TiffFile(out) as tf:
            assert {x.name.lower() for x in tf.series[1:]} == expect | thumb, kwargs
            if "label" not in expect:  # the label's pixels are nowhere in the file
                assert not any("label" in (p.description or "") for p in tf.pages)


def test_cli_no_label_and_no_associated(tmp_path, cmu1):
    from wsitool.cli import app

    runner = CliRunner()
    region = ["300", "500", "256", "256"]
    for flag, expect in (("--no-label", {"thumbnail", "macro"}), ("--no-associated", {"thumbnail"})):
        out = tmp_path / f"o{flag}.svs"
        res = runner.invoke(app, ["export-pyramid", str(cmu1), str(out), "--region", *region,
                                  "--quiet", flag])
        assert res.exit_code == 0, res.output
        with wsitool.open_slide(out) as s:
            assert set(s.associated_images) == expect


def test_single_level_export_still_has_the_aperio_thumbnail(tmp_path, cmu1):
    """A region that fits in one tile: one level, the thumbnail a copy of it (IFD 1)."""
    out = tmp_path / "one.svs"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = export_pyramid(cmu1, out, region=(0, 0, 200, 150), compression="deflate")
    assert res.level_dimensions == [(200, 150)]
    with tifffile.TiffFile(out) as tf:
        assert [s.name for s in tf.series] == ["Baseline", "Thumbnail", "Label", "Macro"]
        assert len(tf.series[0].levels) == 1
        assert tf.series[1].shape[:2] == (150, 200)


def test_a_black_read_counts_as_a_failure(exported):
    """What a reader without the codec returns (libvips on 34712 tiles: black, no error)
    is caught by the pixel check, so no reader can pass by decoding nothing."""
    with pytest.raises(AssertionError, match="all black"):
        check_pixels(exported, 0, np.zeros_like(exported.reference[0]), "a reader without the codec")
