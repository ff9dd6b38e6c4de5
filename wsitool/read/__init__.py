"""Region reading (floor 4): validate a request, plan its tiles, fill the caller's buffer.

One read goes ``read.region.read_pyramid_region`` -> ``read.request`` (validation,
the :class:`~wsitool.read.request.ReadRequest` carried down) ->
``read.fill`` (the region planned once by ``read.plan``, its tiles told to the byte
source, then one route: threads, compiled loop or the Python path of ``read.worker``;
``read.cuda`` on a GPU) -> ``codec`` (decoders) -> the level's byte source.
``read.patches`` reads batches of patches; ``read.lazy`` builds Dask arrays of levels.
"""
