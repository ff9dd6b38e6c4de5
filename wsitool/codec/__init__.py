"""Decoding tiles (floor 3): the per-thread decoder pool, nvImageCodec, the compiled JPEG loop, tifffile/imagecodecs.

Modules: ``library`` (loading nvImageCodec), ``pool`` (one decoder per thread,
the mutex rule, counters), ``tilebytes`` (a tile's bytes from its byte source),
``headers`` (header checks before any decode), ``nvdecode`` (the nvImageCodec
path into caller buffers), ``jpegloop`` (the compiled JPEG loop), ``generic``
(tifffile / imagecodecs), ``associated`` (label / macro / thumbnail),
``failures`` (one wording per failure, the ``on_error`` policy), ``backends``
(what decodes here, for ``wsitool info``).
"""
