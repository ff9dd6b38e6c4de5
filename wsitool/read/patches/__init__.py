"""Batch patch reads that decode each tile once: the primitive behind :meth:`wsitool.Slide.read_patches` (floor 4).

A per-patch reader decodes a tile once for every patch that touches it: on a
grid of 224 x 224 patches over 240 x 240 tiles most tiles feed two to four
patches.  Here the patches of a batch are grouped by the tiles they touch:

1. each patch's window (``read_size``, default ``size``, in pixels of the
   level) is placed on the level by the same nearest-pixel rule as
   :meth:`wsitool.Slide.read_region` (:func:`wsitool.ground.geometry.level_rect`);
2. the tiles the windows touch that the previous batch did not already copy
   into them are cut into *runs*: tiles next to each other in one tile row (at
   most :data:`RUN_TILES` of them on one thread, half that with more);
3. each run is decoded once and its pixels copied into every window of this
   batch *and of the next one* that needs them (the next batch's output is made
   a batch ahead): on a row-major grid consecutive batches share the tile rows
   of the patch row they split.  A run that no later batch needs is first cut to
   the box its windows cover (the decoder skips the rest of its tiles); one that
   the batch after the next needs too is kept decoded in a run buffer and copied
   into that batch's windows a batch later.  Where the compiled JPEG loop applies
   the decode and the copies happen in C with the GIL released, each RGB tile
   decoded into a tile-sized scratch that is still in the CPU cache when its
   pieces are copied from it (:func:`wsitool.codec.jpegloop.scatter`, the
   ``keep`` and ``dest2`` arguments of the loop); else
   :func:`wsitool.read.fill.fill_region` (the Python tile path, or the
   decoded-tile cache) into a run buffer and numpy copies, the reference the
   compiled copy is tested against.  The per-thread decoders work as for a
   region.  A run whose decode fails (a corrupt tile) feeds nothing: the windows
   it feeds are read one by one as :meth:`wsitool.Slide.read_region` reads them,
   with the ``on_error`` asked (a tile corrupt only below the rows a window needs
   fails the run, which decodes more of it, but not the window);
4. with ``read_size``, each window is then reduced to ``size`` by the exact area
   filter (:mod:`wsitool.ground.areafilter`).

The runs are shared by the threads (each thread takes the next run when it has
finished its last one, the longest first); the first thread free plans the next
batch before it takes a run, so that the plan is made while the others decode
(:class:`PatchReader`).  A patch equals :meth:`wsitool.Slide.read_region` of its
location bit for bit (with ``read_size``, the area filter of that read of the
window), pixels outside the slide and missing tiles included.

Memory: the outputs of two batches (this one's and the next one's, which it
fills in part); one run buffer (``RUN_TILES`` tiles) per thread plus one per run
kept for the batch after the next; with ``read_size``, the windows of two
batches (``batch_size`` windows of ``ceil(read_size)`` pixels each).  The run
buffers are kept for the next call (at most :data:`SPARE_BYTES` in the
process): fresh ones cost page faults on every pass.

Not to be confused with :func:`wsitool.distributed.read_regions`, which reads a
list of regions on a Dask cluster and writes each to a file.
"""

from .buffers import SPARE_BYTES
from .reader import PatchReader, fill_all, read_patch_batches
from .request import PatchRequest, check_patch_request
from .runs import RUN_TILES, footprint, plan_runs

__all__ = ["RUN_TILES", "SPARE_BYTES", "PatchRequest", "PatchReader", "check_patch_request", "read_patch_batches",
           "fill_all", "footprint", "plan_runs"]
