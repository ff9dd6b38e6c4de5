"""Regenerate tests/shared_samples.json: the real slides in ../shared/samples the tests use,
and the fault files of ../shared/bug-inputs with the ids of their checks.

Every file and folder in the samples folder (``SOURCES.md`` aside) is listed by name with its
SHA-256 and size in bytes.  A folder (a DICOM series) is listed with the SHA-256 of its sorted
``(relative path, file SHA-256)`` pairs and the sum of its files' sizes.  The tests parametrize
over these names, never over a directory listing, so a sample that is missing or different
shows as a skipped test naming it (tests/helpers.py: ``sample_problem``).

Usage::

    python scripts/shared_manifest.py [--samples DIR] [--out FILE] [--check]

``--samples`` defaults to ``$WSITOOL_SHARED/samples`` (``../shared/samples`` beside the
repository).  ``--check`` writes nothing and exits 1 when the folder no longer matches the file
(a line per difference), 0 when it does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "shared_samples.json"
#: Not samples: the notes on where each sample comes from.
SKIPPED_NAMES = frozenset({"SOURCES.md"})
_CHUNK = 1 << 20


def default_samples() -> Path:
    """The samples folder the tests read: ``$WSITOOL_SHARED/samples`` or ``../shared/samples``."""
    return Path(os.environ.get("WSITOOL_SHARED", REPO.parent / "shared")) / "samples"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of the bytes of the file ``path`` (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def digest(path: Path) -> dict[str, int | str]:
    """``{"sha256": hex, "size": bytes}`` of a sample file, or of a folder of files.

    A folder's hash is the SHA-256 of the lines ``relative/path<TAB>file-sha256`` of its files
    (every depth, sorted by relative POSIX path), its size the sum of their sizes.
    Raises ``FileNotFoundError`` when ``path`` does not exist.
    """
    if path.is_dir():
        files = sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*") if p.is_file())
        listing = "".join(f"{rel}\t{file_sha256(p)}\n" for rel, p in files)
        size = sum(p.stat().st_size for _, p in files)
        return {"sha256": hashlib.sha256(listing.encode()).hexdigest(), "size": size}
    return {"sha256": file_sha256(path), "size": path.stat().st_size}


def build(samples: Path) -> dict[str, dict[str, int | str]]:
    """The manifest of ``samples``: name -> digest, sorted by name, ``SOURCES.md`` left out."""
    return {p.name: digest(p) for p in sorted(samples.iterdir()) if p.name not in SKIPPED_NAMES}


def bug_inputs(folder: Path) -> dict:
    """The bug inputs the tests use (``../shared/bug-inputs``): every file with its digest, and the
    checks of its ``manifest.json`` as ``[file name, index, kind]`` (the test ids; the checks
    themselves are read from the folder when the tests run).  Empty where the folder is absent."""
    if not folder.is_dir():
        return {}
    files = {p.name: digest(p) for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = json.loads((folder / "manifest.json").read_text()) if "manifest.json" in files else {}
    checks = [[name, i, check["kind"]] for name, entry in manifest.items()
              for i, check in enumerate(entry["checks"])]
    return {"files": files, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=Path, default=default_samples())
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args(argv)
    if not args.samples.is_dir():
        print(f"{args.samples}: no such folder", file=sys.stderr)
        return 2
    manifest = build(args.samples)
    if args.check:
        listed = json.loads(args.out.read_text())["samples"]
        problems = [f"{n}: not in {args.out.name}" for n in manifest if n not in listed]
        problems += [f"{n}: missing from {args.samples}" for n in listed if n not in manifest]
        problems += [f"{n}: differs ({manifest[n]['sha256'][:12]} != {listed[n]['sha256'][:12]})"
                     for n in manifest if n in listed and manifest[n] != listed[n]]
        print("\n".join(problems) or f"{args.samples} matches {args.out}")
        return 1 if problems else 0
    doc = {
        "about": "Real slides the tests read from ../shared/samples: name -> SHA-256 and size in bytes "
                 "(a folder: SHA-256 of its sorted 'relpath<TAB>sha256' lines, total size). "
                 "Regenerate with: python scripts/shared_manifest.py. bug_inputs: the files of "
                 "../shared/bug-inputs and the checks of its manifest.json as [file, index, kind].",
        "samples": manifest,
        "bug_inputs": bug_inputs(args.samples.parent / "bug-inputs"),
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{args.out}: {len(manifest)} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
