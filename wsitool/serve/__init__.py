"""``wsitool serve``: a IIIF Image API 3.0 (level 2) and Deep Zoom tile server with a viewer page.

One process serves every slide given (:mod:`.registry`), one decoded-tile cache
shared by all requests (:mod:`wsitool.read.cache`), decode work on a bounded
pool of threads, never on the event loop (:mod:`.app`).  The modules, one
concept each:

* :mod:`.registry`: which slides are served, under which stable ids (never a path
  outside the folders given), listed at start;
* :mod:`.pool`: the open slides, opened on first use within a budget of descriptors;
* :mod:`.guard`: what the server accepts from the network (the ``Host`` it answers to,
  CORS, idle and slow connections, a cap on connections);
* :mod:`.iiif`: IIIF Image API 3.0 request syntax, its geometry and ``info.json``;
* :mod:`wsitool.ground.areafilter` (floor 0, shared with the batch reader): the area filter, strip by strip;
* :mod:`.render`: reading a region of a slide at a scale in bounded memory,
  rotation, quality and encoding;
* :mod:`.dz`: Deep Zoom routes on :mod:`wsitool.deepzoom.geometry`'s geometry;
* :mod:`.viewer`: the slide list and the OpenSeadragon page;
* :mod:`.status`: counters behind ``/status``;
* :mod:`.app`: the Starlette application; :mod:`.runner`: uvicorn, signals.

The web stack (Starlette, uvicorn) is the optional extra ``wsitool[serve]``;
only :mod:`.app`, :mod:`.runner` and :mod:`.guard` import it, inside functions.
"""

from __future__ import annotations

__all__ = ["ServeConfig"]

from .config import ServeConfig
