"""A region planned once (wsitool.read.plan): its tiles, and the ranges its byte source is told."""

from __future__ import annotations

import types

import numpy as np

from wsitool.formats.dicom.web.frames import FRAME_STRIDE, FrameSource
from wsitool.formats.dicom.web.series import NOMINAL
from wsitool.read.plan import TilePlan, segment_ranges


def _level(offsets, counts, across, tile=10):
    """A stand-in level: ``across`` tiles of ``tile`` pixels a row, one plane."""
    rows = len(offsets) // across
    tiles = types.SimpleNamespace(offsets=np.asarray(offsets, np.uint64), bytecounts=np.asarray(counts, np.uint64),
                                  planes=1)
    return types.SimpleNamespace(tiles=tiles, tiles_across=across, tile_width=tile, tile_height=tile,
                                 width=across * tile, height=rows * tile, source=None)


def test_a_plan_knows_its_tiles_and_makes_its_jobs_once():
    lv = _level([1] * 12, [1] * 12, across=4)
    plan = TilePlan(lv, 5, -3, 20, 10)
    assert plan.inside == (5, 0, 25, 7) and (plan.c0, plan.c1, plan.r0, plan.r1) == (0, 2, 0, 0)
    assert plan.count == 3 and plan.first == 0
    jobs = plan.jobs()
    assert [(j.col, j.row) for j in jobs] == [(0, 0), (1, 0), (2, 0)] and plan.jobs() is jobs
    assert TilePlan(lv, 100, 0, 5, 5).inside is None and TilePlan(lv, 100, 0, 5, 5).count == 0
    assert TilePlan(lv, 0, 0, 11, 5).ends_one_column_into_a_tile()


def test_a_row_of_adjacent_tiles_is_one_range_and_scattered_tiles_one_each():
    offsets = [100, 200, 300, 400, 9000, 5000, 20000, 0]
    counts = [100, 100, 100, 100, 100, 100, 100, 100]
    lv = _level(offsets, counts, across=4)
    assert segment_ranges(lv, [(0, 3, 0, 1)]) == [(100, 400), (9000, 100), (5000, 100), (20000, 100)]


class _Client:
    """A DICOMweb client stand-in: every frame a few bytes, the requests logged."""

    def __init__(self):
        self.asked = []
        self.cache = types.SimpleNamespace(get=lambda key: None, put=lambda key, data: None)
        self.options = types.SimpleNamespace(operation_timeout=5)
        self.shown = "https://pacs.example/dicomweb/studies/1/series/2"

    def frames(self, sop, numbers, syntax, frame_bytes=None):
        self.asked.append(list(numbers))
        return [b"frame%d" % k for k in numbers]


def test_frame_rows_join_only_where_their_numbers_follow_and_the_source_asks_for_just_those():
    """A DICOMweb index gives frame k the address k * FRAME_STRIDE and the count NOMINAL: a row
    of consecutive frames is one advised range holding exactly those frames, a row of frames out
    of order (a sparse tiling) one range a frame; the frame source asks for the frames the
    ranges hold, in one request."""
    frames = [1, 2, 3, 7, 5, 9]
    lv = _level([k * FRAME_STRIDE for k in frames], [NOMINAL] * 6, across=3)
    ranges = segment_ranges(lv, [(0, 2, 0, 1)])
    assert len(ranges) == 4 and ranges[0] == (FRAME_STRIDE, 2 * FRAME_STRIDE + NOMINAL)
    client = _Client()
    src = FrameSource(client, "1.2.3", 10, "1.2.840.10008.1.2.4.50")
    src.advise(ranges)
    assert client.asked == [[1, 2, 3, 5, 7, 9]]
    assert src.read_segment(2 * FRAME_STRIDE, NOMINAL) == (b"frame2", 6)
    buf = bytearray(16)
    assert src.read_segment_into(9 * FRAME_STRIDE, NOMINAL, lambda n: memoryview(buf)[:n]) == (6, 6)
    assert client.asked == [[1, 2, 3, 5, 7, 9]] and bytes(buf[:6]) == b"frame9"  # (from the advised request)
