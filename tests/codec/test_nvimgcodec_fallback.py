"""Reads where nvImageCodec cannot be imported: the imagecodecs path decodes JPEG and JPEG 2000 with the same pixels.

Each check runs in a subprocess that blocks ``nvidia.nvimgcodec`` before
wsitool is imported (``sys.modules[name] = None`` makes every import of it
raise ImportError, as on a platform without its wheel); the pixels it reads
are compared with this process's normal reads.  Measured on the shared
samples: every pixel equal (max difference 0) for JPEG and JPEG 2000, both
paths link libjpeg-turbo / OpenJPEG with the same IDCT and wavelet; the
tolerance pinned below for JPEG is therefore 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import wsitool
from wsitool.codec import library
from wsitool.codec.library import fallback_encoding
from wsitool.slide import pyramid_levels

from helpers import shared_sample

#: Largest per-sample difference allowed between the two paths, by tile stream.
#: JPEG could differ by an IDCT rounding where the two libjpeg-turbo builds chose
#: different IDCT code; measured 0 on every sample (imagecodecs 2026.3.6,
#: nvImageCodec 0.9.0.20), so any difference now is a change worth seeing.
TOLERANCE = {"jpeg": 0, "j2k": 0}

SAMPLES = [
    "aperio-cmu1-small-region-jpeg.svs",           # JPEG, RGB tiles with JPEGTables
    "aperio-tcga-cr-7395-jp2k-33005-2level.svs",   # Aperio JPEG 2000 33005, two levels
    "dicom-google-jpeg-ybr-957x715.dcm",           # DICOM JPEG frames, YBR_FULL_422
    "dicom-google-jp2k-lossless-957x715.dcm",      # DICOM JPEG 2000 frames
]

_BLOCK = "import sys; sys.modules['nvidia.nvimgcodec'] = None\n"

_READ_SCRIPT = _BLOCK + textwrap.dedent("""
    import json, numpy as np, wsitool
    from wsitool.codec.backends import backend_report
    from wsitool.codec import library
    out = {"available": library.available(), "reason": library.unavailable_reason(), "slides": {}}
    for path, npz in json.loads(sys.argv[1]):
        with wsitool.Slide(path) as s:
            arrays = {}
            for i, (w, h) in enumerate(s.level_dimensions):
                arrays[f"rgb{i}"] = s.read_region((0, 0), i, (w, h), mode="rgb")
            # a window inside the tiles, RGBA (partial tiles, the alpha channel)
            arrays["rgba"] = s.read_region((37, 53), 0, (301, 203), mode="rgba")
            np.savez(npz, **arrays)
            out["slides"][path] = [lv.decoder for lv in s.levels]
    out["backends"] = backend_report(probe=False)
    print(json.dumps(out))
""")


def _blocked(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def blocked_reads(tmp_path_factory):
    paths = [shared_sample(name) for name in SAMPLES]
    tmp = tmp_path_factory.mktemp("fallback")
    jobs = [(str(p), str(tmp / f"{i}.npz")) for i, p in enumerate(paths)]
    proc = _blocked(_READ_SCRIPT, json.dumps(jobs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1]), jobs


def test_blocked_import_is_reported(blocked_reads):
    report, _jobs = blocked_reads
    assert report["available"] is False
    assert "nvidia-nvimgcodec-cu12" in report["reason"] and "halted; None in sys.modules" in report["reason"]
    rows = {row["name"]: row for row in report["backends"]}
    nv_row = rows["CPU: nvImageCodec (libjpeg-turbo, OpenJPEG)"]
    assert nv_row["available"] is False and "cannot be imported" in nv_row["detail"]
    assert "imagecodecs" in nv_row["detail"]
    loop = rows["CPU: compiled JPEG tile loop (wsitool._jpegloop)"]
    assert loop["available"] is False and "cannot be imported" in loop["detail"]
    assert "JPEG 2000 included" in rows["CPU: tifffile + imagecodecs"]["decodes"]


@pytest.mark.parametrize("index", range(len(SAMPLES)), ids=SAMPLES)
def test_fallback_reads_the_same_pixels(blocked_reads, index):
    report, jobs = blocked_reads
    path, npz = jobs[index]
    # every level went to tifffile (TIFF pages) or imagecodecs (DICOM frames)
    assert set(report["slides"][path]) <= {"tifffile", "imagecodecs"}
    got = np.load(npz)
    with wsitool.Slide(path) as s:
        assert pyramid_levels(s)[0].decoder == "nvimagecodec"  # the reference is the nvImageCodec path
        tol = TOLERANCE[pyramid_levels(s)[0].encoding.stream]
        for i, (w, h) in enumerate(s.level_dimensions):
            ref = s.read_region((0, 0), i, (w, h), mode="rgb")
            diff = np.abs(ref.astype(np.int16) - got[f"rgb{i}"].astype(np.int16))
            assert diff.max() <= tol, f"level {i}: max difference {diff.max()}"
        ref = s.read_region((37, 53), 0, (301, 203), mode="rgba")
        assert np.abs(ref.astype(np.int16) - got["rgba"].astype(np.int16)).max() <= tol
        assert (got["rgba"][..., 3] == 255).all()


def test_info_backends_says_why(cmu1):
    code = _BLOCK + "from wsitool.cli import main; main(sys.argv[1:])"
    proc = _blocked(code, "info", str(cmu1), "--backends", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    nv_row = next(b for b in data["backends"] if b["name"].startswith("CPU: nvImageCodec"))
    assert nv_row["available"] is False
    assert "cannot be imported" in nv_row["detail"] and "imagecodecs" in nv_row["detail"]
    assert {lv["decoder"] for lv in data["levels"]} == {"tifffile"}


def test_exports_without_nvimgcodec(tcga_j2k, tmp_path):
    # JPEG 2000 in and out (OpenJPEG through imagecodecs on both sides): no nvImageCodec needed
    code = _BLOCK + "from wsitool.cli import main; main(sys.argv[1:])"
    out = tmp_path / "out.tiff"
    proc = _blocked(code, "export-pyramid", str(tcga_j2k), str(out), "--compression", "jpeg2000",
                    "--region", "2000", "1600", "512", "512", "--quiet", "--threads", "2")
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    with wsitool.Slide(tcga_j2k) as src:
        ref = src.read_region((2000, 1600), 0, (512, 512), mode="rgb").astype(float)
    with wsitool.Slide(out) as s:
        assert s.dimensions == (512, 512) and pyramid_levels(s)[0].encoding.stream == "j2k"
        got = s.read_region((0, 0), 0, (512, 512), mode="rgb").astype(float)
    assert ref.std() > 10  # tissue, not background
    psnr = 10 * np.log10(255.0 ** 2 / np.mean((ref - got) ** 2))
    assert psnr > 35, psnr  # the export's default target is 40 dB


def test_fallback_encoding_only_changes_nv_levels(cmu1):
    with wsitool.Slide(cmu1) as s:
        enc = pyramid_levels(s)[0].encoding
    assert enc.codec == "nv"
    generic = fallback_encoding(enc)
    assert generic.codec == "generic" and generic.decoder == "tifffile"
    assert generic.jpeg_prefix == enc.jpeg_prefix and generic.page is enc.page
    assert fallback_encoding(generic) is generic


def test_available_here():
    # the test machine has nvImageCodec (a dependency on Linux x86_64): the reference path
    assert library.available() and library.unavailable_reason() is None
