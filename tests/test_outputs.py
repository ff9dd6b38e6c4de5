"""One rule for every output (issue 14 items 1, 2, 3, 5, 9, 12), through the CLI and the API.

* item 1: an output that is the source (same inode, also through a link) is
  refused, exit 2, with or without --overwrite; an existing output needs
  --overwrite (exit 9); --regions finds conflicts before writing anything.
* item 2: a symlink planted at any temporary name of any writer is never
  written through (and the final name never ends up a link).
* item 3: names are escaped on the terminal and restricted as file names.
* item 5: batch resume trusts the manifest only; stale partials are removed.
* item 12: a non-UTF-8 CSV is a one-line error with its line number.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import wsitool
from wsitool import distributed as D
from wsitool.cli import app
from wsitool.distributed.regions_csv import check_name
from wsitool.ground import partials

from helpers import REPO_SAMPLES

SAMPLE = REPO_SAMPLES / "sample-aperio-jpeg.svs"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _slide_copy(tmp_path: Path, name: str = "s.tiff") -> Path:
    dst = tmp_path / name
    shutil.copyfile(SAMPLE, dst)
    dst.chmod(0o444)
    return dst


def _one_line_error(res) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("wsitool: error:")]
    assert len(errs) == 1, res.output
    assert "Traceback" not in res.output
    return errs[0]


# --------------------------------------------------------------------------- item 1


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_read_region_never_writes_over_its_source(tmp_path, how, overwrite):
    src = _slide_copy(tmp_path)
    before = src.read_bytes()
    out = {"same": src, "symlink": tmp_path / "link.tiff", "hardlink": tmp_path / "hard.tiff"}[how]
    if how == "symlink":
        out.symlink_to(src)
    elif how == "hardlink":
        os.link(src, out)
    res = run("read-region", src, "--size", 64, 64, "-o", out, *(["--overwrite"] if overwrite else []))
    assert res.exit_code == 2, res.output
    assert "output is the source" in _one_line_error(res)
    assert src.read_bytes() == before


def test_read_region_existing_output_needs_overwrite(tmp_path):
    src = _slide_copy(tmp_path)
    out = tmp_path / "a.png"
    out.write_bytes(b"keep")
    res = run("read-region", src, "--size", 8, 8, "-o", out)
    assert res.exit_code == 9, res.output
    assert f"{out}: already exists" in _one_line_error(res) and "--overwrite" in res.output
    assert out.read_bytes() == b"keep"
    res = run("read-region", src, "--size", 8, 8, "-o", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_regions_row_named_like_the_slide_is_refused_before_any_write(tmp_path):
    src = _slide_copy(tmp_path, "slide.tiff")
    before = src.read_bytes()
    csv = tmp_path / "r.csv"
    csv.write_text("x,y,level,width,height,name\n0,0,0,8,8,first\n0,0,0,8,8,slide\n")
    for extra in ([], ["--overwrite"]):
        res = run("read-region", src, "--regions", csv, "--output-dir", tmp_path, "--format", "tiff",
                  "--quiet", *extra)
        assert res.exit_code == 2, res.output
        assert "output is the source" in _one_line_error(res)
        assert src.read_bytes() == before
        assert not (tmp_path / "first.tiff").exists()  # nothing written at all


def test_regions_conflict_refuses_the_batch_naming_the_first(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "b.png").write_bytes(b"b")
    (out / "c.png").write_bytes(b"c")
    csv = tmp_path / "r.csv"
    csv.write_text("x,y,level,width,height,name\n0,0,0,8,8,a\n0,0,0,8,8,b\n0,0,0,8,8,c\n")
    res = run("read-region", SAMPLE, "--regions", csv, "--output-dir", out, "--quiet")
    assert res.exit_code == 9, res.output
    assert f"{out / 'b.png'}: already exists" in _one_line_error(res)
    assert sorted(p.name for p in out.iterdir()) == ["b.png", "c.png"]
    res = run("read-region", SAMPLE, "--regions", csv, "--output-dir", out, "--quiet", "--overwrite")
    assert res.exit_code == 0, res.output
    assert (out / "b.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("fmt", ["npz", "zarr"])
def test_pack_existing_store_needs_overwrite(tmp_path, fmt):
    pytest.importorskip("zarr") if fmt == "zarr" else None
    csv = tmp_path / "r.csv"
    csv.write_text("x,y,level,width,height,name\n0,0,0,8,8,a\n")
    out = tmp_path / "out"
    args = ("read-region", SAMPLE, "--regions", csv, "--output-dir", out, "--pack", "--format", fmt,
            "--quiet")
    assert run(*args).exit_code == 0
    res = run(*args)
    assert res.exit_code == 9, res.output
    assert "already exists" in _one_line_error(res)
    assert run(*args, "--overwrite").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == [f"sample-aperio-jpeg-regions.{fmt}"]


def test_export_pyramid_through_a_link_to_the_source_exit_2(tmp_path):
    src = _slide_copy(tmp_path, "s.svs")
    before = src.read_bytes()
    link = tmp_path / "out.svs"
    link.symlink_to(src)
    res = run("export-pyramid", src, link, "--overwrite", "--quiet", "--region", 0, 0, 64, 64)
    assert res.exit_code == 2, res.output
    assert "output is the source" in _one_line_error(res)
    assert src.read_bytes() == before and link.is_symlink()


# --------------------------------------------------------------------------- item 2


def _plant(final: Path, victim: Path, monkeypatch) -> list[Path]:
    """Plant links to ``victim`` at the next temporary names of ``final`` (the tokens
    are forced) and at the old pid-only name; returns the links."""
    tokens = iter(f"{k:016x}" for k in range(10**6))
    monkeypatch.setattr(partials.secrets, "token_hex", lambda n: next(tokens))
    pid = os.getpid()
    names = [f".{final.name}.partial-{partials._host()}-{pid}-{k:016x}" for k in range(3)]
    names.append(f".{final.name}.partial-{pid}")  # the old npz / stress name
    links = []
    for n in names:
        link = final.with_name(n)
        link.symlink_to(victim)
        links.append(link)
    return links


def _writers():
    def read_region(tmp, out):
        final = out / "r.png"
        return final, lambda: run("read-region", SAMPLE, "-s", 8, 8, "-o", final)

    def regions(tmp, out):
        csv = tmp / "r.csv"
        csv.write_text("x,y,level,width,height,name\n0,0,0,8,8,a\n")
        return out / "a.npy", lambda: run("read-region", SAMPLE, "--regions", csv, "--output-dir",
                                          out, "--format", "npy", "--quiet")

    def pack(fmt):
        def make(tmp, out):
            if fmt == "zarr":
                pytest.importorskip("zarr")
            csv = tmp / "r.csv"
            csv.write_text("x,y,level,width,height,name\n0,0,0,8,8,a\n")
            return out / f"sample-aperio-jpeg-regions.{fmt}", lambda: run(
                "read-region", SAMPLE, "--regions", csv, "--output-dir", out, "--pack", "--format",
                fmt, "--quiet")
        return make

    def export(name):
        def make(tmp, out):
            final = out / name
            return final, lambda: run("export-pyramid", SAMPLE, final, "--quiet", "--region",
                                      0, 0, 64, 64, "--compression", "deflate")
        return make

    def manifest(tmp, out):
        return out / D.MANIFEST_NAME, lambda: run(
            "export-pyramid", SAMPLE, out, "--scheduler", "sequential", "--quiet", "--region",
            0, 0, 64, 64, "--compression", "deflate")

    def stress_report(tmp, out):
        from wsitool.stress import report as stress_report

        final = out / "report.json"
        report = SimpleNamespace(to_dict=dict, data={})  # what write_report reads of a report
        return final, lambda: stress_report.write_report(report, final)

    return {"read-region": read_region, "regions": regions, "pack-npz": pack("npz"),
            "pack-zarr": pack("zarr"), "export-tiff": export("e.svs"),
            "export-ome": export("e.ome.tiff"), "export-dzi": export("e.dzi"),
            "batch-manifest": manifest, "stress-report": stress_report}


@pytest.mark.parametrize("writer", sorted(_writers()))
def test_planted_link_at_temporary_name_is_not_written_through(tmp_path, monkeypatch, writer):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"VICTIM")
    final, go = _writers()[writer](tmp_path, out)
    links = _plant(final, victim, monkeypatch)
    res = go()
    if hasattr(res, "exit_code"):
        assert res.exit_code == 0, res.output
    assert victim.read_bytes() == b"VICTIM"
    assert final.exists() and not final.is_symlink()
    assert all(link.is_symlink() for link in links)
    left = [p.name for p in out.iterdir() if ".partial-" in p.name and p not in links]
    assert not left


# --------------------------------------------------------------------------- item 3


def test_terminal_escapes_in_csv_names_are_refused_with_the_line(tmp_path):
    out = tmp_path / "out"
    csv = tmp_path / "r.csv"
    csv.write_bytes(b"x,y,level,width,height,name\n0,0,0,8,8,ok\n"
                    b"0,0,0,8,8,\"\x1b]0;pwned\x07\x1b[2K\"\n")
    res = run("read-region", SAMPLE, "--regions", csv, "--output-dir", out, "--quiet")
    assert res.exit_code == 5, res.output
    line = _one_line_error(res)
    assert "line 3" in line and "invalid region name" in line
    assert "\x1b" not in res.output and "\x07" not in res.output and "\\x1b" in res.output
    assert not out.exists() or not list(out.iterdir())


def test_quoted_newline_in_a_name_makes_no_file(tmp_path):
    out = tmp_path / "out"
    csv = tmp_path / "r.csv"
    csv.write_text('x,y,level,width,height,name\n0,0,0,8,8,"line1\nline2"\n')
    res = run("read-region", SAMPLE, "--regions", csv, "--output-dir", out, "--quiet")
    assert res.exit_code == 5, res.output
    assert "line 3" in _one_line_error(res) and "\\n" in res.output
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize("name,ok", [
    ("tumor region 1", True), ("a-b_c.d+e=f,g@h(i)", True), ("Gewebe_äöü", True), ("_x", True),
    ("../x", False), ("a/b", False), (".hidden", False), ("-rf", False), ("x ", False), ("x.", False),
    ("a\x00b", False), ("a\\b", False), ("a\u202eb", False), ("a:b", False), ("a*b", False),
    ("x" * 151, False), ("", False),
])
def test_region_name_safe_set(name, ok):
    if ok:
        assert check_name(name, "here") == name
    else:
        with pytest.raises(wsitool.InvalidRegionError, match="here: invalid region name"):
            check_name(name, "here")


def test_failed_region_line_escapes_the_slide_path(tmp_path):
    """Names printed on the terminal go through errors.printable, as error lines do."""
    link = tmp_path / "evil\x1b[2K.svs"
    link.symlink_to(SAMPLE)
    res = run("read-region", link, "-s", 8, 8, "-L", 99, "-o", tmp_path / "x.png")
    assert res.exit_code != 0
    assert "\x1b" not in res.output and "evil\\x1b[2K.svs" in res.output


# --------------------------------------------------------------------------- item 12


def test_non_utf8_csv_is_one_line_with_the_line_number(tmp_path):
    csv = tmp_path / "r.csv"
    csv.write_bytes(b"x,y,level,width,height,name\n0,0,0,8,8,a\n0,0,0,8,8,caf\xe9\n")
    res = run("read-region", SAMPLE, "--regions", csv, "--output-dir", tmp_path / "out", "--quiet")
    assert res.exit_code == 5, res.output
    line = _one_line_error(res)
    assert f"{csv}: line 3" in line and "UTF-8" in line


def test_csv_with_nul_byte_is_one_line(tmp_path):
    csv = tmp_path / "r.csv"
    csv.write_bytes(b"x,y,level,width,height\n0,0\x00,0,8,8\n")
    res = run("read-region", SAMPLE, "--regions", csv, "--output-dir", tmp_path / "out", "--quiet")
    assert res.exit_code in (2, 5), res.output
    assert "line 2" in _one_line_error(res)


def test_from_list_with_non_utf8_path_is_not_a_traceback(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"/nonexistent/caf\xe9.svs\n")
    res = run("export-pyramid", tmp_path / "out", "--from-list", listing, "--scheduler", "sequential",
              "--quiet")
    assert res.exit_code == 9, res.output
    assert "Traceback" not in res.output and "caf\\udce9.svs" in res.output


# --------------------------------------------------------------------------- item 5


def _batch(out: Path, *extra):
    return run("export-pyramid", SAMPLE, out, "--scheduler", "sequential", "--quiet", "--region",
               0, 0, 64, 64, "--compression", "deflate", *extra)


def test_resume_trusts_the_manifest_not_a_file_with_the_final_name(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    final = out / "sample-aperio-jpeg.tiff"
    final.write_bytes(b"")  # `: > out/slide.tiff`, no manifest
    res = _batch(out)
    assert res.exit_code == 9, res.output
    assert "0 skipped" in res.output and "no earlier batch recorded it" in res.output
    assert final.stat().st_size == 0
    res = _batch(out, "--overwrite")
    assert res.exit_code == 0 and "1 exported" in res.output
    size = final.stat().st_size
    res = _batch(out)
    assert res.exit_code == 0 and "1 skipped" in res.output, res.output
    final.write_bytes(b"")  # a recorded output truncated afterwards: redone, not skipped
    res = _batch(out)
    assert res.exit_code == 0 and "1 exported" in res.output, res.output
    assert final.stat().st_size == size


def test_resume_redoes_changed_options_and_changed_sources(tmp_path):
    src = tmp_path / "in" / "s.svs"
    src.parent.mkdir()
    shutil.copyfile(SAMPLE, src)
    out = tmp_path / "out"
    args = ("export-pyramid", src, out, "--scheduler", "sequential", "--quiet", "--region", 0, 0, 64,
            64, "--compression", "deflate")
    assert "1 exported" in run(*args).output
    assert "1 skipped" in run(*args).output
    assert "1 exported" in run(*args, "--tile-size", 32).output  # other options
    assert "1 skipped" in run(*args, "--tile-size", 32).output
    os.utime(src, ns=(1, 1))  # the source changed (mtime)
    assert "1 exported" in run(*args, "--tile-size", 32).output
    import json

    data = json.loads((out / D.MANIFEST_NAME).read_text())
    entry = data["outputs"]["s.tiff"]
    assert entry["source"] == str(src.resolve()) and entry["source_size"] == src.stat().st_size
    assert entry["source_mtime_ns"] == 1 and entry["output_size"] == (out / "s.tiff").stat().st_size
    assert entry["options"]["tile_size"] == 32 and entry["options"]["compression"] == "deflate"


def test_next_run_removes_stale_partials_of_dead_processes_only(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host = partials._host()
    out = tmp_path / "out"
    out.mkdir()
    stale = out / f".sample-aperio-jpeg.tiff.partial-{host}-{proc.pid}-{'a' * 16}"
    stale.write_bytes(b"x" * 1000)
    stale_dzi = out / f".x.dzi.partial-{host}-{proc.pid}-{'b' * 16}"
    (stale_dzi / "x_files" / "0").mkdir(parents=True)
    other = out / f".y.tiff.partial-otherhost-{proc.pid}-{'c' * 16}"
    other.write_bytes(b"x")
    live = out / f".y.tiff.partial-{host}-{os.getpid()}-{'d' * 16}"
    live.write_bytes(b"x")
    assert _batch(out).exit_code == 0
    assert not stale.exists() and not stale_dzi.exists()
    assert other.exists() and live.exists()


def test_stress_report_follows_the_output_rule(tmp_path):
    """stress --report / --plot: an existing file needs --overwrite (exit 9 before the run),
    the slide itself is never a report (exit 2)."""
    slide = tmp_path / "s.svs"
    slide.write_bytes(SAMPLE.read_bytes())
    report = tmp_path / "r.json"
    report.write_text("keep me")
    res = run("stress", slide, "--workers", "1", "--iterations", "5", "--report", report)
    assert res.exit_code == 9 and "already exists" in res.output and report.read_text() == "keep me"
    res = run("stress", slide, "--workers", "1", "--iterations", "5", "--report", slide)
    assert res.exit_code == 2 and "output is the source slide" in res.output
    assert slide.read_bytes() == SAMPLE.read_bytes()
    res = run("stress", slide, "--workers", "1", "--iterations", "20", "--report", report, "--overwrite")
    assert res.exit_code in (0, 15), res.output
    assert report.read_text().startswith("{")
