"""Deep Zoom: the geometry of openslide-python's ``DeepZoomGenerator`` (:mod:`.geometry`)
and the tiles it makes, read at OpenSlide's fractional level offsets (:mod:`.tiles`).
Shared by the tile server, the Deep Zoom export and the openslide-python drop-in."""
