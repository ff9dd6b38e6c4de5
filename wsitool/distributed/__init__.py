"""Scale-out: lazy Dask arrays of levels, batch region reads and batch exports (floor 7).

Three ways to spread slide work over many cores or machines, all through
Dask (``dask.distributed`` for clusters) rather than a scheduler of our own:

* :func:`level_to_dask` (:mod:`.arrays`; ``Slide.to_dask``): a level as a lazy
  ``dask.array.Array`` of shape ``(height, width, 3)`` uint8.  Each chunk is
  one :meth:`Slide.read_region` call (``mode="rgb"``).
* :func:`read_regions` (:mod:`.regions`): many regions of one slide (e.g. from a CSV file, see
  :func:`load_regions_csv`, :mod:`.regions_csv`) read on a local thread pool or on a Dask cluster,
  written one file per region or packed into one ``.npz`` / Zarr store.
* :func:`patches_to_dask` / :func:`patches_to_bag` (:mod:`.patches`): the patches of
  patch plans (:mod:`wsitool.patches`) as a lazy ``(n, h, w, 3)`` array chunked by
  batch, or a bag of batches; each task reads one batch with ``read_patches``.
* :func:`export_many` (:mod:`.exports`, resume by :mod:`.manifest`): many slides exported with
  :func:`wsitool.export.export_pyramid`, one Dask task per slide, on a
  ``LocalCluster`` sized to the machine or on an existing cluster; one slide's
  failure is recorded and does not stop the others; completed outputs are
  skipped on a re-run (resume).

Pickling rule: task graphs carry slide *locations* (:class:`wsitool.opening.Location`: a
path, or a URL with its storage options) and plain numbers only, never an
open :class:`~wsitool.slide.Slide`, file handle or decoder, so they run on
remote workers.  Each worker process opens a slide once and keeps it in a
small cache keyed by its location (:func:`wsitool.distributed.held.cached_slide`); a task
built for one version of a file refuses to read a file changed since
(:class:`~wsitool.errors.WsiError`).

Dask is an optional extra (``pip install "wsitool[dask]"``, i.e.
``dask[array]`` and ``distributed``); this package imports it only when a
function needs it (:mod:`.cluster`).  Without it, :func:`read_regions` runs on threads,
:func:`export_many` runs the slides one after another in this process, and
asking for a cluster (``scheduler="local"`` or ``"tcp://..."``) raises
:class:`DaskUnavailableError`.

Scheduler values accepted by :func:`read_regions` and :func:`export_many`:

* ``None``: the default of each function (see there).
* ``"threads"`` (regions) / ``"sequential"`` (exports): this process only.
* ``"local"``: a new ``dask.distributed.LocalCluster`` of worker *processes*,
  one thread each, at most one worker per CPU core (and per task), closed at
  the end.
* ``"tcp://HOST:PORT"`` (or any address ``distributed.Client`` accepts,
  e.g. ``tls://``): an existing scheduler; the paths must be readable and the
  output folder writable from the workers (shared file system).
* a ``distributed.Client`` instance: used as is, not closed.
"""

from ..errors import DaskUnavailableError
from ..opening import chunk_read_count
from .arrays import level_to_dask
from .cluster import BatchOptionError, dask_available
from .exports import SlideOutcome, expand_sources, export_many, export_output_path
from .held import cached_slide
from .manifest import MANIFEST_NAME
from .patches import patches_to_bag, patches_to_dask
from .regions import RegionOutcome, read_regions
from .regions_csv import MAX_NAME_BYTES, NAME_PUNCTUATION, RegionRequest, load_regions_csv

__all__ = [
    "DaskUnavailableError",
    "BatchOptionError",
    "cached_slide",
    "chunk_read_count",
    "dask_available",
    "level_to_dask",
    "RegionRequest",
    "RegionOutcome",
    "load_regions_csv",
    "read_regions",
    "SlideOutcome",
    "expand_sources",
    "export_output_path",
    "export_many",
    "MANIFEST_NAME",
    "patches_to_dask",
    "patches_to_bag",
    "NAME_PUNCTUATION",
    "MAX_NAME_BYTES",
]
