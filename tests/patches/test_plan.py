"""Patch plans, tissue masks, plan files, extraction to tar shards and the ``wsitool patches`` commands."""

from __future__ import annotations

import io
import json
import math
import tarfile

import numpy as np
import pytest

pytest.importorskip("cv2", reason="the patches extra (opencv-python-headless) is not installed")
pytest.importorskip("pyarrow", reason="the patches extra (pyarrow) is not installed")
pytest.importorskip("h5py", reason="the patches extra (h5py) is not installed")

import h5py
import tifffile

import wsitool
from wsitool import InvalidRegionError
from wsitool.cli import main
from wsitool.errors import OutputExistsError
from wsitool.ground.areafilter import reduce_area
from wsitool.patches import detect_tissue, plan_patches, read_plan
from wsitool.patches.extract import extract_shards
from wsitool.patches.plan import PlanFileError, read_plans, write_plans
from wsitool.patches.preview import render_preview

from helpers import REPO_SAMPLES, shared_sample

SAMPLE = REPO_SAMPLES / "sample-aperio-jpeg.svs"   # MPP 0.5, levels at downsample 1, 2, 4


def _reference(slide, plan, i):
    """Patch ``i`` of ``plan`` read the simple way: read_region of the window, then the area filter."""
    x, y = int(plan.x[i]), int(plan.y[i])
    win = math.ceil(plan.read_size)
    region = slide.read_region((x, y), plan.level, (win, win), mode="rgb")
    if not plan.resampled:
        return region
    return reduce_area(region, (0, 0, plan.read_size, plan.read_size), plan.size, plan.size)


def _check_plan_patches(slide, plan, step=1):
    got = np.concatenate(list(plan.read_patches(slide, batch_size=16)))
    assert got.shape == (len(plan), plan.size, plan.size, 3)
    for i in range(0, len(plan), step):
        np.testing.assert_array_equal(got[i], _reference(slide, plan, i), err_msg=f"row {i}")


@pytest.mark.parametrize("name, kwargs, level, exact", [
    # the JPEG SVS at its MPP 0.499: level 0 within 5 % of 0.5, read as it is
    ("aperio-cmu1-small-region-jpeg.svs", dict(mpp=0.5), 0, True),
    # the J2K SVS records no MPP: an override of 0.2; 0.5 lies 20 % from level 1 (0.4001)
    ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", dict(mpp=0.5, mpp_override=0.2), 1, False),
    # with 0.25, level 1 (0.5001) is within 5 % and read as it is
    ("aperio-tcga-cr-7395-jp2k-33005-2level.svs", dict(mpp=0.5, mpp_override=0.25), 1, True),
    # a DICOM series at its own resolution
    ("dicom-cmu1-small-region-12level", dict(mpp=0.499), 0, True),
    # the NDPI, 40x at 0.228: 0.5 lies 9 % from level 1 (0.456), read from it and reduced
    ("ndpi-hamamatsu-stritt-dapi-fluor-3.5mb.ndpi", dict(mpp=0.5), 1, False),
])
def test_plans_on_real_slides_read_the_policy_level_and_match_the_reader(name, kwargs, level, exact):
    with wsitool.open_slide(shared_sample(name)) as slide:
        plan = plan_patches(slide, size=96, mask=None, **kwargs)
        assert plan.level == level and (plan.read_size == plan.size) == exact
        mpp0 = kwargs.get("mpp_override") or math.sqrt(slide.mpp[0] * slide.mpp[1])
        level_mpp = mpp0 * slide.level_downsamples[plan.level]
        assert plan.effective_mpp == pytest.approx(level_mpp * plan.read_size / plan.size, rel=1e-12)
        if not exact:
            assert plan.effective_mpp == pytest.approx(kwargs["mpp"], rel=1e-12)
        assert len(plan) > 0 and np.isnan(plan.tissue).all()
        _check_plan_patches(slide, plan, step=max(1, len(plan) // 25))


def test_the_grid_covers_the_slide_with_whole_patches_and_overlap():
    with wsitool.open_slide(SAMPLE) as slide:
        plan = plan_patches(slide, mpp=1.0, size=100, overlap=20, mask=None)
        # 1.0 um/px is level 1 exactly: 100-pixel patches there cover 200 level-0 pixels,
        # the stride is 80 level-1 pixels = 160 level-0 pixels
        assert (plan.level, plan.read_size) == (1, 100.0)
        xs, ys = np.unique(plan.x), np.unique(plan.y)
        assert xs[0] == 0 and np.all(np.diff(xs) == 160) and xs[-1] + 200 <= 1536 < xs[-1] + 160 + 200
        assert ys[0] == 0 and np.all(np.diff(ys) == 160) and ys[-1] + 200 <= 1152 < ys[-1] + 160 + 200
        assert len(plan) == len(xs) * len(ys)
        _check_plan_patches(slide, plan, step=7)


def test_resolution_errors_are_clear():
    path = shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs")
    with wsitool.open_slide(path) as slide:
        with pytest.raises(InvalidRegionError, match="no resolution"):
            plan_patches(slide, mpp=0.5, mask=None)
        with pytest.raises(InvalidRegionError, match="upscaled"):
            plan_patches(slide, mpp=0.1, mpp_override=0.25, mask=None)
        up = plan_patches(slide, mpp=0.2, mpp_override=0.25, mask=None, allow_upscale=True, size=64)
        assert up.level == 0 and up.read_size == pytest.approx(51.2)
    with wsitool.open_slide(SAMPLE) as slide:
        with pytest.raises(InvalidRegionError, match="exactly one"):
            plan_patches(slide, mpp=0.5, magnification=20, mask=None)
        by_mag = plan_patches(slide, magnification=10, mask=None)   # 20x slide at 0.5 -> 1.0 um/px
        assert by_mag.level == 1 and by_mag.effective_mpp == pytest.approx(1.0)


def _synthetic(tmp_path, name, colour, mpp=0.5, size=(2048, 1536)):
    """A tiled two-level slide of one colour with noise (Aperio description: MPP and AppMag)."""
    rng = np.random.default_rng(0)
    w, h = size
    base = np.clip(np.asarray(colour, np.int16) + rng.integers(-6, 7, (h, w, 3)), 0, 255).astype(np.uint8)
    path = tmp_path / name
    with tifffile.TiffWriter(path) as tif:
        tif.write(base, tile=(256, 256), photometric="rgb",
                  description=f"Aperio Image Library v12\r\n{w}x{h} (256x256) RAW|AppMag = 20|MPP = {mpp}")
        tif.write(np.ascontiguousarray(base[::4, ::4]), tile=(256, 256), photometric="rgb",
                  description=f"Aperio Image Library v12\r\n{w}x{h} -> {w // 4}x{h // 4}")
    return path


def test_background_and_tissue_slides_give_empty_and_full_masks(tmp_path):
    with wsitool.open_slide(_synthetic(tmp_path, "glass.svs", (242, 241, 244))) as slide:
        mask = detect_tissue(slide)
        assert mask.mask.size > 0 and not mask.mask.any()
        assert len(plan_patches(slide, mpp=0.5, size=128)) == 0
    with wsitool.open_slide(_synthetic(tmp_path, "tissue.svs", (205, 110, 160))) as slide:
        mask = detect_tissue(slide)
        assert mask.mask.all()
        plan = plan_patches(slide, mpp=0.5, size=128)
        assert len(plan) == (2048 // 128) * (1536 // 128) and np.all(plan.tissue == 1)


def test_tissue_on_a_real_slide_keeps_the_pinned_share_of_the_grid():
    with wsitool.open_slide(shared_sample("aperio-cmu1-small-region-jpeg.svs")) as slide:
        grid = plan_patches(slide, mpp=0.5, size=112, mask=None)
        kept = plan_patches(slide, mpp=0.5, size=112)
        share = len(kept) / len(grid)
        # measured 2026-12-01: the tissue strip covers about a third of this field
        assert 0.22 <= share <= 0.42, share
        assert np.all(kept.tissue >= 0.5)
        preview = render_preview(slide, kept)
        assert preview.ndim == 3 and preview.shape[2] == 3
        features = kept.mask.geojson()["features"]
        assert features and all(f["geometry"]["type"] == "Polygon" for f in features)


def test_plan_files_round_trip_and_clam_layout(tmp_path):
    with wsitool.open_slide(SAMPLE) as slide:
        plan = plan_patches(slide, mpp=0.75, size=64, mask=None)   # resampled from level 0 (0.5)
    assert plan.resampled and plan.read_size == pytest.approx(96.0)
    for ext in ("parquet", "h5"):
        path = tmp_path / f"plan.{ext}"
        plan.save(path)
        back = read_plan(path)
        np.testing.assert_array_equal(back.locations, plan.locations)
        assert (back.level, back.size, back.read_size, back.effective_mpp) == \
            (plan.level, plan.size, plan.read_size, plan.effective_mpp)
        assert back.slide == plan.slide and back.params == json.loads(json.dumps(plan.params))
        with pytest.raises(OutputExistsError):
            plan.save(path)
    with h5py.File(tmp_path / "plan.h5", "r") as f:   # what CLAM's feature extraction reads
        coords = f["coords"]
        assert coords.dtype == np.int64 and coords.shape == (len(plan), 2)
        assert coords.attrs["patch_level"] == 0 and coords.attrs["patch_size"] == 96
    other = plan_patches(wsitool.open_slide(REPO_SAMPLES / "sample-aperio-j2k.svs"), mpp=1.0, size=64,
                         mask=None, mpp_override=0.5)
    write_plans([plan, other], tmp_path / "both.parquet")
    both = read_plans(tmp_path / "both.parquet")
    assert [len(p) for p in both] == [len(plan), len(other)] and both[1].slide.path.endswith("j2k.svs")
    with pytest.raises(PlanFileError, match="one slide"):
        write_plans([plan, other], tmp_path / "both.h5")
    (tmp_path / "x.txt").write_text("no")
    with pytest.raises(PlanFileError):
        read_plans(tmp_path / "x.txt")


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_extracted_shards_hold_exactly_the_plan(tmp_path, fmt):
    from PIL import Image

    with wsitool.open_slide(SAMPLE) as slide:
        plan = plan_patches(slide, mpp=0.5, size=128, mask=None)
        want = np.concatenate(list(plan.read_patches(slide)))
        shards = extract_shards(slide, plan, tmp_path, fmt=fmt, shard_size=40)
    assert len(shards) == math.ceil(len(plan) / 40)
    seen = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            names = tar.getnames()
            for name in names[::2]:
                key, _ext = name.split(".", 1)
                meta = json.loads(tar.extractfile(f"{key}.json").read())
                img = np.asarray(Image.open(io.BytesIO(tar.extractfile(name).read())))
                seen.append((meta["x"], meta["y"], img))
    assert [(x, y) for x, y, _ in seen] == list(zip(plan.x.tolist(), plan.y.tolist(), strict=True))
    for (_, _, img), ref in zip(seen, want, strict=True):
        if fmt == "png":
            np.testing.assert_array_equal(img, ref)
        else:
            mse = np.mean((img.astype(float) - ref) ** 2)   # within JPEG quality 90's error
            assert 10 * np.log10(255 ** 2 / mse) > 30   # 34.8 dB measured on this noisy sample
    again = tmp_path / "again"
    again.mkdir()
    with wsitool.open_slide(SAMPLE) as slide:
        second = extract_shards(slide, plan, again, fmt=fmt, shard_size=40)
    assert [p.read_bytes() for p in second] == [p.read_bytes() for p in shards]   # reproducible


def test_planning_never_reads_level_0_of_a_pyramid(monkeypatch):
    levels = []
    original = wsitool.Slide.read_region

    def spy(self, location, level, size, **kwargs):
        levels.append(level)
        return original(self, location, level, size, **kwargs)

    monkeypatch.setattr(wsitool.Slide, "read_region", spy)
    with wsitool.open_slide(SAMPLE) as slide:
        plan_patches(slide, mpp=0.5, size=64)
    assert levels and min(levels) == 2   # 8 um/px from 0.5: downsample 16; the coarsest level is 4


@pytest.mark.parametrize("form", ["slash", "existing"])
def test_a_preview_folder_given_with_a_slash_or_existing_is_a_folder(tmp_path, form):
    """``--preview previews/`` wrote a PNG file named ``previews``: a trailing slash, or a folder that
    exists, means a folder (made where missing) holding ``SLIDE-preview.png``."""
    folder = tmp_path / "previews"
    if form == "existing":
        folder.mkdir()
    arg = str(folder) + ("/" if form == "slash" else "")
    code = main_code(["patches", "plan", str(SAMPLE), "--mpp", "0.5", "--size", "128", "--no-mask",
                      "-o", str(tmp_path / "plan.parquet"), "--preview", arg, "--quiet"])
    assert code == 0 and folder.is_dir()
    assert (folder / "sample-aperio-jpeg-preview.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_files_of_slides_named_alike_but_for_an_inner_dot_do_not_collide(tmp_path):
    """``scan.1.svs`` and ``scan.2.svs`` planned into a folder: one plan file and one preview each
    (the name was cut at the first dot, so the second slide failed on "already exists")."""
    slides = [tmp_path / "scan.1.svs", tmp_path / "scan.2.svs"]
    for slide in slides:
        slide.write_bytes(SAMPLE.read_bytes())
    out, previews = tmp_path / "plans", tmp_path / "previews"
    out.mkdir()
    code = main_code(["patches", "plan", *map(str, slides), "--mpp", "0.5", "--size", "128", "--no-mask",
                      "-o", str(out), "--preview", str(previews) + "/", "--quiet"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["scan.1.parquet", "scan.2.parquet"]
    assert sorted(p.name for p in previews.iterdir()) == ["scan.1-preview.png", "scan.2-preview.png"]
    assert [read_plan(out / f"scan.{k}.parquet").slide.path for k in (1, 2)] == [str(s) for s in slides]


def test_the_patches_commands_end_to_end(tmp_path, capsys):
    out = tmp_path / "plan.parquet"
    code = main_code(["patches", "plan", str(SAMPLE), "--mpp", "0.5", "--size", "128", "--no-mask",
                      "-o", str(out), "--preview", str(tmp_path / "p.png"), "--quiet"])
    assert code == 0 and out.exists() and (tmp_path / "p.png").exists()
    plan = read_plan(out)
    assert len(plan) == (1536 // 128) * (1152 // 128)
    assert main_code(["patches", "extract", str(out), "-o", str(tmp_path), "--format", "png", "--quiet"]) == 0
    with tarfile.open(tmp_path / "sample-aperio-jpeg-000000.tar") as tar:
        assert len(tar.getnames()) == 2 * len(plan)
    # an existing output, a missing slide among several, bad options
    assert main_code(["patches", "plan", str(SAMPLE), "--mpp", "0.5", "--no-mask", "-o", str(out)]) == 9
    both = tmp_path / "both.parquet"
    code = main_code(["patches", "plan", str(SAMPLE), str(tmp_path / "missing.svs"), "--mpp", "0.5",
                      "--no-mask", "-o", str(both), "--quiet"])
    err = capsys.readouterr().err
    assert code == 9 and "missing.svs" in err and len(read_plans(both)) == 1
    assert main_code(["patches", "plan", str(SAMPLE), "--mpp", "0.5", "--magnification", "20",
                      "-o", str(tmp_path / "x.parquet")]) == 2
    assert main_code(["patches", "plan", str(SAMPLE), str(SAMPLE), "--mpp", "0.5", "--no-mask",
                      "-o", str(tmp_path / "x.h5")]) == 2
    j2k = shared_sample("aperio-tcga-cr-7395-jp2k-33005-2level.svs")
    assert main_code(["patches", "plan", str(j2k), "--mpp", "0.5", "-o", str(tmp_path / "y.parquet")]) == 5
    assert "--mpp-override" in capsys.readouterr().err


def main_code(argv) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code
