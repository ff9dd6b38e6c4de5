"""Fuzzing the readers: mutated real slides and bug inputs never give an undocumented outcome.

The fuzz body runs in a child process (``scripts/fuzz.py``'s :class:`Worker`),
so a native crash in a decoder is reported as a failure here instead of
killing pytest.  Allowed outcomes per input: it opens and reads, or wsitool
raises one of its documented :class:`wsitool.WsiError` subclasses.  Faults:
any other exception type, a signal / non-zero exit of the worker (crash), or
no answer within the timeout (hang).  A failing input is saved in a new
temporary folder whose path is in the failure message, with its recipe.

Bounded for CI: a fixed number of hypothesis examples with a derandomised
(fixed) seed, so the same inputs run every time.
"""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fuzz
import fuzzlib
from helpers import REPO, SHARED

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ_SCRIPT = REPO / "scripts" / "fuzz.py"
REGRESSIONS = json.loads((Path(__file__).parent / "fuzz_regressions.json").read_text())


# Seeds for the in-test fuzzing: small files keep one example well under 0.1 s.  Listed at
# import; their TIFF structure is read on first use (_seed_targets), not at import.
SEEDS = list(fuzzlib.seed_files(limit_bytes=1_000_000))


@functools.cache
def _seed_targets() -> dict:
    return {str(p): fuzzlib.seed_targets(p) for p in SEEDS}


@pytest.fixture(scope="module")
def worker():
    w = fuzz.Worker(timeout=30.0)
    yield w
    w.close()


@pytest.fixture(scope="module")
def python_worker():
    """A worker whose wsitool reads JPEG tiles on the Python path (WSITOOL_NATIVE=0)."""
    w = fuzz.Worker(timeout=30.0, env={"WSITOOL_NATIVE": "0"})
    yield w
    w.close()


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="wsitool-fuzz-test-") as d:
        yield Path(d)


def _assert_no_fault(worker, recipe: dict, scratch: Path, case_seed: int) -> dict:
    data = fuzzlib.apply_recipe(recipe)
    path = scratch / ("input" + Path(recipe["seed_file"]).suffix)
    path.write_bytes(data)
    res = worker.check(str(path), case_seed)
    if res["status"] in fuzz.FAULTS:
        keep = Path(tempfile.mkdtemp(prefix="wsitool-fuzz-fault-"))
        recipe = dict(recipe, case_seed=case_seed)
        saved = fuzz.save_fault(keep, 1, recipe, res, data)
        pytest.fail(
            f"fuzz fault ({res['status']}): {res.get('signature') or res.get('signal') or ''}\n"
            f"input saved as {saved} (recipe beside it; replay with "
            f"`python scripts/fuzz.py --replay {saved.with_suffix('.json')}`)\n"
            f"{res.get('traceback') or res.get('stderr_tail', '')}"
        )
    assert res["status"] in ("ok", "documented"), res
    return res


# ---------------------------------------------------------------------- harness self-tests


def test_worker_reports_crash_hang_and_exception(tmp_path):
    """The harness must see each fault kind, or the fuzz test below proves nothing."""
    target = tmp_path / "x.tif"
    target.write_bytes(b"II*\x00")
    w = fuzz.Worker(timeout=3.0)
    try:
        crash = w.check(str(target), 0, selftest="segv")
        assert crash["status"] == "crash" and crash["signal"] == "SIGSEGV", crash
        exc = w.check(str(target), 0, selftest="exception")  # worker restarted after the crash
        assert exc["status"] == "exception" and exc["type"] == "TypeError", exc
        hang = w.check(str(target), 0, selftest="hang")
        assert hang["status"] == "hang", hang
        ok = w.check(str(target), 0)  # and it recovers again
        assert ok["status"] == "documented" and ok["errors"], ok
    finally:
        w.close()


def test_recipes_rebuild_inputs_exactly(tmp_path):
    original = bytes(range(256)) * 4
    src = tmp_path / "seed.tif"
    src.write_bytes(original)
    recipe = {"seed_file": str(src), "patches": [[3, "ffff"], [1020, "0102030405"]], "truncate": 1022}
    data = fuzzlib.apply_recipe(recipe)
    assert len(data) == 1022
    assert data[3:5] == b"\xff\xff" and data[1020:1022] == b"\x01\x02"
    assert data[:3] == original[:3] and data[5:1020] == original[5:1020]


def test_mutations_hit_tiff_structure():
    """Targets come from tifffile: IFD entries, tile offsets/counts and tile bytes are found."""
    if not SEEDS:
        pytest.skip(f"no seed files under {SHARED}")
    t = next(t for t in _seed_targets().values() if t.offset_arrays and t.segments)
    assert t.entries and t.tag_values and t.count_arrays
    rng = random.Random(5)
    with open(t.path, "rb") as fh:
        data = fh.read()
    for kind in ("tile_offset", "tile_bytecount", "ifd_entry", "tag_value", "tile_bytes"):
        recipe = fuzzlib.make_recipe(t, rng, [kind])
        assert recipe["patches"], kind
        mutated = fuzzlib.apply_recipe(recipe, data)
        assert len(mutated) == len(data)
    offs = [o for o, _ in fuzzlib.make_recipe(t, rng, ["tile_offset"])["patches"]]
    lo = min(vo for vo, _, _ in t.offset_arrays)
    hi = max(vo + isz * n for vo, isz, n in t.offset_arrays)
    assert all(lo <= o < hi for o in offs)


# ---------------------------------------------------------------------- regressions


@pytest.mark.parametrize("path", ["default", "python"])
@pytest.mark.parametrize("case", REGRESSIONS, ids=[f"{i}-{c['found']}" for i, c in enumerate(REGRESSIONS)])
def test_fuzz_regression(case, path, worker, python_worker, scratch):
    """Inputs the fuzzer once turned into undocumented exceptions (rebuilt from their
    recipe), on the default read path (the compiled JPEG loop where it is built)
    and on the Python path."""
    worker = worker if path == "default" else python_worker
    seed_file = SHARED / case["seed"]
    if not seed_file.exists():
        pytest.skip(f"seed file {seed_file} is absent")
    recipe = {"seed_file": str(seed_file), "kinds": case["kinds"], "patches": case["patches"],
              "truncate": case["truncate"]}
    res = _assert_no_fault(worker, recipe, scratch, case["case_seed"])
    # The malformed part was reached (it raised before the fix), so wsitool must
    # now report it with a documented error.
    assert res["status"] == "documented", res


# ---------------------------------------------------------------------- property-based fuzzing


@pytest.mark.skipif(not SEEDS, reason=f"no seed files under {SHARED}")
@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    seed_index=st.integers(min_value=0, max_value=10_000),
    kinds=st.lists(st.sampled_from(fuzzlib.KINDS), min_size=1, max_size=3),
    rng_seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_fuzz_mutated_slides(seed_index, kinds, rng_seed, worker, scratch):
    t = _seed_targets()[str(SEEDS[seed_index % len(SEEDS)])]
    recipe = fuzzlib.make_recipe(t, random.Random(rng_seed), kinds)
    _assert_no_fault(worker, recipe, scratch, rng_seed)


def test_fuzz_script_cli(tmp_path):
    """``scripts/fuzz.py --minutes N`` runs and prints inputs tried and faults found."""
    seeds = [p for p in SEEDS if p.name.startswith(("B05", "B16"))][:2]
    if not seeds:
        pytest.skip("bug inputs absent")
    out = tmp_path / "faults"
    proc = subprocess.run(
        [sys.executable, str(FUZZ_SCRIPT), "--minutes", "0.05", "--seed", "3", "--out", str(out),
         "--json", "--files", *map(str, seeds)],
        capture_output=True, text=True, timeout=120,
    )
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["counts"]["tried"] > len(seeds)
    assert summary["faults"] == 0, summary["distinct_faults"]
    assert proc.returncode == 0


def test_the_vendor_fixtures_are_seeds_and_open_as_their_vendor(tmp_path):
    """Without ``--files`` the fuzzer also mutates the Philips, Ventana and Leica layouts
    (``scripts/make_vendor_samples.py``) and the Zeiss CZI ones (``scripts/make_czi_samples.py``),
    written beside its faults so their recipes replay."""
    import make_czi_samples
    import make_vendor_samples

    if not make_vendor_samples.SOURCE.is_file():
        pytest.skip(f"the shared CMU slide is absent: {make_vendor_samples.SOURCE}")
    import wsitool

    seeds = fuzz.vendor_seeds(tmp_path / "vendor-seeds")
    count = len(make_vendor_samples.MAKERS) + len(make_czi_samples.MAKERS)
    assert [p.parent for p in seeds] == [tmp_path / "vendor-seeds"] * count
    vendors = set()
    for path in seeds:
        with wsitool.open_slide(path) as slide:
            vendors.add(slide.vendor)
    assert vendors == {"philips", "ventana", "leica", "zeiss"}


def test_the_mirax_fixtures_are_seeds_mutated_inside_a_copy_of_their_slide(tmp_path):
    """A MIRAX slide is several files: its folder's members are the seeds, and a mutated member is
    checked inside a copy of its slide (the .mrxs opened; the member mutated before restored)."""
    import make_mirax_samples

    if not make_mirax_samples.SOURCE.is_file():
        pytest.skip(f"the shared CMU slide is absent: {make_mirax_samples.SOURCE}")
    import wsitool

    seeds = fuzz.mirax_seeds(tmp_path / "mirax-seeds")
    assert len(seeds) == len(make_mirax_samples.MAKERS) * len(fuzz.MIRAX_MEMBERS)
    ini, index = seeds[0], seeds[1]
    assert (ini.name, index.name) == ("Slidedat.ini", "Index.dat")
    work = tmp_path / "work"
    work.mkdir()
    path = fuzz.stage(work, str(index), b"01.02" + b"\0" * 40)
    assert path == work / (ini.parent.name + ".mrxs")
    with pytest.raises(wsitool.CorruptFileError, match="slide identifier"):
        wsitool.open_slide(path)
    path = fuzz.stage(work, str(ini), ini.read_bytes())
    with wsitool.open_slide(path) as slide:
        assert slide.vendor == "mirax" and slide.level_count == 4
