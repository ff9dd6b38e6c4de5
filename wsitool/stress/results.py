"""What a stress run hands back: the live :class:`StressProgress` and the final :class:`StressReport`
(floor 6, consumers)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class StressProgress:
    """A live snapshot handed to ``run_stress(progress=...)`` at every sample.

    Fields: ``elapsed_s`` (seconds since the workload started), ``iterations``
    (completed reads), ``target`` (iterations asked for, or None),
    ``duration_s`` (or None), ``reads_per_s``, ``rss_mb`` (child RSS, MiB),
    ``growth_mb`` (RSS now minus RSS at the end of warm-up, None during
    warm-up), ``verified``, ``mismatches``, ``errors``, ``phase``
    (``"starting"``, ``"warm-up"``, ``"measuring"``, ``"verifying"``, ``"done"``).
    """

    elapsed_s: float = 0.0
    iterations: int = 0
    target: int | None = None
    duration_s: float | None = None
    reads_per_s: float = 0.0
    rss_mb: float = 0.0
    growth_mb: float | None = None
    verified: int = 0
    mismatches: int = 0
    errors: int = 0
    verify_backlog: int = 0
    phase: str = "starting"


@dataclasses.dataclass
class StressReport:
    """Outcome of :func:`~wsitool.stress.run_stress`; :meth:`to_dict` gives the JSON report.

    Attributes:
        verdict: ``"ok"``, ``"leak"``, ``"mismatch"``, ``"error"``, ``"crash"``,
            ``"hang"`` or ``"inconclusive"`` (most serious problem, see
            :mod:`wsitool.stress.verdict`).
        problems: every verdict that applies (empty when ok).
        exit_code: :data:`~wsitool.stress.verdict.EXIT_CODES` of ``verdict``.
        data: the full report as a JSON-ready dict (schema:
            ``wsitool/stress/report.schema.json``).
    """

    verdict: str
    problems: list[str]
    exit_code: int
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (a deep copy is not made; do not mutate)."""
        return self.data

    @property
    def memory(self) -> dict[str, Any]:
        """The ``memory`` section: RSS figures in MiB and the samples."""
        return self.data["memory"]

    @property
    def ok(self) -> bool:
        """True when the verdict is ``ok``."""
        return self.verdict == "ok"
