"""``wsitool stress``: a multi-threaded random-region stress run with a memory-leak and thread-safety report
(floor 6, consumers).

:func:`run_stress` answers three questions about the decoder stack on one
slide, with evidence: does memory grow, does any read return wrong pixels
under concurrency, does anything crash or hang.  This module is the public
face of the package; each concept lives in its own module:

* :mod:`~wsitool.stress.config` -- defaults, argument checks, the run's configuration;
* :mod:`~wsitool.stress.runner` -- the parent: starts the child, watches it, collects the outcome;
* :mod:`~wsitool.stress.worker` -- the child process: ``workers`` threads sharing
  **one** opened :class:`~wsitool.slide.Slide`, each reading into its own
  buffer, allocated once and reused (``read_region(..., out=view)``);
* :mod:`~wsitool.stress.regions` -- the seeded regions (:func:`region_for`: a random
  level, sides in ``[region_size / 2, 3 * region_size / 2]``, inside, on the
  right/bottom edge, partly outside the top-left corner or anywhere) and their checksums;
* :mod:`~wsitool.stress.verify` -- the fresh reference reader in the parent
  that re-reads every ``verify_every``-th region serially and compares checksums;
* :mod:`~wsitool.stress.samplers` -- RSS and the extra per-sample
  measurements (:data:`SAMPLERS`, ``"module:function"`` names called in the
  child; ``run_stress(samplers=...)`` adds more for one run);
* :mod:`~wsitool.stress.memory` -- warm-up (the ``warmup`` fraction of the run
  and at least :data:`WARMUP_READS_PER_WORKER` reads per worker), growth, slope
  fit and the memory verdict on the slope interval's absolute thresholds;
* :mod:`~wsitool.stress.verdict` -- problems, the most serious one and its exit
  code (:data:`EXIT_CODES`: 0 ok, 10 leak, 11 mismatch, 12 read errors,
  13 crash, 14 hang, 15 inconclusive);
* :mod:`~wsitool.stress.results` -- :class:`StressProgress`, :class:`StressReport`;
* :mod:`~wsitool.stress.report` -- the JSON report, its schema
  (``wsitool/stress/report.schema.json``, :func:`report_schema`,
  :func:`validate_report`) and :func:`write_report`;
* :mod:`~wsitool.stress.plot` -- the RSS plot (:func:`write_plot`, matplotlib, optional);
* :mod:`~wsitool.stress.table` -- the rich tables of the CLI (:func:`live_table`, :func:`summary_table`);
* :mod:`~wsitool.stress.faults` -- the test-only fault injection (``WSITOOL_STRESS_FAULT``).

Imports inside the package form a DAG: ``runner`` -> ``config``, ``verify``,
``memory``, ``verdict``, ``report``, ``results``; ``config`` -> ``memory``,
``regions``, ``samplers``; ``worker`` -> ``faults``, ``regions``, ``report``,
``samplers``; ``verify`` -> ``regions``, ``report``; ``plot`` -> ``report``,
``results``; ``table`` -> ``results``; ``report`` -> ``faults``, ``results``,
``verdict``; ``verdict`` -> ``memory``.  No module imports this face, and
this face does not import ``worker`` (the child imports it alone, so
``python -m wsitool.stress.worker`` runs it without a second copy).
"""

# The names below stay importable from ``wsitool.stress`` as before the package split
# (the CLI uses live_table / summary_table / plot_available); ``__all__`` is unchanged, so the
# ones it does not list are re-exported with ``X as X``.
from .config import DEFAULT_MAX_GROWTH_MB, parse_levels
from .config import DEFAULT_SAMPLE_INTERVAL as DEFAULT_SAMPLE_INTERVAL
from .config import DEFAULT_STALL_TIMEOUT as DEFAULT_STALL_TIMEOUT
from .config import DEFAULT_VERIFY_EVERY as DEFAULT_VERIFY_EVERY
from .config import DEFAULT_WARMUP as DEFAULT_WARMUP
from .memory import LEAK_SLOPE_MB_PER_1K as LEAK_SLOPE_MB_PER_1K
from .memory import MIN_MEASURED_ITERATIONS as MIN_MEASURED_ITERATIONS
from .memory import MIN_MEASURED_SAMPLES as MIN_MEASURED_SAMPLES
from .memory import OK_SLOPE_MB_PER_1K as OK_SLOPE_MB_PER_1K
from .memory import WARMUP_READS_PER_WORKER as WARMUP_READS_PER_WORKER
from .plot import plot_available, write_plot
from .report import MAX_LISTED as MAX_LISTED
from .report import report_schema, validate_report, write_report
from .results import StressProgress, StressReport
from .runner import run_stress
from .samplers import SAMPLERS
from .table import live_table as live_table
from .table import summary_table as summary_table
from .verdict import EXIT_CODES

__all__ = [
    "run_stress",
    "StressReport",
    "StressProgress",
    "EXIT_CODES",
    "DEFAULT_MAX_GROWTH_MB",
    "SAMPLERS",
    "report_schema",
    "validate_report",
    "write_report",
    "write_plot",
    "plot_available",
    "parse_levels",
]
