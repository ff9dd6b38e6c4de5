"""The Aperio SVS rules (:mod:`wsitool.formats.tiff.aperio`): which stripped IFDs are which
associated image, the ImageDescription's fields, and two real slides against OpenSlide."""

from __future__ import annotations

import types

import numpy as np
import pytest

import wsitool
from wsitool.formats.tiff import aperio


def _page(tiled: bool, desc: str = "", subfiletype: int = 0) -> types.SimpleNamespace:
    """A stand-in for a tifffile page: what the naming rule reads."""
    return types.SimpleNamespace(is_tiled=tiled, description=desc, subfiletype=subfiletype)


def test_tiled_ifds_are_levels_and_stripped_ones_are_named():
    assert aperio.associated_name(_page(True, "label"), 3) is None  # tiled: a level, whatever it says
    assert aperio.associated_name(_page(False, "Aperio Image\nlabel 387x463"), 3) == "label"
    assert aperio.associated_name(_page(False, "Aperio Image\r\nmacro 1280x431"), 4) == "macro"
    assert aperio.associated_name(_page(False, "", subfiletype=9), 4) == "macro"  # reduced + macro
    assert aperio.associated_name(_page(False, "", subfiletype=1), 3) == "label"  # reduced, not IFD 1
    assert aperio.associated_name(_page(False, "", subfiletype=1), 1) == "thumbnail"
    assert aperio.associated_name(_page(False), 1) == "thumbnail"
    assert aperio.associated_name(_page(False), 5) == "associated-5"
    assert aperio.associated_name(_page(False, "labels"), 5) == "associated-5"  # whole words only


def test_description_fields_become_properties_with_mpp_and_magnification():
    props: dict[str, str] = {}
    desc = "Aperio Image Library v10\r\n46000x32914 (256x256) JPEG/RGB Q=30|AppMag = 20|MPP = 0.4990|Date = 12/29/09"
    assert aperio.description_metadata(desc, props) == (0.499, 0.499, 20.0)
    assert props == {"aperio.AppMag": "20", "aperio.MPP": "0.4990", "aperio.Date": "12/29/09"}
    bad: dict[str, str] = {}
    assert aperio.description_metadata("Aperio Image Library|MPP = -1|AppMag = x", bad) == (None, None, None)
    assert aperio.is_aperio(desc) and not aperio.is_aperio("ImageJ=1.5")


def test_aperio_metadata_and_associated_images(cmu1):
    openslide = pytest.importorskip("openslide", reason="openslide-python is the test oracle")
    osr = openslide.OpenSlide(str(cmu1))
    with wsitool.open_slide(cmu1) as slide:
        assert slide.mpp == (0.499, 0.499)
        assert slide.objective_power == 20
        assert slide.properties["aperio.AppMag"] == osr.properties["aperio.AppMag"]
        assert slide.properties["aperio.MPP"] == osr.properties["aperio.MPP"]
        for name in ("label", "macro", "thumbnail"):
            ours = slide.associated_images[name]
            theirs = np.asarray(osr.associated_images[name].convert("RGB"))
            assert ours.dtype == np.uint8 and ours.shape == theirs.shape
            assert np.abs(ours.astype(int) - theirs).max() <= 1, name
        with pytest.raises(KeyError):
            slide.associated_images["nope"]


def test_jpeg2000_aperio_levels(tcga_j2k):
    with wsitool.open_slide(tcga_j2k) as slide:
        assert slide.levels[0].compression == "APERIO_JP2000_RGB"
        assert slide.levels[0].decoder == "nvimagecodec"
        assert slide.mpp is None  # this TCGA file has no MPP field, as OpenSlide reports
        assert list(slide.associated_images) == ["thumbnail"]
