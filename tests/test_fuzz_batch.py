"""scripts/fuzz.py --cli-batch: the CLI's batch inputs (CSV bytes, names, list files).

A bounded run in CI (no faults), plus proof that the checker sees each fault
kind it claims to (a raw control character printed, a write outside the
output folder).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import fuzz as fuzz_script
import fuzzlib
from helpers import REPO

SLIDE = REPO / "samples" / "sample-aperio-jpeg.svs"


@pytest.fixture(scope="module")
def fuzz():
    """scripts/fuzz.py, the harness (check_batch_case); the mutators are fuzzlib's."""
    return fuzz_script


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "root" / "work"
    work.mkdir(parents=True)
    return work


def test_bounded_cli_batch_fuzz_finds_no_fault(fuzz, tmp_path):
    rng = random.Random(14)
    work = _work(tmp_path)
    seen = set()
    for _ in range(150):
        case = fuzzlib.make_batch_case(rng)
        res = fuzz.check_batch_case(case, work, SLIDE)
        assert res["status"] not in fuzz.BATCH_FAULTS, (case, res)
        seen.add(res["status"])
    assert seen == {"ok", "documented"}


def _case(kind: str, data: bytes, **opts) -> dict:
    base = {"overwrite": False, "twice": False, "format": "png"}
    base.update(opts)
    return {"kind": kind, "data": data.hex(), "opts": base}


def test_known_bad_inputs_are_documented_errors(fuzz, tmp_path):
    work = _work(tmp_path)
    for data in (b"x,y,level,width,height,name\n0,0,0,8,8,caf\xe9\n",
                 b"x,y,level,width,height,name\n0,0,0,8,8,\"\x1b]0;t\x07\"\n",
                 b'x,y,level,width,height,name\n0,0,0,8,8,"l1\nl2"\n',
                 b"x,y,level,width,height,name\n0,0,0,8,8,../../escape\n",
                 b"x,y,level,width,height\n0,0\x00,0,8,8\n"):
        res = fuzz.check_batch_case(_case("regions", data), work, SLIDE)
        assert res["status"] == "documented", (data, res)
    res = fuzz.check_batch_case(_case("from-list", b"a\x00b.svs\nslide.svs\n"), work, SLIDE)
    assert res["status"] == "documented", res


def test_checker_sees_raw_control_characters(fuzz, tmp_path, monkeypatch):
    import wsitool.errors
    from wsitool.cli import console
    from wsitool.cli import export as cli_export
    from wsitool.cli import read as cli_read

    for module in (console, cli_export, cli_read):  # as before the fix: printed raw
        monkeypatch.setattr(module, "shown", lambda text: str(text))
    monkeypatch.setattr(wsitool.errors, "printable", lambda text: str(text))
    work = _work(tmp_path)
    res = fuzz.check_batch_case(_case("from-list", b"evil\x1b]0;pwned\x07.svs\n"), work, SLIDE)
    assert res["status"] == "control", res
    monkeypatch.undo()
    res = fuzz.check_batch_case(_case("from-list", b"evil\x1b]0;pwned\x07.svs\n"), work, SLIDE)
    assert res["status"] == "documented", res


def test_checker_sees_a_write_outside_the_output_folder(fuzz, tmp_path, monkeypatch):
    from wsitool.distributed import regions

    real = regions.write_image

    def escaping(path, array, **kw):
        real(Path(path).parent.parent.parent / "escaped.png", array, overwrite=True)
        return real(path, array, **kw)

    monkeypatch.setattr(regions, "write_image", escaping)
    work = _work(tmp_path)
    res = fuzz.check_batch_case(_case("regions", b"x,y,level,width,height,name\n0,0,0,8,8,a\n"), work, SLIDE)
    assert res["status"] == "escape", res
