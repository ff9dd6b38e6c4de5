"""JPEG export tiles: libjpeg-turbo through imagecodecs writes the bytes nvImageCodec's CPU
encoder (libjpeg-turbo too) writes for the same quality and subsampling, so moving the
encoder changed no output."""

from __future__ import annotations

import imagecodecs
import numpy as np
import pytest

import wsitool
from wsitool.codec.library import nv
from wsitool.errors import WsiError
from wsitool.export.encode import TileCodec

from helpers import repo_samples


@pytest.fixture(scope="module")
def tiles():
    path = next(p for p in repo_samples() if p.name == "sample-aperio-jpeg.svs")
    with wsitool.open_slide(path) as s:
        w, h = s.dimensions
        out = [np.ascontiguousarray(s.read_region((x, y), 0, (256, 256), mode="rgb"))
               for x, y in [(0, 0), (w // 3, h // 3), (w - 200, h - 100)]]
    out.append(np.zeros((16, 48, 3), np.uint8))  # flat and narrow
    return out


@pytest.mark.parametrize("quality", [30, 75, 89, 90, 100])
def test_jpeg_tiles_equal_nvimagecodec_bytes(tiles, quality):
    codec = TileCodec("tiff", "jpeg", quality)
    sub = nv().ChromaSubsampling.CSS_444 if quality >= 90 else nv().ChromaSubsampling.CSS_420
    params = nv().EncodeParams(quality_type=nv().QualityType.QUALITY, quality_value=float(quality),
                               chroma_subsampling=sub)
    encoder = nv().Encoder(device_id=nv().NVIMGCODEC_DEVICE_CPU_ONLY,
                           backends=[nv().Backend(nv().BackendKind.CPU_ONLY)])
    for tile in tiles:
        ours = codec.encode(tile)
        theirs = bytes(encoder.encode(tile, "jpeg", params=params))
        assert ours == theirs
        back = imagecodecs.jpeg8_decode(ours)
        assert back.shape == tile.shape
        assert np.abs(back.astype(int) - tile).mean() < (3 if quality >= 90 else 12)


def test_jpeg_encoder_failure_is_a_wsi_error():
    codec = TileCodec("tiff", "jpeg", 90)
    with pytest.raises(WsiError, match="could not encode"):
        codec.encode(np.zeros((0, 16, 3), np.uint8))
