"""The shared samples' manifest (tests/shared_samples.json) and how tests report a missing one.

The tests parametrize over the names the manifest lists, not over a directory listing, so
without ../shared (or with a sample missing or changed) the cases show as skipped, each naming
its sample, instead of vanishing from the run.
"""

from __future__ import annotations

import re

import pytest

import helpers
from helpers import REPO, SHARED_SAMPLES, region_hashes, sample_problem, script_module, shared_manifest, shared_sample

SMALL = "aperio-openslide-small-16px.svs"  # the smallest listed sample (2,651 bytes)


def test_the_manifest_matches_the_samples_folder():
    if not SHARED_SAMPLES.is_dir():
        pytest.skip(f"{helpers.NO_SHARED}: nothing to compare tests/shared_samples.json with")
    built = script_module("shared_manifest").build(SHARED_SAMPLES)
    assert built == shared_manifest(), "run scripts/shared_manifest.py"


def test_every_listed_sample_is_classified_by_the_region_hashes():
    doc = region_hashes()
    classified = [*doc["samples"], *doc["rejected"], *doc["unread"]]
    assert sorted(classified) == sorted(shared_manifest()), "run scripts/make_region_hashes.py"


def test_a_missing_or_changed_sample_is_a_skip_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers, "SHARED_SAMPLES", tmp_path / "samples")
    monkeypatch.setattr(helpers, "_problems", {})
    assert "is absent (needs " + SMALL in sample_problem(SMALL)

    (tmp_path / "samples").mkdir()
    monkeypatch.setattr(helpers, "_problems", {})
    assert sample_problem(SMALL) == f"shared sample {SMALL} is missing from {tmp_path / 'samples'}"

    size = shared_manifest()[SMALL]["size"]
    (tmp_path / "samples" / SMALL).write_bytes(b"\0" * size)  # the right size, other bytes
    monkeypatch.setattr(helpers, "_problems", {})
    why = sample_problem(SMALL)
    assert why.startswith(f"shared sample {SMALL} differs from tests/shared_samples.json")
    with pytest.raises(pytest.skip.Exception, match=re.escape(SMALL)):
        shared_sample(SMALL)


def test_a_sample_the_manifest_does_not_list_fails_the_test():
    with pytest.raises(pytest.fail.Exception, match=r"not listed in shared_samples\.json"):
        shared_sample("no-such-sample.svs")


def test_the_manifest_script_checks_a_folder(tmp_path, capsys):
    script = script_module("shared_manifest")
    folder = tmp_path / "samples"
    (folder / "series").mkdir(parents=True)
    (folder / "a.svs").write_bytes(b"one")
    (folder / "series" / "1.dcm").write_bytes(b"two")
    (folder / "SOURCES.md").write_text("notes")
    out = tmp_path / "manifest.json"
    assert script.main(["--samples", str(folder), "--out", str(out)]) == 0
    assert script.main(["--samples", str(folder), "--out", str(out), "--check"]) == 0
    (folder / "series" / "1.dcm").write_bytes(b"TWO")
    assert script.main(["--samples", str(folder), "--out", str(out), "--check"]) == 1
    assert "series: differs" in capsys.readouterr().out
    assert script.main(["--samples", str(tmp_path / "none"), "--out", str(out)]) == 2


def test_no_test_module_imports_conftest_as_a_module():
    """Helpers live in tests/helpers.py; ``from conftest import`` would tie modules to one conftest."""
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / "tests").rglob("*.py"))
                 if re.search(r"^\s*(from conftest import|import conftest)", p.read_text(), re.M)]
    assert offenders == []
