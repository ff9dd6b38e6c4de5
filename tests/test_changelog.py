"""The shape of ``CHANGELOG.md`` (Keep a Changelog 1.1.0): one line per change, sorted by kind.

- The version headings come in order: ``## [Unreleased]`` first, then ``## [X.Y.Z] - YYYY-MM-DD``
  with versions falling and dates not rising.
- Under a version only Keep a Changelog's kinds, in its order, each at most once and none empty:
  ``### Added``, ``### Changed``, ``### Deprecated``, ``### Removed``, ``### Fixed``, ``### Security``.
- Every change is one ``- `` bullet on one line (no wrapped or nested lines), ending with a full stop,
  without a kind prefix such as ``Fixed:`` (the heading says it).
- Length budget: no bullet over 300 characters, and the bullets of the file average at most 180.
  A change told for a user (what they can do now, what was wrong and is right) fits one or two
  sentences: two sentences of about 150 characters. The condensed changelog averaged about 150
  (longest about 260); before, bullets averaged 369 characters and the longest ran to 1,153 with
  benchmark stories, which the 300 cap turns away while leaving room for a change that needs an
  option, a default and an exit code named.
- No ``issue N`` references and no before/after figures (``480 -> 1,402``): figures belong on the
  dated benchmark pages in ``docs/benchmarks/``.

Names written in the changelog are not checked against the code: the changelog is history.
"""

from __future__ import annotations

import datetime
import re

from helpers import REPO

CHANGELOG = REPO / "CHANGELOG.md"
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
MAX_BULLET = 300
MAX_MEAN_BULLET = 180

VERSION = re.compile(r"## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})")
ISSUE = re.compile(r"\bissues?\s*#?\d+|\(issue", re.IGNORECASE)
KIND_PREFIX = re.compile(r"- (?:\*\*)?(?:Added|Changed|Deprecated|Removed|Fixed|Security)\b\s*:", re.IGNORECASE)
BEFORE_AFTER = re.compile(r"\d\S*\s*(?:->|→)\s*[+\-]?\d")


def _lines() -> list[str]:
    return CHANGELOG.read_text(encoding="utf-8").splitlines()


def _versions() -> list[tuple[str, list[tuple[int, str]]]]:
    """Each ``## `` heading with its numbered lines, up to the next ``## `` heading."""
    out: list[tuple[str, list[tuple[int, str]]]] = []
    for number, line in enumerate(_lines(), 1):
        if line.startswith("## "):
            out.append((line, []))
        elif out:
            out[-1][1].append((number, line))
    return out


def _bullets() -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(_lines(), 1) if line.startswith("- ")]


def test_version_headings_in_order_with_dates():
    headings = [heading for heading, _ in _versions()]
    assert headings[0] == "## [Unreleased]", headings[0]
    released = []
    for heading in headings[1:]:
        match = VERSION.fullmatch(heading)
        assert match, f"not '## [X.Y.Z] - YYYY-MM-DD': {heading!r}"
        date = datetime.date.fromisoformat(match[4])
        released.append((tuple(int(part) for part in match.groups()[:3]), date))
    assert released, "no released version"
    versions = [version for version, _ in released]
    dates = [date for _, date in released]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), versions
    assert dates == sorted(dates, reverse=True), dates


def test_only_keep_a_changelog_kinds_in_order():
    for heading, body in _versions():
        kinds: list[str] = []
        bullets_under: dict[str, int] = {}
        for number, line in body:
            if line.startswith("#"):
                assert line.startswith("### "), f"line {number}: only ### headings under a version: {line!r}"
                kind = line[4:]
                assert kind in KINDS, f"line {number}: {kind!r} is not one of {KINDS} ({heading})"
                assert kind not in kinds, f"line {number}: a second '### {kind}' under {heading}"
                kinds.append(kind)
                bullets_under[kind] = 0
            elif line.startswith("- "):
                assert kinds, f"line {number}: a bullet before the first ### heading of {heading}"
                bullets_under[kinds[-1]] += 1
        assert kinds, f"{heading} has no ### section"
        assert kinds == sorted(kinds, key=KINDS.index), f"{heading}: {kinds}, not in the order {KINDS}"
        assert all(bullets_under.values()), f"{heading}: an empty section in {bullets_under}"


def test_every_change_is_one_line():
    inside_section = False
    for number, line in enumerate(_lines(), 1):
        if line.startswith("## "):
            inside_section = False
        elif line.startswith("### "):
            inside_section = True
        elif inside_section and line.strip():
            assert line.startswith("- "), f"line {number}: a wrapped or nested line, not a bullet: {line[:60]!r}"
            assert line.rstrip().endswith("."), f"line {number}: a bullet ends with a full stop: {line[-40:]!r}"
            assert not KIND_PREFIX.match(line), f"line {number}: the ### heading gives the kind: {line[:40]!r}"


def test_bullets_within_the_length_budget():
    bullets = _bullets()
    assert len(bullets) > 20, len(bullets)
    lengths = [len(line) - 2 for _, line in bullets]
    too_long = [(n, len(line) - 2) for n, line in bullets if len(line) - 2 > MAX_BULLET]
    assert not too_long, f"bullets over {MAX_BULLET} characters (line, length): {too_long}"
    mean = sum(lengths) / len(lengths)
    assert mean <= MAX_MEAN_BULLET, f"bullets average {mean:.0f} characters, budget {MAX_MEAN_BULLET}"


def test_no_issue_numbers_or_before_after_figures():
    for number, line in enumerate(_lines(), 1):
        issue = ISSUE.search(line)
        assert not issue, f"line {number}: an issue reference: {issue[0]!r}"
        found = BEFORE_AFTER.search(line)
        assert not found, f"line {number}: a before/after figure ({found[0]!r}): put it on a benchmark page"
