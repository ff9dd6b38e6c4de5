"""The reusable area filter (``AreaFilter``) gives ``reduce_area``'s pixels, window after window."""

from __future__ import annotations

import numpy as np
import pytest

from wsitool.ground.areafilter import AreaFilter, reduce_area


@pytest.mark.parametrize("src, box, out", [
    ((448, 448), (0, 0, 448, 448), (224, 224)),      # block means (integer ratio)
    ((491, 491), (0, 0, 490.8, 490.8), (224, 224)),  # weighted taps (fractional)
    ((101, 61), (0, 0, 100.5, 60.25), (224, 112)),   # upscaling across, reducing down
    ((300, 250), (3, 2, 297, 249), (71, 64)),
])
def test_apply_equals_reduce_area_for_each_window(src, box, out):
    rng = np.random.default_rng(0)
    filt = AreaFilter(src[0], src[1], box, out[0], out[1], 3)
    dest = np.empty((out[1], out[0], 3), np.uint8)
    for _ in range(3):   # state from one window must not leak into the next
        window = rng.integers(0, 256, (src[1], src[0], 3), dtype=np.uint8)
        assert filt.apply(window, dest) is dest
        np.testing.assert_array_equal(dest, reduce_area(window, box, out[0], out[1]))
