"""IIIF Image API 3.0 parsing and geometry (wsitool.serve.iiif), the area filter and level planning."""

from __future__ import annotations

import numpy as np
import pytest

from wsitool.ground.areafilter import AreaReducer, reduce_area
from wsitool.serve.iiif import (
    IIIFError,
    ServiceLimits,
    info_document,
    parse_image_request,
    parse_region,
    parse_rotation,
    parse_size,
    scale_factors,
)
from wsitool.serve.render import finish, plan_read, thumbnail_size

LIM = ServiceLimits(4000, 4000, 4000 * 3000)


def _status(fn, *args):
    with pytest.raises(IIIFError) as e:
        fn(*args)
    return e.value.status


def test_regions():
    assert parse_region("full", 300, 200) == (0, 0, 300, 200)
    assert parse_region("square", 300, 200) == (50, 0, 200, 200)
    assert parse_region("square", 200, 301) == (0, 50, 200, 200)
    assert parse_region("10,20,1000,1000", 300, 200) == (10, 20, 290, 180)  # cut at the edges
    assert parse_region("pct:10,10,50,50", 300, 200) == (30, 20, 150, 100)
    assert parse_region("pct:0.5,.5,9.5,9", 1000, 1000) == (5, 5, 95, 90)
    for bad in ("", "0,0,0,10", "300,0,10,10", "0,200,1,1", "1,2,3", "-1,0,5,5", "pct:101,0,5,5",
                "pct:1,2,3", "x,y,w,h", "Full", "pct:0,0,0,5"):
        assert _status(parse_region, bad, 300, 200) == 400, bad


def test_sizes():
    assert parse_size("max", 300, 200, LIM) == ((300, 200), False, "max")
    assert parse_size("150,", 300, 200, LIM) == ((150, 100), False, "150,100")
    assert parse_size(",50", 300, 200, LIM) == ((75, 50), False, "75,50")
    assert parse_size("pct:50", 300, 200, LIM) == ((150, 100), False, "150,100")
    assert parse_size("10,10", 300, 200, LIM) == ((10, 10), False, "10,10")
    assert parse_size("!100,100", 300, 200, LIM) == ((100, 67), False, "100,67")
    assert parse_size("^600,", 300, 200, LIM) == ((600, 400), True, "^600,400")
    assert parse_size("^!2000,500", 1000, 1000, LIM) == ((500, 500), False, "500,500")
    assert parse_size("^max", 300, 200, LIM)[0] == (300, 200)
    assert parse_size("max", 8000, 8000, LIM)[0] == (3464, 3464)  # within maxArea
    for bad in ("600,", ",201", "pct:101", "!600,600", "0,", ",0", "0,0", "pct:0", "^5000,",
                "abc", ",", "full", "^", "!100,", "1.5,"):
        assert _status(parse_size, bad, 300, 200, LIM) == 400, bad


def test_rotation_quality_format():
    assert parse_rotation("0") == (False, 0, "0")
    assert parse_rotation("!90") == (True, 90, "!90")
    assert parse_rotation("360") == (False, 0, "0")
    assert parse_rotation("180.0") == (False, 180, "180")
    assert _status(parse_rotation, "45") == 501
    assert _status(parse_rotation, "361") == 400
    assert _status(parse_rotation, "-90") == 400
    req = parse_image_request("full", "max", "!270", "gray.png", 300, 200, LIM)
    assert req.output_size == (200, 300) and req.mirror and req.quality == "gray"
    assert req.canonical == "full/max/!270/gray.png"
    assert parse_image_request("0,0,300,200", "max", "0", "default.jpg", 300, 200,
                               LIM).canonical == "full/max/0/default.jpg"
    assert _status(parse_image_request, "full", "max", "0", "default.gif", 300, 200, LIM) == 501
    assert _status(parse_image_request, "full", "max", "0", "default.jpeg", 300, 200, LIM) == 400
    assert _status(parse_image_request, "full", "max", "0", "grey.jpg", 300, 200, LIM) == 400


def test_only_ascii_digits_and_no_trailing_newline():
    """Python's \\d takes every script's digits: "/dz/x_files/\uff11/0_0.jpeg" (fullwidth 1) was
    level 1, "\u0661,\u0661,\u0661\u0660,\u0661\u0660" (Arabic-Indic) a region; and "$" let "...\\n" through."""
    from wsitool.serve.dz import parse_dz_path

    for bad in ("\u0661,\u0661,\u0661\u0660,\u0661\u0660", "pct:\u0661,0,5,5", "0,0,10,10\n"):
        assert _status(parse_region, bad, 300, 200) == 400, bad
    for bad in ("\uff11\uff10,", "pct:\u0665\u0660", "!\u0661\u0660,10", "10,\n"):
        assert _status(parse_size, bad, 300, 200, LIM) == 400, bad
    for bad in ("\u0660", "90\n"):
        assert _status(parse_rotation, bad) == 400, bad
    for bad in ("x.svs_files/\uff11/0_0.jpeg", "x.svs_files/1/\u0660_0.jpeg", "x.svs_files/1/0_0.jpeg\n"):
        assert _status(parse_dz_path, bad) == 404, bad
    assert parse_dz_path("x.svs_files/12/3_4.png") == ("tile", "x.svs", 12, 3, 4, "png")


def test_info_document():
    info = info_document("http://h/iiif/3/x", 40000, 30000, 512, LIM)
    assert info["tiles"][0]["scaleFactors"] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert all(isinstance(f, int) for f in info["tiles"][0]["scaleFactors"])
    assert info["sizes"][0] == {"width": 313, "height": 235}
    assert all(s["width"] * s["height"] <= LIM.max_area for s in info["sizes"])
    assert info["profile"] == "level2" and info["type"] == "ImageService3"
    assert scale_factors(100, 50, 512) == [1]


def test_level_choice_and_snapping():
    dims = [(40000, 30000), (10000, 7500), (2500, 1875)]
    ds = [1.0, 4.0, 16.0]
    assert plan_read(dims, ds, (0, 0, 1024, 1024), (1024, 1024)).level == 0
    p = plan_read(dims, ds, (0, 0, 4096, 4096), (1024, 1024))
    assert p.level == 1 and p.exact
    p = plan_read(dims, ds, (0, 0, 40000, 30000), (313, 235))
    assert p.level == 2   # a thumbnail never reads level 0
    p = plan_read(dims, [1.0, 4.002, 16.01], (8192, 8192, 4096, 4096), (1024, 1024))
    assert p.level == 1 and p.exact  # 4.002 answers a scale of 4 (tolerance), snapped
    p = plan_read(dims, ds, (0, 0, 1000, 1000), (637, 637))
    assert p.level == 0 and not p.exact and p.box == (0, 0, 1000, 1000)


def test_area_filter_is_exact_and_strip_independent():
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    # an exact mean of 2x2 blocks
    blocks = src[:96, :130].reshape(48, 2, 65, 2, 3).astype(float).mean(axis=(1, 3))
    assert np.abs(reduce_area(src, (0, 0, 130, 96), 65, 48).astype(float) - blocks).max() <= 0.5
    for box, out in [((0.3, 1.7, 130.2, 95.5), (50, 33)), ((0, 0, 131, 97), (300, 200)),
                     ((0, 0, 131, 97), (1, 1)), ((10, 10, 12, 12), (7, 7))]:
        whole = reduce_area(src, box, *out)
        for step in (1, 5, 40):
            r = AreaReducer(131, 97, box, *out, 3)
            for y in range(0, 97, step):
                r.feed(src[y:y + step])
            assert np.array_equal(r.out, whole), (box, out, step)
    one = reduce_area(src, (0, 0, 131, 97), 1, 1)
    assert np.abs(one[0, 0].astype(float) - src.reshape(-1, 3).mean(axis=0)).max() <= 0.5


def test_finish_rotation_and_quality():
    img = np.zeros((2, 3, 3), np.uint8)
    img[0, 0] = (255, 0, 0)
    assert finish(img, False, 90, "color")[0, 1].tolist() == [255, 0, 0]
    assert finish(img, True, 0, "color")[0, 2].tolist() == [255, 0, 0]
    assert finish(img, False, 180, "color")[1, 2].tolist() == [255, 0, 0]
    gray = finish(img, False, 0, "gray")
    assert gray.shape == (2, 3) and gray[0, 0] == 77  # (77 R + 150 G + 29 B + 128) >> 8
    assert set(np.unique(finish(img, False, 270, "bitonal")).tolist()) <= {0, 255}
    white = np.full((1, 2, 3), 255, np.uint8)  # sums past 255: the luma must not wrap
    white[0, 1] = (200, 200, 200)
    assert finish(white, False, 0, "gray").tolist() == [[255, 200]]
    assert finish(white, False, 0, "bitonal").tolist() == [[255, 255]]
    dark = np.full((1, 1, 3), 100, np.uint8)
    assert finish(dark, False, 0, "bitonal").tolist() == [[0]]


def test_thumbnail_size_is_pillows():
    Image = pytest.importorskip("PIL.Image")
    for size in [(512, 512), (300, 7), (7, 300), (1, 1), (2221, 1783), (37, 31), (255, 254), (771, 193)]:
        for box in [(256, 256), (10, 8), (1, 1), (128, 3), (3000, 3000), (254, 255)]:
            im = Image.new("L", size)
            im.thumbnail(box)
            assert thumbnail_size(size, box) == im.size, (size, box)


# the forms of a region, size, rotation and Deep Zoom address that held a 400- or 5,000-digit number
LONG_FORMS = {
    "region x": ("{n},0,10,10", "max", "0"), "region w": ("0,0,{n},10", "max", "0"),
    "region pct": ("pct:0,0,{n},10", "max", "0"), "region pct x": ("pct:{n},0,10,10", "max", "0"),
    "region pct fraction": ("pct:0.{n},0,10,10", "max", "0"),
    "size w,": ("full", "{n},", "0"), "size ,h": ("full", ",{n}", "0"), "size ^w,": ("full", "^{n},", "0"),
    "size ^,h": ("full", "^,{n}", "0"), "size w,h": ("full", "^{n},{n}", "0"),
    "size !w,h": ("full", "!{n},{n}", "0"), "size ^!w,h": ("full", "^!{n},10", "0"),
    "size pct": ("full", "pct:{n}", "0"), "size ^pct": ("full", "^pct:{n}", "0"),
    "size ^pct fraction": ("full", "^pct:0.{n}", "0"),
    "rotation": ("full", "max", "{n}"), "rotation !": ("full", "max", "!{n}"),
    "rotation fraction": ("full", "max", "90.{n}"),
}


@pytest.mark.parametrize("digits", [400, 5000])
@pytest.mark.parametrize("form", sorted(LONG_FORMS))
def test_a_number_of_hundreds_of_digits_is_a_400_with_a_short_message(form, digits):
    """400 digits made float() infinite or a true division overflow, 5,000 made int() refuse
    (Python's 4,300-digit limit): 500s with a traceback in 9 forms (issue 47); a number of over
    20 digits is now a 400 naming the parameter, with at most ~40 characters of it repeated."""
    params = [p.format(n="9" * digits) for p in LONG_FORMS[form]]
    with pytest.raises(IIIFError) as e:
        parse_image_request(*params, "default.jpg", 1000, 800, LIM)
    assert e.value.status == 400 and len(e.value.message) < 120, e.value.message
    assert "more than 20 digits" in e.value.message
    # 20 digits still parse (a region cut at the edge, or a size over the limits: 400)
    ok = [p.format(n="9" * 20) for p in LONG_FORMS[form]]
    try:
        parse_image_request(*ok, "default.jpg", 1000, 800, LIM)
    except IIIFError as exc:
        assert exc.status in (400, 501) and "digits" not in exc.message


@pytest.mark.parametrize("digits", [400, 5000])
@pytest.mark.parametrize("where", ["{n}/0_0", "0/{n}_0", "0/0_{n}"])
def test_a_deep_zoom_address_of_hundreds_of_digits_is_a_400(where, digits):
    from wsitool.serve.dz import parse_dz_path

    with pytest.raises(IIIFError) as e:
        parse_dz_path("x.svs_files/" + where.format(n="9" * digits) + ".jpeg")
    assert e.value.status == 400 and len(e.value.message) < 120, e.value.message
    assert parse_dz_path("x.svs_files/" + where.format(n="9" * 20) + ".jpeg")[0] == "tile"
