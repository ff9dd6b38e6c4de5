"""DICOM export with compression copy given hostile or unusual tile layouts: what the frames must be (whole
tiles, one coding), and one clear line with nothing left behind where they cannot be."""

from __future__ import annotations

import imagecodecs
import numpy as np
import pytest
import tifffile

from wsitool.errors import UnsupportedFormatError
from wsitool.export import export_pyramid

T = 64


def _pixels(seed: int, h: int = T, w: int = T) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.ascontiguousarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("verify", [False, True])
def test_cropped_edge_tiles_are_refused_naming_the_tile(tmp_path, verify):
    """A 300 x 250 level of 64-pixel tiles whose right and bottom tiles are stored cropped (44 and 58 pixels,
    which the read path accepts): a DICOM frame is Rows x Columns, so the export stops at tile (4, 0) with one
    line, exit 3, nothing left (was: frames of 44 x 64 pixels in a 64 x 64 instance, which OpenSlide refuses:
    "Dimensional mismatch reading JPEG")."""
    W, H, cols, rows = 300, 250, 5, 4
    tiles = [imagecodecs.jpeg8_encode(_pixels(r * cols + c, min(T, H - r * T), min(T, W - c * T)), level=90,
                                      colorspace="RGB", outcolorspace="RGB")
             for r in range(rows) for c in range(cols)]
    path = tmp_path / "crop.tif"
    with tifffile.TiffWriter(path) as tw:
        tw.write(iter(tiles), shape=(H, W, 3), dtype=np.uint8, tile=(T, T), compression="jpeg",
                 photometric="rgb")
    out = tmp_path / "out"
    with pytest.raises(UnsupportedFormatError) as info:
        export_pyramid(path, out, format="dicom", compression="copy", verify=verify, associated=False, mpp=0.5)
    msg = str(info.value)
    assert "\n" not in msg and path.name in msg and "tile (4, 0)" in msg and "44x64" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crop.tif"]
