"""The render's memory bound and its pieces: band-by-band finishing, rows read as bands, the
area filter fed in chunks (all the same pixels as before), the bound against what numpy
allocates, the render memory budget, the limits and info.json that follow from the bounds."""

from __future__ import annotations

import asyncio
import itertools
import threading
import tracemalloc

import imagecodecs
import numpy as np
import pytest

import wsitool
from wsitool.ground.areafilter import AreaReducer, reduce_area
from wsitool.serve.bounds import RenderBudget, area_within, decode_bytes, iiif_admits
from wsitool.serve.iiif import info_document, service_limits
from wsitool.serve.render import (
    Finisher,
    RenderCancelled,
    encode,
    finish,
    plan_read,
    read_rows,
    read_scaled,
    work_bytes,
)

from helpers import REPO

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"   # 1536 x 1152, levels 1, 2, 4, 256-pixel tiles

#: (level-0 region, output size): exact, block means, taps down, taps up (wider than the source),
#: a tall vertical ratio
REQUESTS = [((0, 0, 1536, 1152), (1536, 1152)), ((0, 0, 1536, 1152), (768, 576)),
            ((37, 11, 1000, 700), (333, 233)), ((100, 50, 700, 500), (2000, 1500)),
            ((0, 0, 1536, 1152), (1500, 7))]


def _plan(slide, region, out):
    return plan_read(slide.level_dimensions, slide.level_downsamples, region, out)


@pytest.mark.parametrize("quality", ["color", "gray", "bitonal"])
def test_finisher_gives_finish_for_any_bands(quality):
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (37, 23, 3), dtype=np.uint8)
    for mirror in (False, True):
        for rotation in (0, 90, 180, 270):
            want = finish(rgb, mirror, rotation, quality)
            for rgb_out in (False, True):
                f = Finisher(23, 37, mirror, rotation, quality, rgb_out)
                cuts = sorted({0, 37, *rng.integers(1, 37, 4).tolist()})
                for a, b in itertools.pairwise(cuts):
                    f.put(a, rgb[a:b])
                got = f.image
                assert got.flags.c_contiguous
                if rgb_out and want.ndim == 2:
                    want3 = np.repeat(want[..., None], 3, axis=2)   # what WebP was given before
                    assert np.array_equal(got, want3), (mirror, rotation, quality)
                else:
                    assert np.array_equal(got, want), (mirror, rotation, quality, rgb_out)


def test_finisher_converts_a_wide_band_in_pieces():
    rgb = np.random.default_rng(1).integers(0, 256, (40, 9000, 3), dtype=np.uint8)
    f = Finisher(9000, 40, True, 90, "gray")
    assert f._chunk < 40   # several pieces
    f.put(0, rgb)
    assert np.array_equal(f.image, finish(rgb, True, 90, "gray"))


def test_read_rows_gives_the_pixels_of_read_scaled():
    slide = wsitool.open_slide(SLIDE)
    for region, out in REQUESTS:
        plan = _plan(slide, region, out)
        want = read_scaled(slide, plan)
        got = np.zeros_like(want)
        seen: list[int] = []

        def rows(row, band, got=got, seen=seen):
            got[row:row + band.shape[0]] = band
            seen.append(row)

        read_rows(slide, plan, rows)
        assert np.array_equal(got, want), (region, out)
        assert seen == sorted(seen)
        # and read_scaled with a cancel event (an exact read larger than a strip goes in strips)
        assert np.array_equal(read_scaled(slide, plan, cancel=threading.Event()), want)


def test_a_set_cancel_event_stops_the_read_before_a_strip():
    slide = wsitool.open_slide(SLIDE)
    cancel = threading.Event()
    calls = []

    class Counting:
        levels = slide.levels

        def read_region(self, *args, **kwargs):
            calls.append(1)
            cancel.set()   # the client goes during the first strip
            return slide.read_region(*args, **kwargs)

    plan = _plan(slide, (0, 0, 1536, 1152), (1536, 1152))
    for run in (lambda: read_scaled(Counting(), plan, cancel=cancel),
                lambda: read_rows(Counting(), plan, lambda r, b: None, cancel=cancel),
                lambda: read_rows(Counting(), _plan(slide, (0, 0, 700, 500), (2000, 1500)), lambda r, b: None,
                                  cancel=cancel)):
        calls.clear()
        cancel.clear()
        with pytest.raises(RenderCancelled):
            run()
        assert len(calls) == 1


def test_area_reducer_sink_and_feed_chunks_give_the_same_pixels():
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, (300, 200, 3), dtype=np.uint8)
    for box, ow, oh in [((0, 0, 200, 300), 100, 150), ((0.5, 1.25, 199, 297.5), 61, 83),
                        ((0, 0, 200, 300), 900, 1300), ((3, 0, 180, 300), 170, 4)]:
        want = reduce_area(src, box, ow, oh)
        got = np.zeros_like(want)
        r = AreaReducer(200, 300, box, ow, oh, 3, sink=lambda row, b, got=got: got.__setitem__(
            slice(row, row + b.shape[0]), b))
        assert r.out.shape[0] == 0   # nothing kept
        feed = r.feed_rows(1 << 16)
        assert feed >= 1
        for k in range(0, 300, 7):   # strips of 7 rows, each fed in chunks
            for j in range(k, min(300, k + 7), feed):
                r.feed(src[j:min(j + feed, k + 7, 300)])
        assert np.array_equal(got, want), (box, ow, oh)


def test_feed_rows_keeps_an_upscaled_strip_within_its_budget():
    r = AreaReducer(2000, 3000, (0, 0, 2000, 3000), 8000, 12000, 3)
    n = r.feed_rows(4 << 20)
    assert 1 <= n and 13 * n * 8000 * 3 <= 4 << 20
    assert AreaReducer(2000, 3000, (0, 0, 2000, 3000), 1000, 1500, 3).feed_rows(1) == 3000  # block means


@pytest.mark.parametrize("banded", [False, True])
def test_work_bytes_bounds_what_numpy_allocates(banded):
    """The working set the bound counts is at least what the read and finishing allocate
    beside the final image (numpy's allocations, traced), the tile decodes counted apart."""
    slide = wsitool.open_slide(SLIDE)
    for region, out in REQUESTS:
        plan = _plan(slide, region, out)
        lv = slide.levels[plan.level]
        read_scaled(slide, plan)   # (imports and first-use buffers before tracing)
        ow, oh = out
        tracemalloc.start()
        try:
            if banded:
                f = Finisher(ow, oh, True, 90, "gray")
                image = f.image.nbytes
                read_rows(slide, plan, f.put, threads=2)
            else:
                image = ow * oh * 3
                read_scaled(slide, plan, threads=2)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak <= image + work_bytes(plan, lv.tile_height, banded) + decode_bytes(lv, 2), (region, out)


def test_the_webp_and_png_encoders_take_no_more_than_the_bound_says():
    """Lossless WebP at method 0: the same pixels; PNG / JPEG outputs of noise: at most the image."""
    img = np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    for fmt in ("png", "jpg"):
        assert len(encode(img, fmt)) <= 2 * img.nbytes
    assert np.array_equal(imagecodecs.webp_decode(encode(img, "webp")), img)
    wide = np.zeros((2, 16382, 3), np.uint8)   # the advertised largest side
    assert encode(wide, "webp")[8:12] == b"WEBP" and encode(wide, "jpg")[:2] == b"\xff\xd8"


def test_render_budget_serves_in_order_and_never_over():
    async def main():
        budget = RenderBudget(100)
        order: list[str] = []

        async def job(name, n, hold):
            await budget.reserve(n)
            order.append(name)
            assert budget.reserved <= budget.total
            await asyncio.sleep(hold)
            budget.release(n)

        big = asyncio.create_task(job("a", 70, 0.05))
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(job("b", 60, 0)), asyncio.create_task(job("c", 10, 0))]
        await asyncio.gather(big, *tasks)
        assert order == ["a", "b", "c"]   # c fits beside a, but does not overtake b
        assert budget.reserved == 0 and budget.peak <= 100

        # a waiter cancelled leaves nothing reserved, and the next one goes
        await budget.reserve(90)
        waiter = asyncio.create_task(budget.reserve(50))
        after = asyncio.create_task(budget.reserve(10))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.wait_for(after, 5)
        assert budget.reserved == 100
        with pytest.raises(ValueError):
            await budget.reserve(101)

    asyncio.run(main())


def test_limits_and_info_follow_the_bounds():
    lim = service_limits()
    assert lim.max_width == lim.max_height == 16382   # what every encoder takes
    assert service_limits(area_cap=1000).max_area == 1000
    assert area_within(768 << 20) >= 1 << 26 > area_within(256 << 20)
    slide = wsitool.open_slide(SLIDE)

    def admit(limit):
        return lambda region, size: iiif_admits(slide, region, size, 0.01, limit, 768 << 20)

    full = info_document("http://h/x", 1536, 1152, 256, lim, admit(1 << 28))
    assert full["tiles"][0]["scaleFactors"] == [1, 2, 4, 8]
    assert len(full["sizes"]) == 4
    # all of level 2 (384 x 288) at most: the sizes it gives, every tile
    level2 = info_document("http://h/x", 1536, 1152, 256, lim, admit(384 * 288))
    assert level2["tiles"][0]["scaleFactors"] == [1, 2, 4, 8]
    assert [s["width"] for s in level2["sizes"]] == [192, 384]
    # less: no whole-image size, and not factor 8 (its one tile reads all of level 2)
    small = info_document("http://h/x", 1536, 1152, 256, lim, admit(300 * 300))
    assert small["tiles"][0]["scaleFactors"] == [1, 2, 4]
    assert small["sizes"] == []
