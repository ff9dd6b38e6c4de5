"""The JSON report of a stress run: its assembly, its schema, validation and writing (floor 6, consumers).

The report (:meth:`~wsitool.stress.results.StressReport.to_dict`, built by
:func:`build_report`) follows the JSON Schema shipped as
``wsitool/stress/report.schema.json`` (:func:`report_schema`, draft 2020-12,
``schema_version`` 2).  Reports and plots are written through
:func:`wsitool.ground.outputs.write_bytes`.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..ground import outputs as atomic
from ..storage import is_url
from ..version import __version__
from .faults import injected_fault
from .results import StressReport
from .verdict import EXIT_CODES

#: Most read errors and mismatches listed with their details in the report.
MAX_LISTED = 10
SCHEMA_FILE = "report.schema.json"


def report_schema() -> dict:
    """The JSON Schema (draft 2020-12) of the stress report, shipped with the package."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text("utf-8"))


def validate_report(data: Mapping) -> None:
    """Validate a report dict against :func:`report_schema` (needs ``jsonschema``).

    Raises ``jsonschema.ValidationError`` when it does not conform.
    """
    # optional (the test extra), and without type stubs: imported by name
    jsonschema = importlib.import_module("jsonschema")
    jsonschema.Draft202012Validator(report_schema()).validate(data)


def report_sources(report: StressReport | None) -> tuple:
    """The stressed slide's path, as ``sources`` for :mod:`wsitool.ground.outputs` (an output
    never replaces it); empty when the report does not name one."""
    try:
        path = report.data["slide"]["path"] if report is not None else None
        return () if path is None or is_url(path) else (path,)
    except (AttributeError, KeyError, TypeError):
        return ()


def write_report(report: StressReport, path: str | os.PathLike) -> None:
    """Write the JSON report to ``path`` atomically (:func:`wsitool.ground.outputs.write_bytes`:
    a temporary file, then a rename; an existing report is replaced, the slide never is)."""
    text = json.dumps(report.to_dict(), indent=2) + "\n"
    atomic.write_bytes(path, text.encode("utf-8"), overwrite=True, sources=report_sources(report))


def build_report(*, started_at: str, slide_info: dict, config: dict, last: dict, done: dict | None,
                 wall: float, memory: dict, verify_every: int, checked: int, mismatches: int,
                 first_mismatches: list, errors_listed: list, crash: dict | None, problems: list[str],
                 verdict: str) -> StressReport:
    """The :class:`StressReport` of a finished run.

    ``last`` is the child's last ``sample`` message (or ``{}``), ``done`` its
    ``done`` message (or None), ``wall`` the parent's seconds from the start of
    the child to its end; ``checked``, ``mismatches``, ``first_mismatches``
    the fresh reader's results.
    """
    completed = last.get("iterations", 0)
    read_errors = last.get("errors", 0)
    elapsed = done["elapsed"] if done else last.get("t", 0.0)
    data: dict[str, Any] = {
        "schema": "wsitool-stress-report",
        "schema_version": 2,
        "wsitool_version": __version__,
        "started_at": started_at,
        "verdict": verdict,
        "problems": problems,
        "exit_code": EXIT_CODES[verdict],
        "slide": slide_info,
        "config": config,
        "run": {
            "iterations_completed": completed,
            "reads_ok": completed - read_errors,
            "elapsed_s": round(elapsed, 4),
            "wall_s": round(wall, 4),
            "reads_per_s": round(completed / elapsed, 3) if elapsed > 0 else 0.0,
            "reads_by_level": {str(i): n for i, n in enumerate(last.get("by_level", [])) if n},
            "fault_injected": injected_fault(),
        },
        "memory": memory,
        "verification": {
            "every": verify_every,
            "checked": checked,
            "mismatches": mismatches,
            "first_mismatches": first_mismatches,
        },
        "errors": {"count": read_errors, "first": errors_listed},
        "decoder": last.get("decoder", {}),
        "crash": crash,
        "sampler_errors": (done or {}).get("sampler_errors", {}),
    }
    return StressReport(verdict=verdict, problems=problems, exit_code=EXIT_CODES[verdict], data=data)
